"""An atomic attempt: the handler runs inside one transaction, and its writes commit
with the completion or not at all.

The job's row is not locked while the handler runs: the worker renews the attempt's
lease meanwhile, as a staged attempt's, and the completion is fenced by the lease
token, in the transaction (refused, it rolls the handler's writes back). So a caller
cancelling or deleting the job does not wait for the handler, and a lease the worker
cannot renew aborts the attempt (``OWNERSHIP_LOST``) like any other.

A plain completion (no continuation, no children) goes through ``complete_atomic``,
which commits the transaction in the same round trip; what it made ready is announced
after that commit. A continuation, the children the handler started, or a reschedule
is written in the transaction, which commits when it ends. A handler that fails, or
whose attempt was aborted, has its writes rolled back; the failure is then recorded on
its own.

An outcome the database refuses to write (the handler caught a database error and
returned, leaving its transaction aborted; a deferred constraint fails at COMMIT; a
value the database cannot store) rolls the handler's writes back too, and the attempt
counts: the write error is recorded as its failure, in a transaction of its own, so
the job is retried after its backoff or, at ``max_attempts``, fails for good.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import anyio

from pgwork.adapters.notify import Notice, ready_notices
from pgwork.adapters.state import Completion, TransactionHandle
from pgwork.worker._attempt import Attempt, Completed
from pgwork.worker._slot import Slot, SlotState
from pgwork.worker._steps import AttemptSteps

log = logging.getLogger("pgwork.worker")

__all__ = ["run_atomic"]


class _Refused(Exception):
    """Leaves an atomic attempt's transaction whose completion was refused."""


class _Rollback(Exception):
    """Leaves an atomic attempt's transaction without committing the handler's writes."""


async def run_atomic(
    steps: AttemptSteps, slot: Slot, *, timed: Callable[[str, float], None] | None = None
) -> None:
    """Run ``slot``'s job as an atomic attempt and settle it. ``timed`` is told the job
    type's name and how long its handler took (the grouping worker's running mean)."""
    # Atomic attempts hold a transaction open, so they always have a deadline.
    deadline = slot.job_type.timeout or slot.job_type.lease
    attempt: Attempt[Any, Any] | None = None
    failure: BaseException | None = None
    # The outcome is being written (or committed): an error now is the write's.
    writing = False
    atomic = steps.atomic
    assert atomic is not None  # a worker on a store without it refuses atomic types
    try:
        async with atomic.atomic_transaction(lease=slot.lease, deadline=deadline) as tx:
            if tx is None:
                log.warning(
                    "pgwork job %s was taken from this worker before it started",
                    slot.acquired.id,
                )
                return
            attempt, failure = steps.build_attempt(slot, tx)
            if attempt is None:
                raise _Rollback
            # A handler given up on raises Abandoned here once it ends; the
            # watchdog's task closed this connection and settled the attempt.
            began = time.monotonic()
            # Its outcome is then written in its transaction, the slot still taken.
            failure = await steps.call_handler(slot, attempt, deadline, SlotState.FINISHING)
            if timed is not None:
                timed(slot.job_type.name, time.monotonic() - began)
            if failure is not None or attempt.aborted:
                raise _Rollback
            writing = True
            with anyio.CancelScope(shield=True):
                written = await _write_atomic_outcome(steps, slot, attempt, tx)
            if not written:
                # The lease no longer holds: the handler's writes must not commit.
                raise _Refused
        steps.report_outcome(slot, attempt, written)  # after the commit
        return
    except _Refused:
        assert attempt is not None
        steps.report_outcome(slot, attempt, False)
        return
    except _Rollback:
        pass
    except Exception as exc:
        if not writing:
            raise
        # The outcome could not be written, nor the transaction committed: it was
        # rolled back. The attempt counts, failed with the write's error.
        log.warning(
            "pgwork could not write the outcome of atomic job %s (%r)", slot.acquired.id, exc
        )
        with anyio.CancelScope(shield=True):
            await steps.settle_failure(slot, exc, terminal=False)
        return
    # The handler's writes were rolled back; record what happened on its own.
    with anyio.CancelScope(shield=True):
        if attempt is None:
            await steps.settle_failure(slot, failure, terminal=True)
        else:
            await steps.settle(slot, attempt, failure)


async def _write_atomic_outcome(
    steps: AttemptSteps, slot: Slot, attempt: Attempt[Any, Any], tx: TransactionHandle
) -> bool:
    """Write the handler's outcome; False when the lease no longer held (then nothing
    the handler wrote may commit)."""
    outcome = attempt.outcome
    if not isinstance(outcome, Completed) or not outcome.plain:
        return await steps.write_outcome(slot, attempt, tx)
    lease = slot.lease
    assert steps.atomic is not None  # as in ``run_atomic``
    result = await steps.atomic.complete_atomic(
        tx,
        completion=Completion(lease.job_id, lease.lease_token, outcome.output_json),
    )
    # The transaction is over (committed, or rolled back if refused): announce after it.
    notices = ready_notices(result.ready_queues, result.due)
    if result.chain_awaited:
        notices.append(Notice(kind="chain_done", chain_id=slot.acquired.chain_id))
    if notices:
        await steps.notify.publish(None, notices=notices)
    return result.accepted
