"""Keeping staged attempts' leases alive, and noticing when one is lost.

One task renews every running staged lease of the worker in a single statement, at a
third of the shortest lease, so a lease survives two missed renewals. A lease that is
not renewed (reaped, cancelled, completed elsewhere) aborts exactly that attempt with
the matching reason. If renewals keep failing (database unreachable) past the moment
the lease would have expired, the attempt is aborted too: another worker may own the
job by then, and pgwork prefers stopping a duplicate to racing it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Protocol

import anyio

from pgwork.adapters.state import Lease, StateAdapter
from pgwork.records import AbortReason, JobStatus

log = logging.getLogger("pgwork.worker")

__all__ = ["LeaseHolder", "abort_reason_for", "renew_forever"]

IDLE_TICK = 1.0


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

    def renewed(self, deadline: float) -> None: ...

    def abort(self, reason: AbortReason) -> None: ...


def abort_reason_for(status: JobStatus | None) -> AbortReason:
    """Why a lease was not renewed, from the job's status now."""
    if status is JobStatus.CANCELLED:
        return AbortReason.CANCELLED
    if status is JobStatus.COMPLETED:
        return AbortReason.COMPLETED_ELSEWHERE
    return AbortReason.OWNERSHIP_LOST


async def renew_forever(state: StateAdapter, holders: Callable[[], Iterable[LeaseHolder]]) -> None:
    """Renew the leases of ``holders()`` until cancelled."""
    while True:
        current = list(holders())
        if not current:
            await anyio.sleep(IDLE_TICK)
            continue
        shortest = min(h.lease_duration for h in current).total_seconds()
        await anyio.sleep(max(shortest / 3.0, 0.05))
        current = list(holders())
        if current:
            await renew_once(state, current)


async def renew_once(state: StateAdapter, holders: list[LeaseHolder]) -> None:
    by_lease: dict[Lease, LeaseHolder] = {h.lease: h for h in holders}
    started = time.monotonic()
    try:
        results = await state.renew(
            leases=[h.lease for h in holders],
            duration={h.lease.job_id: h.lease_duration for h in holders},
        )
    except Exception as exc:
        log.warning("pgwork could not renew %d lease(s): %s", len(holders), exc)
        now = time.monotonic()
        for holder in holders:
            if now >= holder.lease_deadline:
                log.warning(
                    "lease of job %s expired while the database was unreachable; "
                    "aborting the attempt",
                    holder.lease.job_id,
                )
                holder.abort(AbortReason.OWNERSHIP_LOST)
        return
    for result in results:
        found = by_lease.get(Lease(result.job_id, result.lease_token))
        if found is None:
            continue
        holder = found
        if result.renewed:
            holder.renewed(started + holder.lease_duration.total_seconds())
        else:
            reason = abort_reason_for(result.status)
            log.warning(
                "lease of job %s lost (job is %s now); aborting its attempt with reason %s",
                result.job_id,
                result.status.value if result.status else "gone",
                reason.value,
            )
            holder.abort(reason)
