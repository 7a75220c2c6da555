"""Filling free slots: acquiring jobs, with the finished batch's completions riding along.

An acquire runs beside the main loop, not in it, asking for every slot free when it
starts (plus the prefetch room, see ``_admission``) and taking the completions waiting
in the batcher with it (one round trip, one commit per turn). Room that frees up while
it is in flight gets a second acquire of its own; no more than two are ever in flight.
With prefetch the two take turns: one is on the server while the worker runs the jobs
the other brought. One at a time left the worker waiting for the server a third of the
time. Splitting one turn's slots between two acquires on purpose was measured and
rejected: two half-size acquires racing on one queue (each skipping the other's
locked rows, each with its own commit) cost the server more than twice the CPU per job
of one, and the worker more too (``python -m bench.cpu --only drain`` reports both;
docs/design/prefetch.md says why).

Two acquires in flight race on the queue: the second skips the rows the first locked
and takes the ones after them, and either may come back first, so a job can start
just before one queued ahead of it. With several slots the jobs run side by side
anyway; a worker with a single slot sends one acquire at a time (``max_in_flight``),
so it runs its jobs one after another strictly in the queues' order.

An acquire that comes back short tells ``Wakeups`` (the queues are drained until the
next hint). What an acquire brought waits in ``arrivals`` and the main loop is rung: the
loop starts the jobs, sending the next acquire first when prefetching.

A worker that runs job types with limits sends every acquire through the store's
``FlowControl.acquire_limited``, which leases those types only within their limits
and carries completions as a turn does.

On a store without ``BatchedTurns`` an acquire goes alone (``acquire``) and carries no
completions: the batcher writes them all itself (the worker builds it without the
acquires' record, so it never waits for one to take them along).

A failed acquire gives its completions back to the batcher (which retries them on its
own) and leaves its error for the main loop, which backs off. One that failed because
an outcome it carried cannot be stored leaves its completions to the batcher (which
fails that one alone) and goes out again without them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta

import anyio
import anyio.abc

from pgwork.adapters.state import (
    AcquiredJob,
    BatchedTurns,
    CompletionResult,
    FlowControl,
    TypeLimits,
    WorkerCore,
)
from pgwork.errors import OutcomeNotStorableError
from pgwork.worker._batch import Acquires, CompletionBatcher, Pending
from pgwork.worker._bell import Bell
from pgwork.worker._wakeups import Wakeups

__all__ = ["MAX_IN_FLIGHT", "Arrival", "Fetcher"]

MAX_IN_FLIGHT = 2

# How long before a rate's window opens (or a pause ends) the worker sends the acquire
# it sets a timer for, in seconds: a store that can wait for the opening in the
# database (PostgreSQL waits up to ``sql.limits.OPENING_HORIZON_S``) then fills the
# place as it comes back, without the timer's and the round trip's delay. A store that
# cannot answers with the same opening again, and the timer is set at it exactly.
OPENS_EARLY_S = 0.02


@dataclass(slots=True)
class Arrival:
    """What one acquire brought, for the main loop to start: the jobs, and when the
    acquire was sent (their leases are counted from then, see ``Slot``)."""

    jobs: list[AcquiredJob]
    sent_at: float


class Fetcher:
    """Acquires in the background of the main loop; ``asked`` jobs are on their way,
    and what came back waits in ``arrivals`` for the loop."""

    def __init__(
        self,
        *,
        state: WorkerCore,
        turns: BatchedTurns | None,
        batcher: CompletionBatcher,
        acquires: Acquires,
        worker_id: str,
        leases: Mapping[str, timedelta],
        queues: Sequence[str] | None,
        wakeups: Wakeups,
        poll_interval: float,
        bell: Bell,
        max_in_flight: int = MAX_IN_FLIGHT,
        flow: FlowControl | None = None,
        limits: Mapping[str, TypeLimits] | None = None,
        caps: Mapping[str, int] | None = None,
        held: Mapping[str, int] | None = None,
        freed: set[tuple[str, str]] | None = None,
    ) -> None:
        """``flow`` and ``limits``: the worker runs job types with limits, and every
        acquire goes through ``flow.acquire_limited`` (which carries completions too).
        ``caps``: the most jobs of a type this worker may hold at once, against
        ``held`` (what it holds, by type). ``freed``: the (type, limit key) of the
        limited attempts that ended since the last acquire was sent (the slots add to
        it; each limited acquire takes it along)."""
        self.state = state
        self._turns = turns
        self._flow = flow
        self._limits = limits
        self._caps = caps or {}
        self._held = held or {}
        self._freed = freed if freed is not None else set()
        # Chosen once: a turn within limits, the turn that carries completions, or an
        # acquire alone; ``carries``: whether an acquire takes the waiting completions
        # along (all but the last).
        self.carries = True
        if flow is not None and limits:
            self._send = self._acquire_limited
        elif turns is not None:
            self._send = self._complete_and_acquire
        else:
            self._send = self._acquire_alone
            self.carries = False
        self._max_in_flight = max_in_flight
        self._batcher = batcher
        self._worker_id = worker_id
        self._leases = leases
        self._queues = queues
        self._wakeups = wakeups
        self._poll_interval = poll_interval
        self._bell = bell
        self.acquires = acquires
        self.arrivals: list[Arrival] = []
        # Limited types with room that a worker waits for, as acquires found them since
        # the loop last looked: the loop announces their jobs.
        self.waited_for: frozenset[str] = frozenset()
        # The opening the last timer was set early for (``OPENS_EARLY_S``).
        self._early_for: float | None = None
        self.asked = 0
        self.error: BaseException | None = None
        self.failures = 0  # acquires that failed in a row
        self.group: anyio.abc.TaskGroup | None = None  # where acquires run (the loop's)

    def take_arrivals(self) -> list[Arrival]:
        """What the acquires brought since the loop last took it."""
        arrivals, self.arrivals = self.arrivals, []
        return arrivals

    def fill(self, free: int) -> None:
        """The loop's decision: start an acquire for up to ``free`` jobs (minus those
        already asked for), unless ``max_in_flight`` acquires are already out."""
        try:
            self._start(free - self.asked)
        finally:
            self.acquires.decided()

    @property
    def filling(self) -> bool:
        return self.acquires.filling

    def stop_filling(self) -> None:
        self.acquires.stop_filling()

    def _start(self, free: int) -> None:
        acquires = self.acquires
        if free <= 0 or acquires.in_flight >= self._max_in_flight or self.group is None:
            return
        self.asked += free
        acquires.sent()
        # Taken now, not when the task first runs: the batcher, seeing an acquire go
        # out, leaves the completions waiting at this moment to it.
        batch = self._batcher.take() if self.carries else []
        generation = self._wakeups.generation
        # The leases it takes run from their transaction's start, which is later: a
        # lease counted from here ends no later than the database's (see ``Slot``).
        sent_at = time.monotonic()
        self.group.start_soon(
            self._acquire, free, batch, generation, sent_at, name="pgwork-acquire"
        )

    async def idle(self) -> None:
        """Return once no acquire is in flight."""
        await self.acquires.idle()

    @property
    def in_flight(self) -> int:
        return self.acquires.in_flight

    async def _acquire(
        self, limit: int, batch: list[Pending], generation: int, sent_at: float
    ) -> None:
        counted = False
        try:
            try:
                try:
                    results, acquired = await self._send(batch, limit)
                except OutcomeNotStorableError:
                    # One of its outcomes cannot be stored: the batcher writes them on
                    # their own (that one fails alone), and the acquire goes without.
                    self._batcher.write_apart(batch)
                    batch = []
                    results, acquired = await self._send(batch, limit)
            except Exception as exc:
                self._batcher.give_back(batch)
                self.error = exc
                self.failures += 1
                return
            except BaseException:
                self._batcher.give_back(batch)
                raise
            self.failures = 0
            counted = True
            self._came_back(limit)
            # Before the loop looks: a short acquire must not send the next one.
            self._wakeups.acquired(
                generation,
                sent_at=sent_at,
                asked=limit,
                got=len(acquired),
                poll_interval=self._poll_interval,
            )
            self._batcher.deliver(batch, results)
            if acquired:
                self.arrivals.append(Arrival(acquired, sent_at))
        finally:
            if not counted:
                self._came_back(limit)
            self._bell.ring()

    async def _complete_and_acquire(
        self, batch: list[Pending], limit: int
    ) -> tuple[list[CompletionResult], list[AcquiredJob]]:
        assert self._turns is not None  # chosen only then (``__init__``)
        return await self._turns.complete_and_acquire(
            completions=[pending.completion for pending in batch],
            worker_id=self._worker_id,
            leases=self._leases,
            queues=self._queues,
            limit=limit,
        )

    async def _acquire_limited(
        self, batch: list[Pending], limit: int
    ) -> tuple[list[CompletionResult], list[AcquiredJob]]:
        assert self._flow is not None  # chosen only then (``__init__``)
        assert self._limits
        assert self._queues is not None  # the worker always names its queues
        limits = self._limits
        if self._caps:
            limits = {**limits, **self._room_by_type()}
        freed = sorted(self._freed)
        self._freed.clear()
        turn = await self._flow.acquire_limited(
            completions=[pending.completion for pending in batch],
            worker_id=self._worker_id,
            leases=self._leases,
            queues=self._queues,
            limit=limit,
            limits=limits,
            expect_short=self._wakeups.found_nothing,
            freed=freed,
        )
        self.waited_for |= turn.waited_for
        if turn.opens_at is not None:
            # A rate's window or a pause holds jobs back until then: no notice will
            # say when it ends, so a timer does, a little early the first time.
            opens = turn.opens_at.timestamp()
            early = 0.0 if opens == self._early_for else OPENS_EARLY_S
            self._early_for = opens
            self._wakeups.due_at(opens - early)
        return turn.results, turn.acquired

    def _room_by_type(self) -> dict[str, TypeLimits]:
        """The limits of the capped types for this acquire: each cap less what the
        worker holds of the type and what acquires brought that it has not started (a
        worker with caps sends one acquire at a time, so none is in flight)."""
        assert self._limits is not None
        waiting: dict[str, int] = {}
        for arrival in self.arrivals:
            for job in arrival.jobs:
                waiting[job.type_name] = waiting.get(job.type_name, 0) + 1
        return {
            name: replace(
                self._limits[name],
                most=max(cap - self._held.get(name, 0) - waiting.get(name, 0), 0),
            )
            for name, cap in self._caps.items()
        }

    async def _acquire_alone(
        self, batch: list[Pending], limit: int
    ) -> tuple[list[CompletionResult], list[AcquiredJob]]:
        """The acquire of a store without ``BatchedTurns``: ``batch`` is empty (the
        batcher writes every completion)."""
        acquired = await self.state.acquire(
            worker_id=self._worker_id, leases=self._leases, queues=self._queues, limit=limit
        )
        return [], acquired

    def _came_back(self, limit: int) -> None:
        self.asked -= limit
        self.acquires.came_back()
