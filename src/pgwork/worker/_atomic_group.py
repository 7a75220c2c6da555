"""Atomic attempts with group commit: several attempts share one transaction.

One transaction per atomic job caps an atomic drain at the server's commit rate. With
``atomic_group=N`` (N > 1) the worker keeps a few *lanes*, each a connection on which
a group's members run one after another (one psycopg connection runs one statement at
a time), each in a savepoint of its own (``AtomicGroup``), opened when the member
first uses its transaction. A member that never used it has nothing to commit but its
completion, so it leaves the group, and its completion is written as a staged
attempt's is (the batcher's, with the worker's next acquire). A member that wrote and
succeeds is kept. One
that fails is rolled back to its savepoint (the others' writes stay) and its failure
(retry or final) is written in a savepoint and kept: it commits with the group, and a
crash before the commit runs the job again, like every other member's. One that is
aborted or whose completion is refused is rolled back and settled on its own. A
member's row is not locked while its handler runs, so its lease is renewed like a
staged attempt's until its outcome is being written; the completion is fenced by it.
Concurrency comes from the lanes: a slot takes the least busy one.

A lane goes to the members waiting for it in turn. A group commits once it has N kept
members, or ``atomic_group_wait`` after its first member was kept, whichever comes
first: by the member that filled it or found it due, else by the first member waking
at the due time, once the lane is free. A kept member's slot is free at once (like a
staged slot whose handler returned), but the member counts as done, is reported and
has what it made ready announced only after the commit. A crash before the commit
rolls the whole group back: every member runs again, none twice in effect. A member
whose handler is given up on closes the lane's connection (as an atomic attempt's
is), which loses its group: the other members' jobs are handed back without counting
an attempt. So are the members of a group whose COMMIT fails, and each runs alone from
then on (``_hand_back``). A member whose own outcome the database refuses (its handler
left the transaction aborted, or a deferred constraint of its writes fails: its
deferred checks fire as its outcome is written, in its savepoint) is rolled back to
its savepoint and fails alone, counted.

A member holds its lane while its handler runs, so a slow handler would hold its
group's commit back. So a job type whose handlers took longer than the wait on
average runs alone, in a transaction of its own, as with ``atomic_group=1``. The
average is of the handler's own time (not of the wait for a lane, which a cold worker
opening its lanes' connections makes long), starts at zero (a type is taken for
short until its handlers show otherwise, so a slow first call weighs a tenth), and
goes on learning from the attempts that run alone, so a type sent alone by a slow
start comes back to the groups once its handlers are quick again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any
from uuid import UUID

import anyio

from pgwork.adapters.notify import Notice, NotifyAdapter, ready_notices
from pgwork.adapters.state import (
    AtomicGroup,
    AtomicGroupCommit,
    Completion,
    Failure,
    TransactionHandle,
    WorkerCore,
)
from pgwork.errors import CapabilityMissingError, ConfigurationError
from pgwork.worker._announce import announce_ready
from pgwork.worker._atomic import run_atomic
from pgwork.worker._attempt import Attempt, Completed, error_record
from pgwork.worker._slot import Slot, SlotState
from pgwork.worker._steps import AttemptSteps

log = logging.getLogger("pgwork.worker")

__all__ = ["AtomicGroups", "atomic_groups"]

# Weight of the newest handler duration in a job type's running mean.
_SMOOTHING = 0.1

# How long a lane keeps the connection of an empty group (no transaction begun) once
# nobody uses it (seconds).
_IDLE_LANE_S = 0.5

# Jobs remembered to run alone at most (see ``_hand_back``).
_MAX_ALONE = 10_000

# A member handed back goes back to its queue at once.
_NOW = timedelta(0)

# Lanes at most. Each holds a pooled connection while its group is open, and more
# lanes split a drain into more, smaller groups: on 2 cores 8 lanes drained no faster
# than 4 at 50 and 100 slots, with 20-40 % more commits (docs/performance.md).
_MAX_LANES = 4


def atomic_groups(
    *,
    state: WorkerCore,
    opener: AtomicGroupCommit | None,
    notify: NotifyAdapter,
    size: int,
    wait: float,
    max_slots: int,
) -> AtomicGroups | None:
    """A worker's ``AtomicGroups`` for ``atomic_group=size`` (None for 1: one
    transaction per attempt), after checking the options. ``opener`` is the store when
    it offers ``AtomicGroupCommit``: asked for groups without it, the worker is refused
    (``CapabilityMissingError``) rather than quietly running each attempt alone."""
    if size < 1:
        raise ConfigurationError(f"atomic_group must be >= 1, got {size}")
    if wait < 0:
        raise ConfigurationError(f"atomic_group_wait must not be negative, got {wait}")
    if size == 1:
        return None
    if opener is None:
        raise CapabilityMissingError(
            "AtomicGroupCommit", f"atomic_group={size}", type(state).__name__
        )
    # Enough lanes that the database works on one lane's statements while Python
    # runs another's handler (a lane runs its members' round trips one after another,
    # so the lanes bound a grouped drain): half the slots, 4 at 10 slots (2 measured
    # 40-60 % slower).
    lanes = max(1, min(_MAX_LANES, max_slots // 2))
    return AtomicGroups(
        state=state, opener=opener, notify=notify, size=size, wait=wait, lanes=lanes
    )


class _Group:
    """One transaction of a lane. The first member kept waits for its commit (and
    commits it once due, if no one else did); the others are settled when it ends, by
    whoever ends it, and their tasks end at once (a task waiting per member was a
    tenth of a grouped no-op job's CPU)."""

    __slots__ = (
        "done",
        "due",
        "error",
        "kept",
        "notices",
        "refused",
        "steps",
        "store",
        "waited",
    )

    def __init__(self, store: AtomicGroup, steps: AttemptSteps) -> None:
        self.store = store
        self.steps = steps
        self.due = math.inf  # commit by then (monotonic); set by the first kept member
        self.done = asyncio.Event()
        self.error: BaseException | None = None
        # Its COMMIT failed (the connection, or a check the members' own deferred
        # checks did not fire): the members run again, each alone.
        self.refused = False
        self.notices: list[Notice] = []
        # Whether a kept member waits for the commit; the other kept members, with
        # their attempt and the failure written for them, if any.
        self.waited = False
        self.kept: list[tuple[Slot, Attempt[Any, Any] | None, Failure | None]] = []


class _Part:
    """What one member came to in its group: its attempt (None: its input could not be
    decoded) and the handler's failure; then one of: ``plain`` (it wrote nothing and
    completed: left to the batcher), ``kept`` (its outcome, or its counted ``failed``,
    is written in the group and commits with it), ``refused`` (its lease no longer
    held its job: nothing written), ``failed`` alone (the same, for a failure), or
    none (aborted, rolled back to its savepoint)."""

    __slots__ = ("attempt", "failed", "failure", "group", "kept", "plain", "refused")

    def __init__(self, group: _Group) -> None:
        self.group = group
        self.attempt: Attempt[Any, Any] | None = None
        self.failure: BaseException | None = None
        self.plain: Completed | None = None
        self.failed: Failure | None = None
        self.kept = False
        self.refused = False


class _Lane:
    """A connection's turn: held by one member (or a committer) at a time, handed to
    those waiting in the order they came."""

    __slots__ = ("group", "idle_since", "idle_timer", "owner", "queue")

    def __init__(self) -> None:
        self.group: _Group | None = None
        self.owner: object | None = None
        # Since when its group has been left empty and idle (monotonic; None: in use),
        # and the timer that gives an idle group's connection back.
        self.idle_since: float | None = None
        self.idle_timer: asyncio.TimerHandle | None = None
        # Waiting: who, and its turn.
        self.queue: deque[tuple[object, asyncio.Future[None]]] = deque()

    @property
    def waiting(self) -> int:
        """How many wait for the lane (not counting one cancelled, on its way out)."""
        return sum(not turn.done() for _, turn in self.queue)

    @property
    def awaited(self) -> bool:
        """Whether anyone waits for the lane: ``waiting`` without counting them all
        (asked as each member leaves it)."""
        return any(not turn.done() for _, turn in self.queue)

    @property
    def load(self) -> int:
        return len(self.queue) + (self.owner is not None)

    async def take(self, owner: object) -> None:
        self.idle_since = None
        if self.owner is None and not self.queue:
            self.owner = owner
            return
        turn = asyncio.get_running_loop().create_future()
        waiter = (owner, turn)
        self.queue.append(waiter)
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():
                self.give(owner)  # handed the lane as it was cancelled: pass it on
            else:
                self.queue.remove(waiter)
            raise

    def give(self, owner: object) -> None:
        """Hand the lane to the first one waiting, unless ``owner`` no longer holds it
        (a member given up on: the watchdog's task gave it back already)."""
        if self.owner is not owner:
            return
        while self.queue:
            nxt, turn = self.queue.popleft()
            if not turn.done():  # (a cancelled waiter takes itself off the queue)
                self.owner = nxt
                turn.set_result(None)
                return
        self.owner = None


class AtomicGroups:
    """The worker's lanes and the groups open on them."""

    def __init__(
        self,
        *,
        state: WorkerCore,
        opener: AtomicGroupCommit,
        notify: NotifyAdapter,
        size: int,
        wait: float,
        lanes: int,
    ) -> None:
        self.state = state
        self._opener = opener
        self.notify = notify
        self.size = size
        self.wait = wait
        self._lanes = [_Lane() for _ in range(max(1, lanes))]
        # Jobs whose group's COMMIT failed: each runs alone from then on (on this
        # worker), so that one whose own writes cannot commit fails, counted, on its
        # own, and costs no other group a re-run. The oldest are forgotten first.
        self._alone: dict[UUID, None] = {}
        self._releasing: set[asyncio.Task[None]] = set()
        self._mean_s: dict[str, float] = {}

    def takes(self, slot: Slot) -> bool:
        """Whether ``slot``'s attempt joins a group (its type's handlers are short)."""
        return self._mean_s.get(slot.job_type.name, 0.0) <= self.wait

    def _learn(self, name: str, took: float) -> None:
        """A handler of job type ``name`` ran for ``took`` seconds."""
        mean = self._mean_s.get(name, 0.0)
        self._mean_s[name] = mean + _SMOOTHING * (took - mean)

    async def run(self, steps: AttemptSteps, slot: Slot) -> bool:
        """Run ``slot``'s job as a member of a group, or alone if its type's handlers
        are slow, and settle it; True when it is settled later, as its group ends
        (its slot's owner is then told, ``SlotOwner.settled``)."""
        if slot.acquired.id in self._alone or not self.takes(slot):
            await run_atomic(steps, slot, timed=self._learn)
            return False
        # Its row is not locked while it waits and runs: its lease is renewed meanwhile.
        slot.move(SlotState.JOINING)
        lane = min(self._lanes, key=lambda lane: lane.load)
        await lane.take(slot)
        try:
            part = await self._take_part(steps, slot, lane)
        except BaseException as exc:
            if lane.owner is slot and lane.group is not None:
                with anyio.CancelScope(shield=True):
                    await self._lose(lane, lane.group, exc)
            raise
        finally:
            if lane.owner is slot:
                await self._leave(lane, slot)
        return await self._settle_part(steps, slot, lane, part)

    async def _take_part(self, steps: AttemptSteps, slot: Slot, lane: _Lane) -> _Part:
        """With the lane held: run the member's handler in its group's transaction,
        write its outcome there (or roll it back to its savepoint), and commit the
        group if it is full or due. What it comes to is the returned ``_Part``."""
        deadline = slot.job_type.timeout or slot.job_type.lease
        group = lane.group
        if group is None:
            group = lane.group = _Group(await self._opener.open_atomic_group(), steps)
        part = _Part(group)
        tx = await group.store.enter(lease=slot.lease, deadline=deadline)
        attempt, part.failure = steps.build_attempt(slot, tx)
        part.attempt = attempt
        if attempt is not None:
            # A handler given up on raises Abandoned here once it ends; the watchdog's
            # task closed the connection, lost the group and gave the lane back.
            began = time.monotonic()
            part.failure = await steps.call_handler(slot, attempt, deadline, SlotState.FINISHING)
            self._learn(slot.job_type.name, time.monotonic() - began)
        else:
            slot.move(SlotState.FINISHING)  # its input could not be decoded
        if attempt is not None and part.failure is None and not attempt.aborted:
            outcome = attempt.outcome
            if isinstance(outcome, Completed) and outcome.plain and not group.store.used:
                # It wrote nothing: its completion is all there is to commit, and needs
                # no group. It is written as a staged attempt's is, with the worker's
                # other completions and its next acquire.
                group.store.leave()
                part.plain = outcome
            else:
                # Not shielded: one cancelled while it writes loses its group, of which
                # nothing then commits.
                try:
                    part.kept = await self._keep(steps, slot, attempt, group, tx)
                    part.refused = not part.kept
                except Exception as exc:
                    # The database refused its outcome (its handler left the
                    # transaction aborted, or wrote what cannot be stored): it is rolled
                    # back to its savepoint, the other members' writes stay, and its
                    # attempt counts, failed with the write's error. (A connection that
                    # broke cannot roll back: the group is lost.)
                    log.warning(
                        "pgwork could not write the outcome of atomic job %s (%r)",
                        slot.acquired.id,
                        exc,
                    )
                    with anyio.CancelScope(shield=True):
                        await group.store.undo()
                        part.failed = steps.counted_failure(slot, exc)
                        part.kept = await self._record_failure(slot, part.failed, group, tx)
        else:
            with anyio.CancelScope(shield=True):
                await group.store.undo()
                part.failed = steps.failure_of(slot, attempt, part.failure)
                if part.failed is not None:
                    part.kept = await self._record_failure(slot, part.failed, group, tx)
        if part.kept and group.due == math.inf:
            group.due = time.monotonic() + self.wait
        if not group.done.is_set() and (
            group.store.members >= self.size or time.monotonic() >= group.due
        ):
            with anyio.CancelScope(shield=True):
                await self._commit(lane, group)
        return part

    async def _settle_part(self, steps: AttemptSteps, slot: Slot, lane: _Lane, part: _Part) -> bool:
        """The lane given back: settle the member by what its part came to (True: it is
        settled later, by the batcher or as its group ends)."""
        attempt, group = part.attempt, part.group
        if part.plain is not None:
            slot.move(SlotState.SETTLING)  # which frees its place
            steps.submit_completion(slot, part.plain)
            return True  # settled by the batcher (``AttemptSteps._written``)
        if part.kept:
            slot.move(SlotState.SETTLING)  # the slot takes its next job meanwhile
            if not group.done.is_set():
                if group.waited:
                    group.kept.append((slot, attempt, part.failed))
                    return True  # settled when the group ends (``_end``)
                group.waited = True
                await self._committed(lane, group)
            then = self._settle_kept(group, slot, attempt, part.failed)
            if then is not None:
                await then
            return False
        if part.failed is not None:  # its lease no longer held: nothing was written
            steps.report_failure(slot, part.failed, False)
            return False
        if part.refused:
            assert attempt is not None
            steps.report_outcome(slot, attempt, False)
            return False
        # Aborted, and rolled back to its savepoint: settled on its own (a stopping
        # worker hands the job back; a lost lease writes nothing).
        with anyio.CancelScope(shield=True):
            assert attempt is not None
            await steps.settle(slot, attempt, part.failure)
        return False

    def _settle_kept(
        self,
        group: _Group,
        slot: Slot,
        attempt: Attempt[Any, Any] | None,
        failed: Failure | None,
    ) -> Coroutine[Any, Any, None] | None:
        """Report a kept member once its group ended; what is left to do (a lost
        group's hand-back) is returned."""
        if group.error is not None:
            return self._hand_back(group, slot)
        if failed is not None:
            group.steps.report_failure(slot, failed, True)
            return None
        assert attempt is not None
        # Kept only if its outcome was accepted.
        group.steps.report_outcome(slot, attempt, True)
        return None

    def _end(self, group: _Group) -> None:
        """``group`` was committed or lost: let its waiting member go, and settle the
        others, each reported in its own task's context."""
        group.done.set()
        kept, group.kept = group.kept, []
        for slot, attempt, failed in kept:
            context = slot.context
            if context is None:
                then = self._settle_kept(group, slot, attempt, failed)
            else:
                then = context.run(self._settle_kept, group, slot, attempt, failed)
            slot.owner.settled(slot, then)

    async def _record_failure(
        self, slot: Slot, failure: Failure, group: _Group, tx: TransactionHandle
    ) -> bool:
        """Write a failed member's failure in its savepoint, rolled back already, and
        keep the member: the failure commits with the group (and is lost with it, when
        the job runs again). False, with nothing kept, when its lease no longer held.
        The retry's due time is announced after the commit."""
        [accepted] = await self.state.fail(tx, failures=[failure])
        if not accepted:
            return False
        await group.store.keep()
        if failure.retry_after is not None:
            due = time.time() + failure.retry_after.total_seconds()
            group.notices.append(Notice(kind="ready", queue=slot.acquired.queue, at=due))
        return True

    async def _keep(
        self,
        steps: AttemptSteps,
        slot: Slot,
        attempt: Attempt[Any, Any],
        group: _Group,
        tx: TransactionHandle,
    ) -> bool:
        """Write the member's outcome in its savepoint and keep it; False (rolled back)
        when its lease no longer held."""
        outcome = attempt.outcome
        if isinstance(outcome, Completed) and outcome.plain:
            lease = slot.lease
            completion = Completion(lease.job_id, lease.lease_token, outcome.output_json)
            result = await group.store.complete(completion)
            group.notices.extend(ready_notices(result.ready_queues, result.due))
            if result.chain_awaited:
                group.notices.append(Notice(kind="chain_done", chain_id=slot.acquired.chain_id))
            return result.accepted
        # A continuation, children or a reschedule: written, and announced, in the transaction
        # (so on its commit), as for an attempt alone.
        if await steps.write_outcome(slot, attempt, tx):
            await group.store.keep()
            return True
        await group.store.undo()
        return False

    async def _leave(self, lane: _Lane, owner: object) -> None:
        """Give the lane back. A group left without members and without anyone to join
        it is rolled back if its transaction was begun, so that its connection goes
        back to the pool; one never begun keeps its connection for the next member
        until the lane has been idle for ``_IDLE_LANE_S`` (members that write nothing
        leave their group empty: opening one for each cost a pool round trip)."""
        group = lane.group
        if group is not None and not group.store.members and not lane.awaited:
            if not group.store.open:
                lane.give(owner)
                if lane.owner is None:
                    lane.idle_since = time.monotonic()
                    if lane.idle_timer is None:
                        lane.idle_timer = asyncio.get_running_loop().call_later(
                            _IDLE_LANE_S, self._idle, lane
                        )
                return
            lane.group = None
            with anyio.CancelScope(shield=True):
                try:
                    await group.store.discard()
                finally:
                    lane.give(owner)
            return
        lane.give(owner)

    def _idle(self, lane: _Lane) -> None:
        """The idle lane's timer: give its empty group's connection back once the lane
        has been idle for ``_IDLE_LANE_S``, else look again then."""
        lane.idle_timer = None
        group = lane.group
        since = lane.idle_since
        if group is None or since is None or lane.owner is not None or group.store.members:
            return
        left = since + _IDLE_LANE_S - time.monotonic()
        if left > 0:
            lane.idle_timer = asyncio.get_running_loop().call_later(left, self._idle, lane)
            return
        lane.group = None
        task = asyncio.get_running_loop().create_task(group.store.discard())
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def close(self) -> None:
        """Give back the connections of the lanes' empty, idle groups (the worker is
        stopping)."""
        for lane in self._lanes:
            if lane.idle_timer is not None:
                lane.idle_timer.cancel()
                lane.idle_timer = None
            group = lane.group
            if group is not None and lane.owner is None and not group.store.members:
                lane.group = None
                with contextlib.suppress(Exception):
                    await group.store.discard()
        if self._releasing:
            await asyncio.gather(*self._releasing, return_exceptions=True)

    async def _commit(self, lane: _Lane, group: _Group) -> None:
        """Commit ``group`` (its lane held), then announce what its members made ready."""
        lane.group = None
        try:
            await group.store.commit()
        except Exception as exc:
            group.error = exc
            group.refused = True
            log.warning("pgwork could not commit a group of atomic attempts: %r", exc)
            self._end(group)
            return
        if group.notices:
            try:
                await self.notify.publish(None, notices=list(dict.fromkeys(group.notices)))
            except Exception as exc:  # the pollers find the work anyway
                log.warning("pgwork could not announce a group's notices: %r", exc)
        self._end(group)

    async def _lose(self, lane: _Lane, group: _Group, error: BaseException) -> None:
        """``group`` can no longer commit (its connection was closed or broke)."""
        if lane.group is group:
            lane.group = None
        if not group.done.is_set():
            group.error = error
            try:
                await group.store.discard()
            except Exception as exc:
                log.warning("pgwork could not end a lost group of atomic attempts: %r", exc)
            self._end(group)

    async def lost(self, slot: Slot, error: BaseException) -> None:
        """``slot``'s handler was given up on and its connection closed: its group is
        lost, and its lane goes to the next member now."""
        for lane in self._lanes:
            if lane.owner is slot and lane.group is not None:
                await self._lose(lane, lane.group, error)
            if lane.owner is slot:
                lane.give(slot)

    async def _committed(self, lane: _Lane, group: _Group) -> None:
        """Wait until ``group`` is committed (or lost); once it is due, commit it."""
        try:
            while not group.done.is_set():
                delay = group.due - time.monotonic()
                if delay > 0:
                    with anyio.move_on_after(delay):
                        await group.done.wait()
                    continue
                await lane.take(group)
                try:
                    if lane.group is group:
                        with anyio.CancelScope(shield=True):
                            await self._commit(lane, group)
                finally:
                    await self._leave(lane, group)
        except BaseException:
            # Cancelled (the worker is being torn down): the members' work is done,
            # so commit rather than leave the transaction open. (Should the lane stay
            # taken meanwhile, its holder commits the group as it leaves: it is due.)
            if not group.done.is_set():
                with anyio.CancelScope(shield=True), anyio.move_on_after(self.wait + 5.0):
                    await lane.take(group)
                    try:
                        if lane.group is group:
                            await self._commit(lane, group)
                    finally:
                        await self._leave(lane, group)
            raise

    async def _hand_back(self, group: _Group, slot: Slot) -> None:
        """The member's group was lost before its commit: nothing of it was written, and
        (as far as anyone can tell) through no fault of its own; hand the job back
        without counting the attempt, and report the attempt settled. After a COMMIT
        that failed, the job runs alone from then on: if its own writes were what
        could not commit, it fails on its own, counted, and costs no other job a
        re-run."""
        error = group.error
        assert error is not None
        log.warning(
            "pgwork job %s handed back: its group of atomic attempts was lost (%r)",
            slot.acquired.id,
            error,
        )
        if group.refused:
            self._alone[slot.acquired.id] = None
            if len(self._alone) > _MAX_ALONE:
                del self._alone[next(iter(self._alone))]
        back = Failure(slot.acquired.id, slot.acquired.lease_token, error_record(error), _NOW)
        with anyio.CancelScope(shield=True):
            released = bool(await self.state.release(leases=[slot.lease]))
            group.steps.report_failure(slot, back, released)
            if released:
                await announce_ready(self.notify, [slot.acquired.queue])
