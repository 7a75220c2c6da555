"""Running one slot's attempt: which steps, in which mode.

A staged attempt runs outside any transaction and writes its outcome afterwards
(plain completions through the batcher, with the worker's next acquire); an atomic
one runs inside one transaction (``_atomic``), or in a group of several sharing one
commit (``_atomic_group``). Before any of them, the lease is checked: a handler never
starts on a lease that lapsed or is about to. The steps they share are
``_steps.AttemptSteps``, below all three.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Coroutine
from typing import Any

import anyio

from pgwork.records import AbortReason
from pgwork.worker._atomic import run_atomic
from pgwork.worker._atomic_group import AtomicGroups
from pgwork.worker._attempt import Completed
from pgwork.worker._side.lease import abort_reason_for
from pgwork.worker._slot import Slot, SlotState
from pgwork.worker._steps import AttemptSteps

log = logging.getLogger("pgwork.worker")

__all__ = ["FRESH_LEASE", "SlotRunner"]

# A handler starts with at least this share of its lease ahead, renewed first if less
# is left: the renewer ticks every third of a lease, so the lease then survives a
# missed renewal, as one taken by an acquire does.
FRESH_LEASE = 2 / 3


class SlotRunner:
    """Runs one acquired job through its handler and writes what came of it.

    Shared by all slots of one worker; holds no per-attempt state (that is ``Slot``).
    The slot moves through its states as the attempt goes (``Slot.move``), which tells
    the slots' owner what it needs to know: a place freed, an attempt settled.
    """

    def __init__(self, *, steps: AttemptSteps, groups: AtomicGroups | None = None) -> None:
        self.steps = steps
        self.state = steps.state
        self.notify = steps.notify
        # Atomic attempts share transactions (``atomic_group`` > 1), else None.
        self.groups = groups

    def run(self, slot: Slot) -> Coroutine[Any, Any, bool]:
        """Run ``slot``'s attempt (the coroutine to await). True when its plain
        completion was left with the batcher: the slot's owner is told once it is
        written (``SlotOwner.settled``; the job is held until then).

        Not a coroutine itself: it picks the one to run, and the slot's task awaits
        that one directly (a coroutine fewer per job)."""
        reason = slot.pending_abort
        if reason is not None:
            # Aborted while it waited for a slot: its handler must not start at all.
            return self._refuse(slot, reason)
        left = slot.lease_deadline - time.monotonic()
        if left <= 0:
            # Its lease may have run out before the handler could start (it waited for
            # a slot, or the acquire's answer came late): another worker may reap the
            # job at any moment, so the handler must not start. Handed back untouched
            # (no attempt burned) unless someone took it already.
            return self._refuse(slot, AbortReason.OWNERSHIP_LOST, hand_back=True)
        if left < slot.lease_duration.total_seconds() * FRESH_LEASE:
            return self._renew_then_run(slot)
        return self._start(slot)

    def _start(self, slot: Slot) -> Coroutine[Any, Any, bool]:
        if slot.job_type.mode == "atomic":
            return self._run_atomic(slot)
        return self._run_staged(slot)

    async def _renew_then_run(self, slot: Slot) -> bool:
        """Renew a lease with little left before its handler starts: the renewer's next
        tick may come after it lapsed (it ticks every third of the shortest lease), and
        a lapsed lease may be reaped and its job run again elsewhere."""
        sent = time.monotonic()
        try:
            [result] = await self.state.renew(
                leases=[slot.lease], duration={slot.lease.job_id: slot.lease_duration}
            )
        except Exception as exc:  # the database is away: the lease holds until it ends
            log.warning("pgwork could not renew the lease of job %s: %s", slot.lease.job_id, exc)
            result = None
        lease = slot.lease_duration.total_seconds()
        if result is not None and result.renewed:
            slot.renewed(sent + lease)
        elif result is not None and not result.deferred:
            # Taken back meanwhile (reaped, cancelled): not this worker's to run.
            return await self._refuse(slot, abort_reason_for(result.status), hand_back=True)
        # Not renewed (the database did not answer, or a caller holds the row): start
        # only with a renewer's tick (a third of the lease) still ahead, else the lease
        # may lapse before anything renews it. The job is left to the reaper then: a
        # database that did not answer the renewal may not answer a release either.
        left = slot.lease_deadline - time.monotonic()
        if left <= 0 or (result is None and left < lease / 3):
            return await self._refuse(slot, AbortReason.OWNERSHIP_LOST)
        return await self._start(slot)

    async def _refuse(self, slot: Slot, reason: AbortReason, *, hand_back: bool = False) -> bool:
        with anyio.CancelScope(shield=True):
            await self.steps.settle_abort(slot, reason, hand_back=hand_back)
        return False

    async def _run_atomic(self, slot: Slot) -> bool:
        groups = self.groups
        if groups is not None:  # grouped, or alone if its handlers are slow
            return await groups.run(self.steps, slot)
        await run_atomic(self.steps, slot)
        return False

    async def settle_abandoned(self, slot: Slot) -> None:
        """Settle the attempt of a handler the watchdog gave up on (it runs on)."""
        attempt = slot.attempt
        assert attempt is not None
        error = self.steps.abandoned_error(slot)
        with anyio.CancelScope(shield=True):
            if attempt.transaction is not None:
                # Atomic: the abandoned handler may still use the connection. It must
                # not go back to the pool, nor its transaction outlive the attempt.
                try:
                    await attempt.transaction.discard()
                except Exception as exc:
                    log.warning("pgwork could not close an abandoned attempt's connection: %r", exc)
                if self.groups is not None:
                    # A grouped member: the closed connection was its group's.
                    await self.groups.lost(slot, error)
            await self.steps.settle(slot, attempt, error)

    async def _run_staged(self, slot: Slot) -> bool:
        attempt, decode_error = self.steps.build_attempt(slot, None)
        if attempt is None:
            with anyio.CancelScope(shield=True):
                await self.steps.settle_failure(slot, decode_error, terminal=True)
            return False
        # The handler done, its slot may take the next job while this outcome is
        # written (the worker bounds how many outcomes may be unwritten at once).
        error = await self.steps.call_handler(
            slot, attempt, slot.job_type.timeout, SlotState.SETTLING
        )
        outcome = attempt.outcome
        if (
            error is None
            and attempt.abort_reason is None
            and type(outcome) is Completed
            and outcome.plain
        ):
            # Left with the batcher, and this task ends: ``_written`` reports the
            # outcome once it is committed (waiting here for it cost a wake-up of this
            # task per job). Nothing to shield: the completion is queued before any
            # await, and a cancelled batcher still writes what waits.
            self.steps.submit_completion(slot, outcome)
            return True
        with anyio.CancelScope(shield=True):
            await self.steps.settle(slot, attempt, error)
        return False
