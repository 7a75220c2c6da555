"""Giving up on handlers that ignore cancellation.

Python cannot kill a coroutine. A handler that catches ``CancelledError`` and carries
on, loops on ``except BaseException`` or awaits something shielded keeps running however
often it is cancelled; it would hold its slot, have its lease renewed and keep
``stop()`` waiting, for ever. So once an attempt was told to stop (its timeout fired,
its lease was lost, the worker is stopping) its handler has ``abandon_after`` more to
end; then this watchdog gives up on it: the slot's task is detached from the worker
(it runs on until it ends by itself, and nothing it does then is written: every write
for the attempt is fenced by a lease token that is spent), and the attempt is settled
in a task of its own.

The handler runs in its slot's own task, not a task of its own that the slot waits
for: with no-op handlers that second task (and its event) was about a tenth of the
worker's CPU. One watchdog per worker looks only at the handlers running now (at most
``max_slots``) and sleeps until the earliest of their deadlines, or until an abort or
a new timeout makes one earlier.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar

import anyio

log = logging.getLogger("pgwork.worker")

# The longest the watchdog sleeps without looking at the running handlers (seconds).
RECHECK_S = 1.0

__all__ = ["Watchdog", "Watched", "keep_abandoned"]


class Watched(Protocol):
    """What the watchdog reads of one running attempt."""

    def timeout_deadline(self) -> float | None:
        """Monotonic time at which the handler's timeout passes and it is stopped
        (None: no timeout, or stopped already)."""
        ...

    def abandon_deadline(self) -> float | None:
        """Monotonic time after which the handler is given up on (None: no limit)."""
        ...


W = TypeVar("W", bound=Watched)


class Watchdog(Generic[W]):
    """Calls ``time_out(attempt)`` for each attempt in ``running()`` whose handler is
    past its timeout, and ``abandon(attempt)`` for each one past the deadline to give
    up on it. ``poke`` after making a deadline earlier (an abort, or a handler that
    starts with a timeout shorter than the watchdog's current sleep)."""

    __slots__ = ("_abandon", "_next", "_poked", "_running", "_time_out")

    def __init__(
        self,
        running: Callable[[], Iterable[W]],
        abandon: Callable[[W], None],
        time_out: Callable[[W], None],
    ) -> None:
        self._running = running
        self._abandon = abandon
        self._time_out = time_out
        # asyncio's event, not anyio's: an anyio Event looks the backend up when made.
        self._poked = asyncio.Event()
        self._next = math.inf

    def watch(self, deadline: float) -> None:
        """A handler started with a time limit (a timeout, or one to give up on it)
        ending at ``deadline``."""
        if deadline < self._next:
            self._poked.set()

    def poke(self) -> None:
        self._poked.set()

    async def run_forever(self) -> None:
        while True:
            now = time.monotonic()
            earliest = math.inf
            for attempt in list(self._running()):
                stop_at = attempt.timeout_deadline()
                if stop_at is not None:
                    if stop_at <= now:
                        self._time_out(attempt)
                    else:
                        earliest = min(earliest, stop_at)
                deadline = attempt.abandon_deadline()
                if deadline is None:
                    continue
                if deadline <= now:
                    self._abandon(attempt)
                else:
                    earliest = min(earliest, deadline)
            # Never beyond RECHECK_S: a handler starting with a deadline later than
            # that pokes nobody (short jobs with a timeout would otherwise wake the
            # watchdog once each), the next look finds it.
            earliest = min(earliest, now + RECHECK_S)
            self._next = earliest
            self._poked.clear()
            with anyio.move_on_after(earliest - now):
                await self._poked.wait()


def keep_abandoned(
    task: asyncio.Task[object],
    abandoned: set[asyncio.Task[object]],
    what: str,
    on_end: Callable[[float, str], None] | None = None,
) -> None:
    """Keep an abandoned task referenced (asyncio holds tasks weakly) until it ends, and
    say when it does (``on_end(late_s, outcome)``, else a log line): its outcome was
    discarded."""
    abandoned.add(task)
    abandoned_at = time.monotonic()

    def ended_late(done: asyncio.Task[object]) -> None:
        abandoned.discard(done)
        outcome = "was cancelled" if done.cancelled() else _describe(done.exception())
        if on_end is not None:
            on_end(time.monotonic() - abandoned_at, outcome)
            return
        log.warning(
            "pgwork abandoned handler %s ended %.1fs after it was abandoned (%s); "
            "its outcome was discarded",
            what,
            time.monotonic() - abandoned_at,
            outcome,
        )

    task.add_done_callback(ended_late)


def _describe(error: BaseException | None) -> str:
    return "returned" if error is None else f"raised {error!r}"
