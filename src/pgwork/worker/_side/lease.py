"""Keeping staged attempts' leases alive, and noticing when one is lost.

One task renews every running staged lease of the worker in a single statement, at a
third of the shortest lease, so a lease survives two missed renewals. A lease that is
not renewed (reaped, cancelled, completed elsewhere) aborts exactly that attempt with
the matching reason. A lease whose job's row another transaction holds (a caller
cancelling or completing it) is skipped by that statement, not waited on, and not
taken for lost, and the other leases are renewed meanwhile. That one lease gets a
waiter of its own, which waits in line for the row (``renew_in_line``): the caller may
hold it past the lease, and the moment it lets go the waiter renews the lease before
any reaper can take the job. On a store without ``InLineRenewal`` there is no waiter:
the deferred lease is simply tried again on the next tick. If renewals keep failing
(database unreachable) past the moment the lease would have expired, the attempt is
aborted too: another worker may own the job by then, and pgwork prefers stopping a
duplicate to racing it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Protocol
from uuid import UUID

import anyio

from pgwork.adapters.state import InLineRenewal, Lease, WorkerCore
from pgwork.records import AbortReason, JobStatus

log = logging.getLogger("pgwork.worker")

__all__ = ["LeaseHolder", "abort_reason_for", "renew_forever"]

# The renewer never sleeps longer than this, even when every lease is longer.
MAX_TICK = 10.0

# How long one wait in line for a held row lasts before the waiter checks that the
# worker still holds the lease and queues again (the lease's duration, within these).
MIN_LINE_WAIT = timedelta(seconds=1)
MAX_LINE_WAIT = timedelta(seconds=30)


class LeaseHolder(Protocol):
    """What the renewer needs to know about one running staged attempt."""

    @property
    def lease(self) -> Lease: ...

    @property
    def lease_duration(self) -> timedelta: ...

    @property
    def lease_deadline(self) -> float:
        """Monotonic time at which the lease is known to expire, as last renewed."""
        ...

    @property
    def settling(self) -> bool:
        """The handler is done and its outcome is being written: a lease not renewed
        then is no loss to report, as the write tells what came of the attempt."""
        ...

    def renewed(self, deadline: float) -> None: ...

    def abort(self, reason: AbortReason) -> None: ...


def abort_reason_for(status: JobStatus | None) -> AbortReason:
    """Why a lease was not renewed, from the job's status now."""
    if status is JobStatus.CANCELLED:
        return AbortReason.CANCELLED
    if status is JobStatus.COMPLETED:
        return AbortReason.COMPLETED_ELSEWHERE
    return AbortReason.OWNERSHIP_LOST


async def renew_forever(
    state: WorkerCore,
    holders: Callable[[], Iterable[LeaseHolder]],
    *,
    shortest_lease: timedelta,
    in_line: InLineRenewal | None,
) -> None:
    """Renew the leases of ``holders()`` until cancelled, every third of
    ``shortest_lease`` (the shortest a holder can have): a lease taken just after a
    renewal is renewed at most a third of its duration later, also when the worker
    was idle before. A lease whose row a caller holds gets a waiter in line for it
    (``in_line``, the store's ``InLineRenewal``), or without one is tried again on the
    next tick."""
    tick = min(max(shortest_lease.total_seconds() / 3.0, 0.05), MAX_TICK)
    waiting: set[UUID] = set()  # jobs whose waiter is waiting in line for the row
    async with anyio.create_task_group() as waiters:
        while True:
            await anyio.sleep(tick)
            current = list(holders())
            if not current:
                continue
            deferred = await renew_once(state, current, holding=holders)
            if in_line is None:
                continue
            for holder in deferred:
                job_id = holder.lease.job_id
                if job_id not in waiting:
                    waiting.add(job_id)
                    waiters.start_soon(_wait_in_line, state, in_line, holder, holders, waiting)


async def _wait_in_line(
    state: WorkerCore,
    in_line: InLineRenewal,
    holder: LeaseHolder,
    holding: Callable[[], Iterable[LeaseHolder]],
    waiting: set[UUID],
) -> None:
    """Wait in line for the row of ``holder``'s job, which a caller holds, while the
    worker still holds the lease; once the caller let go, renew the lease as every
    tick does (which also tells a lease the caller ended)."""
    wait = min(max(holder.lease_duration, MIN_LINE_WAIT), MAX_LINE_WAIT)
    try:
        while any(h is holder for h in holding()):
            try:
                result = await in_line.renew_in_line(
                    lease=holder.lease, duration=holder.lease_duration, wait=wait
                )
            except Exception as exc:
                # The ticks go on, and queue a new waiter while the row stays held.
                log.warning("pgwork could not wait for job %s's row: %s", holder.lease.job_id, exc)
                return
            if not result.deferred:
                await renew_once(state, [holder], holding=holding)
                return
    finally:
        waiting.discard(holder.lease.job_id)


async def renew_once(
    state: WorkerCore,
    holders: list[LeaseHolder],
    *,
    holding: Callable[[], Iterable[LeaseHolder]] | None = None,
) -> list[LeaseHolder]:
    """Renew ``holders``' leases once; return those whose row another transaction
    holds (renewal deferred). ``holding`` tells who still holds a lease when the
    answer comes: an attempt whose outcome was written meanwhile was not renewed (the
    completion got the row first), and that is no lost lease."""
    by_lease: dict[Lease, LeaseHolder] = {h.lease: h for h in holders}
    started = time.monotonic()
    # A renewal that gets no answer at all (a hung server, a stalled network path: no
    # error, no reset) must not outlast the first lease it renews by much: it may wait
    # until that lease's deadline, or a renewal tick (a third of the shortest lease) if
    # that is later, so a lease already past its deadline still gets its answer. Then
    # it fails like any other renewal, and attempts past their deadline are aborted.
    tick = min(h.lease_duration for h in holders).total_seconds() / 3.0
    budget = max(min(h.lease_deadline for h in holders) - started, tick)
    try:
        with anyio.fail_after(budget):
            results = await state.renew(
                leases=[h.lease for h in holders],
                duration={h.lease.job_id: h.lease_duration for h in holders},
            )
    except Exception as exc:
        log.warning("pgwork could not renew %d lease(s): %s", len(holders), exc)
        now = time.monotonic()
        for holder in holders:
            if now >= holder.lease_deadline and not holder.settling:
                log.warning(
                    "lease of job %s expired while the database was unreachable; "
                    "aborting the attempt",
                    holder.lease.job_id,
                )
                holder.abort(AbortReason.OWNERSHIP_LOST)
        return []
    deferred: list[LeaseHolder] = []
    still: set[int] | None = None
    for result in results:
        found = by_lease.get(Lease(result.job_id, result.lease_token))
        if found is None:
            continue
        holder = found
        if result.renewed:
            holder.renewed(started + holder.lease_duration.total_seconds())
        elif result.deferred:
            # Another transaction holds the row (a caller's): not renewed this time,
            # and not lost either, even past its deadline: no reaper can take a row
            # that is held (they skip locked rows), and the waiter in line for it
            # renews it once the caller lets go, or learns that the caller ended
            # the job.
            deferred.append(holder)
        elif not holder.settling:
            if holding is not None:
                if still is None:
                    still = {id(h) for h in holding()}
                if id(holder) not in still:
                    continue
            reason = abort_reason_for(result.status)
            log.warning(
                "lease of job %s lost (job is %s now); aborting its attempt with reason %s",
                result.job_id,
                result.status.value if result.status else "gone",
                reason.value,
            )
            holder.abort(reason)
    return deferred
