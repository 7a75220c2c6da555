"""The worker's heartbeat: say we are alive, notice who is not.

Every ``interval`` the worker refreshes its registry row (status, active slots). Then
it looks for workers silent for longer than ``dead_after`` and takes back all their
running jobs at once — without waiting for each lease to expire — at their old place
in the queue. A worker that cannot write its own heartbeat for half of ``dead_after``
stops taking new jobs (others may soon declare it dead); it resumes once a heartbeat
gets through, re-registering if it had been declared dead meanwhile.

Resuming is a hint to the loop: it refused jobs meanwhile, the notices that announced
them are spent, and the poll runs only after an acquire found the queues empty, so
nothing else would send it looking. A failed heartbeat is retried sooner than the next
beat (backing off to ``retry_max``), so the worker takes work again within that long
of the database answering.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from typing import Protocol

import anyio

from pgwork.adapters.state import CoreStateAdapter, WorkerInfo
from pgwork.worker._bell import Bell
from pgwork.worker._wakeups import Wakeups

log = logging.getLogger("pgwork.worker")

__all__ = ["Heartbeat", "Occupancy"]

# Jobs taken back from dead workers per statement.
RECLAIM_BATCH = 10_000


class Occupancy(Protocol):
    """What a beat reports of the worker's slots: how many jobs it holds, and the
    handlers it gave up on that still run."""

    def __len__(self) -> int: ...

    @property
    def abandoned(self) -> Collection[object]: ...


class Heartbeat:
    def __init__(
        self,
        state: CoreStateAdapter,
        info: WorkerInfo,
        *,
        interval: float,
        dead_after: float,
        slots: Occupancy,
        stopping: anyio.Event,
        wakeups: Wakeups,
        bell: Bell,
        retry_max: float | None = None,
    ) -> None:
        """``slots`` and ``stopping`` (set once the worker stops taking jobs) are what
        each beat reports; ``wakeups`` and ``bell`` are told when jobs may be ready
        now (dead workers' jobs taken back, or this worker may take jobs again)."""
        self.state = state
        self.info = info
        self.interval = interval
        self.dead_after = dead_after
        self._slots = slots
        self._stopping = stopping
        self._wakeups = wakeups
        self._bell = bell
        self.retry_max = interval if retry_max is None else min(interval, retry_max)
        self._last_ok: float | None = None  # None: never registered yet
        self._registered = False
        # Dead workers are looked for a few times per ``dead_after``, not every beat:
        # a worker is declared dead only after that long anyway.
        self.reclaim_every = max(interval, dead_after / 3)

    @property
    def healthy(self) -> bool:
        """False once heartbeats have failed for half the dead-worker limit."""
        last = self._last_ok
        return last is None or time.monotonic() - last < self.dead_after / 2

    async def register(self) -> None:
        await self.state.register_worker(worker=self.info)
        self._registered = True
        self._got_through()

    def _got_through(self) -> None:
        recovered = self._last_ok is not None and not self.healthy
        self._last_ok = time.monotonic()
        if recovered:
            log.warning("pgwork worker %s wrote its heartbeat again; taking jobs", self.info.id)
            self._hint()

    def _hint(self) -> None:
        """Jobs may be ready now: the loop acquires even if it found the queues drained."""
        self._wakeups.hint()
        self._bell.ring()

    def status(self) -> tuple[str, int, int]:
        """What a beat reports: the worker's status, its active slots, and the handlers
        it gave up on that still run."""
        slots = self._slots
        if self._stopping.is_set():
            return "stopping", len(slots), len(slots.abandoned)
        return ("busy" if slots else "idle"), len(slots), len(slots.abandoned)

    async def run_forever(self) -> None:
        """Beat, and look for dead workers, each in a task of its own: taking back a
        dead worker's jobs runs on a pooled connection, which may be long in coming,
        and must not hold up the next beat."""
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._beat_forever)
            tasks.start_soon(self._reclaim_forever)

    async def _beat_forever(self) -> None:
        failures = 0
        while True:
            delay = self.interval
            if failures:
                delay = min(self.retry_max, 0.1 * 2**failures)
            await anyio.sleep(delay)
            try:
                await self.beat()
                failures = 0
            except Exception as exc:
                failures += 1
                log.warning(
                    "pgwork worker %s could not write its heartbeat (%r)%s",
                    self.info.id,
                    exc,
                    "" if self.healthy else "; not taking new jobs until it can",
                )

    async def beat(self) -> None:
        if not self._registered:
            await self.register()
        status, active, abandoned = self.status()
        if not await self.state.heartbeat(
            worker_id=self.info.id,
            active_slots=active,
            status=status,
            abandoned_handlers=abandoned,
        ):
            log.warning(
                "pgwork worker %s was declared dead by another worker (heartbeat too old); "
                "registering again",
                self.info.id,
            )
            await self.register()
        self._got_through()

    async def _reclaim_forever(self) -> None:
        """Look for dead workers while this one's own heartbeat gets through (a worker
        cut off from the database cannot tell who else is)."""
        delay = self.interval  # the first look as the first beat goes out
        while True:
            await anyio.sleep(delay)
            delay = self.reclaim_every
            if not self.healthy:
                continue
            try:
                await self.reclaim()
            except Exception as exc:
                log.warning(
                    "pgwork worker %s could not look for dead workers (%r)", self.info.id, exc
                )

    async def reclaim(self) -> int:
        dead = await self.state.find_dead_workers(
            older_than_s=self.dead_after, exclude=self.info.id
        )
        if not dead:
            return 0
        reaped = await self.state.reap(
            type_names=(), exclude_worker=self.info.id, limit=RECLAIM_BATCH, dead_workers=dead
        )
        log.warning(
            "pgwork worker %s found dead worker(s) %s and took back %d running job(s)",
            self.info.id,
            ", ".join(dead),
            len(reaped),
        )
        if reaped:
            self._hint()
        return len(reaped)

    async def stopped(self) -> None:
        """Record a graceful stop so nobody mistakes this worker for a dead one."""
        try:
            await self.state.heartbeat(worker_id=self.info.id, active_slots=0, status="stopped")
        except Exception as exc:
            log.warning("pgwork worker %s could not record its stop: %r", self.info.id, exc)
