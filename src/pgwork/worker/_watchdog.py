"""Running a handler so that one which ignores cancellation can be abandoned.

Python cannot kill a coroutine. A handler that catches ``CancelledError`` and carries
on, loops on ``except BaseException`` or awaits something shielded keeps running however
often it is cancelled; run in its slot's own task it would hold the slot, have its
lease renewed and keep ``stop()`` waiting, for ever. So each handler call runs in a
task of its own and the slot only *waits* for it: once the attempt was told to stop
(its timeout fired, its lease was lost, the worker is stopping) the slot waits at most
``abandon_after`` more, then gives up on the task. The slot is freed and the attempt
settled; the task runs on, detached, until it ends by itself. Whatever it does then
changes nothing: the worker no longer writes its outcome, and every write for the
attempt is fenced by a lease token that is spent.

The task is an asyncio task because the worker runs on asyncio (psycopg's async
connections do): no anyio primitive lets a task outlive the group that waits for it,
and that is exactly what an abandoned handler must be allowed to do.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import anyio

log = logging.getLogger("pgwork.worker")

__all__ = ["HandlerTask"]

T = TypeVar("T")


class HandlerTask(Generic[T]):
    """One handler call in a task of its own, which the slot can stop waiting for.

    ``abandoned`` is the worker's set of handler tasks it gave up on: it keeps them
    referenced (asyncio holds tasks weakly) until they end, and tells how many still run.
    """

    __slots__ = (
        "_abandon_after",
        "_abandoned",
        "_ended",
        "_job_id",
        "_wake",
        "abandoned",
        "stopped_at",
    )

    def __init__(self, *, abandon_after: float, abandoned: set[asyncio.Task[Any]], job_id: object):
        self._abandon_after = abandon_after
        self._abandoned = abandoned
        self._job_id = job_id  # formatted only if the handler is abandoned
        # asyncio's events, not anyio's: this module is asyncio-only anyway, and an anyio
        # Event looks up the running backend each time one is made (once per job here).
        self._wake = asyncio.Event()
        self._ended: asyncio.Event | None = None  # made only for a handler that lingers
        self.stopped_at: float | None = None
        self.abandoned = False

    def stop_requested(self) -> None:
        """The attempt was aborted: from now on the handler has ``abandon_after`` to end."""
        if self.stopped_at is None:
            self.stopped_at = time.monotonic()
        self._wake.set()

    async def run(self, body: Callable[[], Awaitable[T]], *, timeout: float | None) -> T | None:
        """Run ``body`` (which enforces ``timeout`` itself) and return what it returned;
        None, with ``abandoned`` set, when it did not end within ``abandon_after`` of its
        timeout or abort."""
        started = time.monotonic()
        task = asyncio.get_running_loop().create_task(_call(body), name="pgwork-handler")
        task.add_done_callback(self._on_done)
        try:
            if timeout is None:
                await self._wake.wait()  # it ended, or it was aborted
            else:
                with anyio.move_on_after(timeout):
                    await self._wake.wait()
            if not task.done():
                if self.stopped_at is None:
                    self.stopped_at = started + (timeout or 0.0)
                with anyio.move_on_after(self._abandon_after):
                    await self._wait_ended(task)
        except BaseException:
            # The slot itself is being cancelled: pass it on, and give the handler as
            # long to end as an aborted one gets, but no longer.
            task.cancel()
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._abandon_after):
                await self._wait_ended(task)
            if not task.done():
                self._abandon(task)
            raise
        if not task.done():
            self._abandon(task)
            return None
        return task.result()

    async def _wait_ended(self, task: asyncio.Task[Any]) -> None:
        if self._ended is None:
            self._ended = asyncio.Event()
        if not task.done():
            await self._ended.wait()

    def _on_done(self, _: asyncio.Task[Any]) -> None:
        if self._ended is not None:
            self._ended.set()
        self._wake.set()

    def _abandon(self, task: asyncio.Task[Any]) -> None:
        self.abandoned = True
        self._abandoned.add(task)
        abandoned_at = time.monotonic()

        def ended_late(done: asyncio.Task[Any]) -> None:
            self._abandoned.discard(done)
            outcome = "was cancelled" if done.cancelled() else _describe(done.exception())
            log.warning(
                "pgwork abandoned handler %s ended %.1fs after it was abandoned (%s); "
                "its outcome was discarded",
                f"of job {self._job_id}",
                time.monotonic() - abandoned_at,
                outcome,
            )

        task.add_done_callback(ended_late)


async def _call(body: Callable[[], Awaitable[T]]) -> T:
    return await body()


def _describe(error: BaseException | None) -> str:
    return "returned" if error is None else f"raised {error!r}"
