"""Groups of atomic attempts: several members in one transaction, each in a savepoint.

A member's own writes stand in for a handler's: it completes a *side* job in its
transaction. Kept members commit together and only on ``commit``; an undone or
refused member leaves nothing, and its job's row is free at once.

Role exercised: ``WorkerStore`` (``open_atomic_group``).
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import anyio
import pytest

from pgwork.adapters.state import (
    AcquiredJob,
    Completion,
    Failure,
    Lease,
    NextMember,
    StateAdapter,
)
from pgwork.records import AttemptError, ChainStatus, JobStatus
from pgwork.testing.conformance._harness import BETA, StateHarness, StateSuiteBase

BOOM = AttemptError(type="RuntimeError", message="member failed")
DEADLINE = timedelta(seconds=30)


def _done(job: AcquiredJob, output: str = '"grouped"') -> Completion:
    return Completion(job.id, job.lease_token, output)


def _next(job: AcquiredJob) -> NextMember:
    return NextMember(job.lease, DEADLINE)


class AtomicGroupConformance(StateSuiteBase):
    async def test_a_group_commits_every_kept_member_and_its_writes_at_once(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        await store.seed(*(store.new_job() for _ in range(6)))
        held = await store.acquire(limit=6)
        jobs, sides = held[:3], held[3:]
        group = await state_adapter.open_atomic_group()
        for job, side in zip(jobs, sides, strict=True):
            tx = await group.enter(lease=job.lease, deadline=DEADLINE)
            assert tx is not None
            await state_adapter.complete(tx, completions=[_done(side, '"side"')])
            assert (await group.complete(_done(job))).accepted
        assert group.members == 3
        for job in held:  # nothing is visible before the commit
            assert (await store.job(job.id)).status is JobStatus.RUNNING
        await group.commit()
        for job in jobs:
            assert (await store.job(job.id)).output == "grouped"
        for side in sides:
            assert (await store.job(side.id)).output == "side"

    async def test_an_undone_member_leaves_nothing_and_frees_its_row_at_once(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        await store.seed(*(store.new_job() for _ in range(6)))
        first, failing, last, *sides = await store.acquire(limit=6)
        group = await state_adapter.open_atomic_group()
        for job, side in zip((first, failing, last), sides, strict=True):
            tx = await group.enter(lease=job.lease, deadline=DEADLINE)
            assert tx is not None
            await state_adapter.complete(tx, completions=[_done(side, '"side"')])
            if job is failing:
                await group.undo()
            else:
                assert (await group.complete(_done(job))).accepted
        assert group.members == 2
        # Its failure can be recorded on its own, while the group is still open: the
        # savepoint's rollback released its row lock (else this would wait for the
        # group's commit; bounded, so a store that keeps the lock fails here).
        with anyio.fail_after(10):
            assert await state_adapter.fail(
                None, failures=[Failure(failing.id, failing.lease_token, BOOM, None)]
            ) == [True]
        await group.commit()
        assert (await store.job(first.id)).output == "grouped"
        assert (await store.job(last.id)).output == "grouped"
        assert (await store.job(failing.id)).status is JobStatus.FAILED
        assert (await store.job(sides[0].id)).output == "side"
        assert (await store.job(sides[1].id)).status is JobStatus.RUNNING
        assert (await store.job(sides[2].id)).output == "side"

    async def test_a_member_whose_lease_no_longer_holds_is_refused_and_leaves_nothing(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        await store.seed(*(store.new_job() for _ in range(4)))
        job, spoiled, kept, side = await store.acquire(limit=4)
        group = await state_adapter.open_atomic_group()
        assert await group.enter(lease=Lease(job.id, uuid.uuid4()), deadline=DEADLINE) is None
        tx = await group.enter(lease=spoiled.lease, deadline=DEADLINE)
        assert tx is not None
        await state_adapter.complete(tx, completions=[_done(side, '"side"')])
        # The handler ends its own job: the completion behind it is refused, and the
        # member is rolled back with everything it wrote.
        await state_adapter.complete(tx, completions=[_done(spoiled, '"early"')])
        assert not (await group.complete(_done(spoiled))).accepted
        tx = await group.enter(lease=kept.lease, deadline=DEADLINE)
        assert tx is not None
        assert (await group.complete(_done(kept))).accepted
        assert group.members == 1
        await group.commit()
        assert (await store.job(kept.id)).output == "grouped"
        for untouched in (job, spoiled, side):
            stored = await store.job(untouched.id)
            assert stored.status is JobStatus.RUNNING
            assert stored.output is None

    async def test_a_kept_member_with_its_own_outcome_commits_with_the_group(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        await store.seed(store.new_job(), store.new_job())
        job, side = await store.acquire(limit=2)
        group = await state_adapter.open_atomic_group()
        tx = await group.enter(lease=job.lease, deadline=DEADLINE)
        assert tx is not None
        await state_adapter.complete(tx, completions=[_done(side, '"side"'), _done(job)])
        await group.keep()
        assert group.members == 1
        await group.commit()
        assert (await store.job(job.id)).output == "grouped"
        assert (await store.job(side.id)).output == "side"

    async def test_a_discarded_group_commits_nothing(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        await store.seed(store.new_job())
        job = await store.acquire_one()
        group = await state_adapter.open_atomic_group()
        assert await group.enter(lease=job.lease, deadline=DEADLINE) is not None
        assert (await group.complete(_done(job))).accepted
        await group.discard()
        assert (await store.job(job.id)).status is JobStatus.RUNNING
        [again] = await state_adapter.complete(None, completions=[_done(job, '"later"')])
        assert again.accepted

    async def test_a_group_whose_connection_a_member_discarded_cannot_commit(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        await store.seed(store.new_job(), store.new_job())
        kept, abandoned = await store.acquire(limit=2)
        group = await state_adapter.open_atomic_group()
        assert await group.enter(lease=kept.lease, deadline=DEADLINE) is not None
        assert (await group.complete(_done(kept))).accepted
        tx = await group.enter(lease=abandoned.lease, deadline=DEADLINE)
        assert tx is not None
        await tx.discard()  # what the worker does to a handler it gave up on
        with pytest.raises(Exception):  # noqa: B017, PT011 - the adapter's own error type
            await group.commit()
        with anyio.fail_after(10):
            [result] = await state_adapter.complete(None, completions=[_done(kept, '"later"')])
        assert result.accepted  # nothing committed, nothing left locked

    async def test_a_completion_that_names_the_next_member_lets_it_enter(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        await store.seed(*(store.new_job() for _ in range(5)))
        first, second, third, *sides = await store.acquire(limit=5)
        group = await state_adapter.open_atomic_group()
        assert await group.enter(lease=first.lease, deadline=DEADLINE) is not None
        # An output that must travel as a value, quotes and backslashes included.
        tricky = '"it\'s \\\\ a \\"quote\\"; COMMIT; -- \u00e9\u2603"'
        assert (await group.complete(_done(first, tricky), then=_next(second))).accepted
        tx = await group.enter(lease=second.lease, deadline=DEADLINE)
        assert tx is not None
        await state_adapter.complete(tx, completions=[_done(sides[0], '"side"')])
        assert (await group.complete(_done(second), then=_next(third))).accepted
        tx = await group.enter(lease=third.lease, deadline=DEADLINE)
        assert tx is not None
        await state_adapter.complete(tx, completions=[_done(sides[1], '"side"')])
        await group.undo()  # the third fails: its side effect goes, the others stay
        assert group.members == 2
        with anyio.fail_after(10):
            assert await state_adapter.fail(
                None, failures=[Failure(third.id, third.lease_token, BOOM, None)]
            ) == [True]
        for job in (first, second, sides[0]):  # nothing is visible before the commit
            assert (await store.job(job.id)).status is JobStatus.RUNNING
        await group.commit()
        assert (await store.job(first.id)).output == 'it\'s \\ a "quote"; COMMIT; -- \u00e9\u2603'
        assert (await store.job(second.id)).output == "grouped"
        assert (await store.job(sides[0].id)).output == "side"
        assert (await store.job(third.id)).status is JobStatus.FAILED
        assert (await store.job(sides[1].id)).status is JobStatus.RUNNING

    async def test_a_next_member_that_does_not_enter_leaves_its_row_free(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        """The member named as next is not the one that enters (it was cancelled
        while waiting): whatever the store did for it ahead is dropped at once, and
        its job stays its worker's to settle on its own."""
        await store.seed(*(store.new_job() for _ in range(4)))
        first, named, entering, side = await store.acquire(limit=4)
        group = await state_adapter.open_atomic_group()
        assert await group.enter(lease=first.lease, deadline=DEADLINE) is not None
        assert (await group.complete(_done(first), then=_next(named))).accepted
        tx = await group.enter(lease=entering.lease, deadline=DEADLINE)
        assert tx is not None
        await state_adapter.complete(tx, completions=[_done(side, '"side"')])
        assert (await group.complete(_done(entering))).accepted
        assert group.members == 2
        # Bounded: a store that kept the named member's row locked fails here.
        with anyio.fail_after(10):
            assert await state_adapter.fail(
                None, failures=[Failure(named.id, named.lease_token, BOOM, None)]
            ) == [True]
        await group.commit()
        for job in (first, entering):
            assert (await store.job(job.id)).output == "grouped"
        assert (await store.job(side.id)).output == "side"
        assert (await store.job(named.id)).status is JobStatus.FAILED

    async def test_a_group_that_commits_before_its_named_next_member_enters(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        await store.seed(store.new_job(), store.new_job())
        first, named = await store.acquire(limit=2)
        group = await state_adapter.open_atomic_group()
        assert await group.enter(lease=first.lease, deadline=DEADLINE) is not None
        assert (await group.complete(_done(first), then=_next(named))).accepted
        await group.commit()
        assert (await store.job(first.id)).output == "grouped"
        stored = await store.job(named.id)
        assert stored.status is JobStatus.RUNNING
        assert stored.output is None
        with anyio.fail_after(10):
            [result] = await state_adapter.complete(None, completions=[_done(named, '"alone"')])
        assert result.accepted

    async def test_a_refused_completion_that_names_the_next_member(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        """The completion is refused (its handler ended its own job): it is rolled back
        alone, and the member named as next enters all the same."""
        await store.seed(*(store.new_job() for _ in range(3)))
        spoiled, named, side = await store.acquire(limit=3)
        group = await state_adapter.open_atomic_group()
        tx = await group.enter(lease=spoiled.lease, deadline=DEADLINE)
        assert tx is not None
        await state_adapter.complete(tx, completions=[_done(side, '"side"')])
        await state_adapter.complete(tx, completions=[_done(spoiled, '"early"')])
        assert not (await group.complete(_done(spoiled), then=_next(named))).accepted
        assert await group.enter(lease=named.lease, deadline=DEADLINE) is not None
        assert (await group.complete(_done(named))).accepted
        assert group.members == 1
        await group.commit()
        assert (await store.job(named.id)).output == "grouped"
        for untouched in (spoiled, side):
            stored = await store.job(untouched.id)
            assert stored.status is JobStatus.RUNNING
            assert stored.output is None

    async def test_a_named_next_member_whose_lease_no_longer_holds_enters_as_none(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        await store.seed(*(store.new_job() for _ in range(3)))
        first, other, last = await store.acquire(limit=3)
        group = await state_adapter.open_atomic_group()
        assert await group.enter(lease=first.lease, deadline=DEADLINE) is not None
        gone = NextMember(Lease(other.id, uuid.uuid4()), DEADLINE)
        assert (await group.complete(_done(first), then=gone)).accepted
        assert await group.enter(lease=gone.lease, deadline=DEADLINE) is None
        assert await group.enter(lease=last.lease, deadline=DEADLINE) is not None
        assert (await group.complete(_done(last))).accepted
        await group.commit()
        assert (await store.job(first.id)).output == "grouped"
        assert (await store.job(last.id)).output == "grouped"
        assert (await store.job(other.id)).status is JobStatus.RUNNING

    async def test_a_completion_that_commits_its_group_and_begins_the_next(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        await store.seed(*(store.new_job() for _ in range(4)))
        first, second, *sides = await store.acquire(limit=4)
        group = await state_adapter.open_atomic_group()
        tx = await group.enter(lease=first.lease, deadline=DEADLINE)
        assert tx is not None
        await state_adapter.complete(tx, completions=[_done(sides[0], '"side"')])
        done = await group.complete(_done(first), then=_next(second), commit=True)
        assert done.accepted
        assert group.members == 0  # a new group
        # Committed with the completion: visible at once.
        assert (await store.job(first.id)).output == "grouped"
        assert (await store.job(sides[0].id)).output == "side"
        tx = await group.enter(lease=second.lease, deadline=DEADLINE)
        assert tx is not None
        await state_adapter.complete(tx, completions=[_done(sides[1], '"side"')])
        assert (await group.complete(_done(second))).accepted
        assert group.members == 1
        assert (await store.job(second.id)).status is JobStatus.RUNNING
        await group.commit()
        assert (await store.job(second.id)).output == "grouped"
        assert (await store.job(sides[1].id)).output == "side"

    async def test_a_completion_that_commits_its_group_with_no_one_next(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        await store.seed(store.new_job(), store.new_job())
        first, second = await store.acquire(limit=2)
        group = await state_adapter.open_atomic_group()
        assert await group.enter(lease=first.lease, deadline=DEADLINE) is not None
        assert (await group.complete(_done(first))).accepted
        assert await group.enter(lease=second.lease, deadline=DEADLINE) is not None
        assert (await group.complete(_done(second), commit=True)).accepted
        for job in (first, second):
            assert (await store.job(job.id)).output == "grouped"

    async def test_a_refused_completion_commits_nothing_of_its_group(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        """The completion that was to commit its group is refused: it is undone, the
        group stays open with what it kept, for the caller to commit."""
        await store.seed(*(store.new_job() for _ in range(4)))
        kept, spoiled, named, side = await store.acquire(limit=4)
        group = await state_adapter.open_atomic_group()
        assert await group.enter(lease=kept.lease, deadline=DEADLINE) is not None
        assert (await group.complete(_done(kept))).accepted
        tx = await group.enter(lease=spoiled.lease, deadline=DEADLINE)
        assert tx is not None
        await state_adapter.complete(tx, completions=[_done(side, '"side"')])
        await state_adapter.complete(tx, completions=[_done(spoiled, '"early"')])
        refused = await group.complete(_done(spoiled), then=_next(named), commit=True)
        assert not refused.accepted
        assert group.members == 1
        assert (await store.job(kept.id)).status is JobStatus.RUNNING  # not committed
        assert await group.enter(lease=named.lease, deadline=DEADLINE) is not None
        assert (await group.complete(_done(named))).accepted
        await group.commit()
        for job in (kept, named):
            assert (await store.job(job.id)).output == "grouped"
        for untouched in (spoiled, side):
            assert (await store.job(untouched.id)).status is JobStatus.RUNNING

    async def test_members_that_end_chains_others_wait_on_make_them_ready(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        """A chain's dependants are settled whether its member's completion names the
        next member or commits the group: in the group's transaction, or after its
        commit."""
        members = [store.new_job() for _ in range(3)]
        await store.seed(*members)
        waiting = [store.new_job(BETA, queue=f"q{i}", blockers=[members[i].id]) for i in range(2)]
        await store.seed(*waiting)
        first, second, third = await store.acquire(limit=3)
        assert [first.id, second.id] == [members[0].id, members[1].id]
        group = await state_adapter.open_atomic_group()
        assert await group.enter(lease=first.lease, deadline=DEADLINE) is not None
        done = await group.complete(_done(first), then=_next(second))
        assert done.accepted
        assert done.ready_queues == ("q0",)
        assert await group.enter(lease=second.lease, deadline=DEADLINE) is not None
        done = await group.complete(_done(second), then=_next(third), commit=True)
        assert done.accepted
        assert done.ready_queues == ("q1",)
        for dependant in waiting:
            assert (await store.job(dependant.id)).status is JobStatus.PENDING
        assert await group.enter(lease=third.lease, deadline=DEADLINE) is not None
        assert (await group.complete(_done(third))).accepted
        await group.commit()
        assert (await store.job(third.id)).output == "grouped"

    async def test_members_that_end_their_chains_complete_them_first_job_or_later(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        """A member ending a one-job chain, one ending a longer chain (its job not the
        chain's first), and a one-job chain's again, each entered ahead of the next:
        every chain completes with its last job's output."""
        following = await store.handed_on()
        first_new, last_new = store.new_job(), store.new_job()
        await store.seed(first_new, last_new)
        held = {job.id: job for job in await store.acquire(limit=3)}
        first, later, last = (held[new.id] for new in (first_new, following, last_new))
        assert later.chain_index == 1
        members = [first, later, last]
        group = await state_adapter.open_atomic_group()
        assert await group.enter(lease=first.lease, deadline=DEADLINE) is not None
        for job, after in zip(members, [*members[1:], None], strict=True):
            if job is not first:
                assert await group.enter(lease=job.lease, deadline=DEADLINE) is not None
            then = None if after is None else _next(after)
            done = await group.complete(_done(job, f'"{job.chain_index}"'), then=then)
            assert done.accepted
            assert done.chain_completed
        await group.commit()
        for job in members:
            chain = await store.chain(job.chain_id)
            assert chain.status is ChainStatus.COMPLETED, job
            assert chain.output == str(job.chain_index)
            assert chain.completed_at is not None
            assert (await store.job(job.id)).status is JobStatus.COMPLETED
