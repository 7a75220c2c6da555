"""Which acquired jobs may start, and how many more the worker should ask for.

At most ``max_slots`` handlers run at once. With short handlers that alone leaves the
worker and the database taking turns: the database runs an acquire while Python
waits, then Python runs ten no-op handlers while the database waits. So while
handlers are short the worker also *prefetches*: it keeps up to ``prefetch`` more jobs
acquired, waiting here for a slot, and its next acquire is on the server while the
current handlers run. A prefetched job waits about one handler's duration; that is
why the automatic setting prefetches only while the handlers' recent mean duration is
under ``SHORT_HANDLER_S``. With long handlers a job kept waiting here could have run
on another worker that has a free slot (the trap Celery's prefetch multiplier sets),
so prefetching stops. A prefetched job is leased (its lease is renewed like a running
one's) and, if the worker stops first, handed back without burning an attempt.

Waiting jobs start in ``rank`` order (the worker's: queue order, then priority, then
due time), not in the order they arrived: a retry that fell due in a more important
queue, acquired while slower jobs were already waiting here, goes before them.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["SHORT_HANDLER_S", "Admission"]

# Handlers whose recent mean duration is under this (seconds) count as short. It
# includes the wait for the event loop, which a busy worker stretches to a few ms.
SHORT_HANDLER_S = 0.02

# Weight of the newest duration in the running mean.
_SMOOTHING = 0.1


class _Waiting(Protocol):
    started: float


S = TypeVar("S", bound=_Waiting)


class Admission(Generic[S]):
    """Counts running handlers, holds prefetched jobs, and says which start as slots
    free: ``arrived`` and ``freed`` return the job to start, and the caller starts it.

    ``prefetch`` None means automatic: up to ``max_slots`` while handlers are short,
    else none. ``rank`` orders the jobs that wait (a sort key; None: arrival order)."""

    __slots__ = ("_mean_s", "_prefetch", "_rank", "max_slots", "queued", "running")

    def __init__(
        self,
        *,
        max_slots: int,
        prefetch: int | None,
        rank: Callable[[S], Any] | None = None,
    ):
        self.max_slots = max_slots
        self._prefetch = prefetch
        self._rank = rank
        self.running = 0
        # At most ``most_prefetched`` long, kept in rank order.
        self.queued: list[S] = []
        # Unknown until handlers were seen: assume long, so nothing is prefetched for a
        # worker whose first jobs are slow.
        self._mean_s = SHORT_HANDLER_S

    @property
    def most_prefetched(self) -> int:
        """The largest number of jobs that may ever wait here."""
        return self.max_slots if self._prefetch is None else self._prefetch

    @property
    def prefetching(self) -> bool:
        if self._prefetch is None:
            return self._mean_s < SHORT_HANDLER_S
        return self._prefetch > 0

    def room(self) -> int:
        """How many more jobs to acquire: free slots, plus prefetch room."""
        limit = self.max_slots
        if self.prefetching:
            limit += self.most_prefetched
        return limit - self.running - len(self.queued)

    def arrived(self, slot: S) -> bool:
        """A job was acquired: True if it takes a free slot (start it now), else it
        waits here."""
        if self.running < self.max_slots:
            self.running += 1
            return True
        if self._rank is None:
            self.queued.append(slot)
        else:
            insort(self.queued, slot, key=self._rank)  # after equals: arrival order
        return False

    def freed(self, slot: S, now: float) -> S | None:
        """``slot``'s handler is done (``now``, monotonic): the waiting job that takes
        its place (start it now), if any."""
        self.running -= 1
        self._mean_s += _SMOOTHING * ((now - slot.started) - self._mean_s)
        if self.queued and self.running < self.max_slots:
            self.running += 1
            return self.queued.pop(0)
        return None

    def take_queued(self) -> list[S]:
        """Remove and return every waiting job (the worker is stopping)."""
        waiting = list(self.queued)
        self.queued.clear()
        return waiting
