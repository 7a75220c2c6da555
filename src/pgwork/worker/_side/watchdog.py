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
a new timeout makes one earlier. It decides nothing itself: each look returns what it
found (``Due``), and the worker's slots act on it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import anyio

log = logging.getLogger("pgwork.worker")

# The longest the watchdog sleeps without looking at the running handlers (seconds).
RECHECK_S = 1.0

__all__ = ["Due", "Watchdog", "Watched", "keep_abandoned"]


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


@dataclass(frozen=True, slots=True)
class Due(Generic[W]):
    """What one look found: the attempts whose handler is past its timeout (to stop),
    those past the deadline to give up on them (to abandon), and when to look again
    (monotonic)."""

    timed_out: list[W]
    abandoned: list[W]
    next_look: float


class Watchdog(Generic[W]):
    """Looks at the running attempts and says which to stop and which to give up on
    (``look``), then sleeps until the earliest of their deadlines (``wait``); its
    owner acts on what it found. ``watch`` or ``poke`` after making a deadline earlier
    (an abort, or a handler that starts with a timeout shorter than the current
    sleep)."""

    __slots__ = ("_next", "_poked")

    def __init__(self) -> None:
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

    def look(self, running: Iterable[W], now: float) -> Due[W]:
        """Which of ``running`` are past their timeout, which past the deadline to give
        up on them, and when the next deadline passes (never later than RECHECK_S from
        ``now``: a handler starting with a deadline later than that pokes nobody, and
        short jobs with a timeout would otherwise wake the watchdog once each). A poke
        from here on, while the owner acts on the answer, wakes the next ``wait``."""
        self._poked.clear()
        timed_out: list[W] = []
        abandoned: list[W] = []
        earliest = now + RECHECK_S
        for attempt in running:
            stop_at = attempt.timeout_deadline()
            if stop_at is not None:
                if stop_at <= now:
                    timed_out.append(attempt)
                else:
                    earliest = min(earliest, stop_at)
            deadline = attempt.abandon_deadline()
            if deadline is None:
                continue
            if deadline <= now:
                abandoned.append(attempt)
            else:
                earliest = min(earliest, deadline)
        self._next = earliest
        return Due(timed_out, abandoned, earliest)

    async def wait(self, until: float) -> None:
        """Sleep until ``until`` (monotonic), or until poked."""
        with anyio.move_on_after(until - time.monotonic()):
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
