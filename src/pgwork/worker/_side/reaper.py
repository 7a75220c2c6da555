"""Taking back expired leases: at most one per main-loop turn.

A job whose lease expired belongs to nobody (its worker died, froze or lost the
database): the reaper puts it back in the queue (or fails it, past its attempts) so
another attempt can run. One per turn, and only every ``REAP_INTERVAL`` while none is
found: under load turns come every few milliseconds and expired leases are rare. An
idle worker looks once per poll interval (its turns come on hints, and a hint about
new work says nothing about expired leases). A job put back is announced, so an idle
worker takes it at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from uuid import UUID

from pgwork.adapters.notify import NotifyAdapter
from pgwork.adapters.state import WorkerCore
from pgwork.observability import JOB_REAPED
from pgwork.observability.emitter import Emitter
from pgwork.records import JobStatus
from pgwork.worker._announce import announce_ready
from pgwork.worker._wakeups import Wakeups

__all__ = ["REAP_INTERVAL", "Reaper"]

# While no expired lease is found, look for one at most this often (seconds).
REAP_INTERVAL = 0.5


class Reaper:
    def __init__(
        self,
        *,
        state: WorkerCore,
        notify: NotifyAdapter,
        worker_id: str,
        type_names: Sequence[str],
        events: Emitter,
        wakeups: Wakeups,
        idle_interval: float,
    ) -> None:
        self.state = state
        self.notify = notify
        self.worker_id = worker_id
        self.type_names = list(type_names)
        self._events = events
        self._wakeups = wakeups
        self._idle_interval = idle_interval
        self._last = -REAP_INTERVAL

    async def reap_one(self, *, held: Callable[[], Sequence[UUID]], idle: bool) -> None:
        """Take back at most one expired lease of this worker's types (not one of the
        tokens ``held()`` returns), if it is time to look. ``held`` is asked only when
        the reaper looks: every loop turn calls this, and a busy worker holds up to
        twice its slots."""
        now = time.monotonic()
        if now - self._last < (self._idle_interval if idle else REAP_INTERVAL):
            return
        reaped = await self.state.reap(
            type_names=self.type_names, exclude_worker=self.worker_id, limit=1, held=held()
        )
        self._last = -REAP_INTERVAL if reaped else now
        if any(job.status is JobStatus.PENDING for job in reaped):
            self._wakeups.hint()
            await announce_ready(self.notify, [None])
        for job in reaped:
            self._events.emit(
                JOB_REAPED,
                job_id=job.job_id,
                job_type=job.type_name,
                attempt=job.attempt,
                status=job.status.value,
                previous_worker=job.leased_by,
                worker_id=self.worker_id,
            )
