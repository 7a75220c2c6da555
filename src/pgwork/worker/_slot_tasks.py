"""The worker's slot tasks: one plain asyncio task per attempt, owned by the worker.

Not anyio's task group, for speed: starting a task through ``TaskGroup.start_soon``
costs several times what ``loop.create_task`` does, start to finish of an empty task,
and a worker starts one per job, so with no-op handlers it was a fifth of the worker's
CPU (``python -m bench.cpu --only drain``). Ownership stays structured: the
worker waits for every slot task before it returns, and when the worker itself is
cancelled it cancels them and waits for them to end.

A task's coroutine reports its own end (``ended``, from its outermost ``finally``)
rather than a done callback: asyncio runs a done callback in a round of the event
loop of its own, one more per job. Nothing runs between that ``finally`` and the
task's end (the coroutine does not wait again), so whoever ``wait``s sees the task
finished.

The event loop is looked up once, not per task: on Python 3.11
``asyncio.get_running_loop()`` (and ``current_task()`` without a loop) asks the kernel
for the process id on every call, to notice a fork.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Coroutine
from typing import Any

import anyio

log = logging.getLogger("pgwork.worker")

__all__ = ["SlotTasks"]


class SlotTasks:
    """The set of running slot tasks (asyncio holds tasks only weakly)."""

    __slots__ = ("_changed", "_loop", "_tasks")

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # the first task's
        # Made only while someone waits for the set to empty.
        self._changed: asyncio.Event | None = None

    def __len__(self) -> int:
        return len(self._tasks)

    def start(
        self,
        coro: Coroutine[Any, Any, None],
        *,
        name: str,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[None]:
        """Run ``coro`` in a task of its own; the coroutine must call ``ended`` as it
        ends, whatever it ends with."""
        loop = self._loop
        if loop is None or not self._tasks:
            # Looked up again whenever none runs: a worker runs on one loop at a time.
            loop = self._loop = asyncio.get_running_loop()
        task = loop.create_task(coro, name=name, context=context)
        self._tasks.add(task)
        return task

    def detach(self, task: asyncio.Task[None]) -> None:
        """Stop owning ``task`` (a handler given up on): nobody waits for it."""
        self._tasks.discard(task)
        if self._changed is not None:
            self._changed.set()

    def ended(self, error: BaseException | None) -> None:
        """The running task's coroutine is ending (with ``error``, when it raises).

        The slot coroutine catches ``Exception``; a ``BaseException`` other than a
        cancellation is logged here, unless the task was detached (given up on)."""
        task = asyncio.current_task(self._loop)
        if task not in self._tasks:
            return
        self._tasks.discard(task)
        if self._changed is not None:
            self._changed.set()
        if error is not None and not isinstance(error, asyncio.CancelledError):
            log.error("pgwork slot task %s ended with %r", task.get_name(), error)

    def _gone(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._changed is not None:
            self._changed.set()

    async def wait(self) -> None:
        """Return once every slot task has ended (or was detached)."""
        while self._tasks:
            self._changed = changed = asyncio.Event()
            await changed.wait()
        self._changed = None

    async def cancel_and_wait(self, limit: float) -> list[asyncio.Task[None]]:
        """Cancel every slot task and wait for them (shielded from our own cancel) at
        most ``limit`` seconds; detach and return those that ignored it."""
        for task in self._tasks:
            # One cancelled before its first step never runs its coroutine, nor the
            # ``finally`` that calls ``ended``.
            task.add_done_callback(self._gone)
            task.cancel()
        with anyio.CancelScope(shield=True), anyio.move_on_after(limit):
            await self.wait()
        stuck = list(self._tasks)
        for task in stuck:
            self.detach(task)
        return stuck
