"""Groups of atomic attempts: several members in one transaction, each in a savepoint.

A member's own writes stand in for a handler's: it completes a *side* job in its
transaction; one that only reads its own job through its handle stands for a handler
that uses its transaction without writing; one that never uses its handle wrote
nothing. Either way ``complete`` writes the member's completion at once, in its
savepoint (opened then for a member that used nothing), and returns its result. Kept
members commit together and only on ``commit``; an undone or refused member leaves
nothing, and the rows it wrote are free at once. A member's job is fenced by its lease
when its outcome is written, not locked while it runs.

Role exercised: ``WorkerStore`` (``open_atomic_group``).
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import anyio
import pytest

from pgwork.adapters.state import (
    AcquiredJob,
    AtomicGroupCommit,
    ChainBlockers,
    Completion,
    Failure,
    Lease,
    StateAdapter,
    TransactionHandle,
)
from pgwork.records import AttemptError, ChainStatus, JobStatus
from pgwork.testing.conformance._harness import BETA, StateHarness, StateSuiteBase, requires

BOOM = AttemptError(type="RuntimeError", message="member failed")
DEADLINE = timedelta(seconds=30)
# An output that must travel as a value, quotes and backslashes included.
TRICKY = '"it\'s \\\\ a \\"quote\\"; COMMIT; -- \u00e9\u2603"'
TRICKY_VALUE = 'it\'s \\ a "quote"; COMMIT; -- \u00e9\u2603'


def _done(job: AcquiredJob, output: str = '"grouped"') -> Completion:
    return Completion(job.id, job.lease_token, output)


def _failed(job: AcquiredJob) -> Failure:
    return Failure(job.id, job.lease_token, BOOM, None)


async def _use(state_adapter: StateAdapter, tx: TransactionHandle, job: AcquiredJob) -> None:
    """Use the member's transaction without writing: read its own job through it."""
    [read] = await state_adapter.get_jobs(tx, job_ids=[job.id])
    assert read.status is JobStatus.RUNNING


@requires(AtomicGroupCommit)
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
            await state_adapter.complete(tx, completions=[_done(side, '"side"')])
            done = await group.complete(_done(job))
            assert done.accepted
        assert group.members == 3
        for job in held:  # nothing is visible before the commit
            assert (await store.job(job.id)).status is JobStatus.RUNNING
        await group.commit()
        for job in jobs:
            assert (await store.job(job.id)).output == "grouped"
        for side in sides:
            assert (await store.job(side.id)).output == "side"

    async def test_members_that_write_nothing_have_their_completions_written_in_the_group(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        """Members that never use their transaction: ``complete`` writes each one's
        completion at once, in the group's transaction (opened then), and returns its
        result; the next member's handle sees the jobs completed, nothing shows outside
        before the commit, and the commit makes them durable. (Controls: a completion
        left unwritten: the next member reads the jobs running; one written outside the
        group's transaction: it shows before the commit; a commit that does not
        commit: the jobs stay running.)"""
        await store.seed(*(store.new_job() for _ in range(4)))
        *jobs, reader = await store.acquire(limit=4)
        outputs = [TRICKY, '{"n": 2}', '"grouped"']
        group = await state_adapter.open_atomic_group()
        for job, output in zip(jobs, outputs, strict=True):
            await group.enter(lease=job.lease, deadline=DEADLINE)
            done = await group.complete(_done(job, output))
            assert (done.job_id, done.accepted, done.chain_completed) == (job.id, True, True)
        assert group.members == 3
        tx = await group.enter(lease=reader.lease, deadline=DEADLINE)
        seen = await state_adapter.get_jobs(tx, job_ids=[job.id for job in jobs])
        assert {job.id: (job.status, job.output) for job in seen} == {
            job.id: (JobStatus.COMPLETED, value)
            for job, value in zip(jobs, [TRICKY_VALUE, {"n": 2}, "grouped"], strict=True)
        }
        await group.undo()
        for job in jobs:  # nothing is visible outside before the commit
            stored = await store.job(job.id)
            assert stored.status is JobStatus.RUNNING
            assert stored.output is None
        await group.commit()
        assert [(await store.job(job.id)).output for job in jobs] == [
            TRICKY_VALUE,
            {"n": 2},
            "grouped",
        ]
        for job in jobs:
            assert (await store.job(job.id)).status is JobStatus.COMPLETED

    async def test_a_member_that_used_its_transaction_has_its_completion_written_at_once(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        """A member that wrote has its completion written in its savepoint as it is
        kept: the result comes back at once, and the group's transaction (the next
        member's handle) sees the job completed while nothing shows outside before the
        commit. Members that wrote nothing before and after it are kept alike, and all
        commit together. (Control: a completion left unwritten: the next member reads
        the writer's job running.)"""
        await store.seed(*(store.new_job() for _ in range(5)))
        quiet, writer, reader, last, side = await store.acquire(limit=5)
        group = await state_adapter.open_atomic_group()
        await group.enter(lease=quiet.lease, deadline=DEADLINE)
        assert (await group.complete(_done(quiet))).accepted
        tx = await group.enter(lease=writer.lease, deadline=DEADLINE)
        await state_adapter.complete(tx, completions=[_done(side, '"side"')])
        done = await group.complete(_done(writer, TRICKY))
        assert done.accepted
        assert done.chain_completed
        tx = await group.enter(lease=reader.lease, deadline=DEADLINE)
        [seen] = await state_adapter.get_jobs(tx, job_ids=[writer.id])
        assert seen.status is JobStatus.COMPLETED
        assert seen.output == TRICKY_VALUE
        done = await group.complete(_done(reader))
        assert done.accepted
        await group.enter(lease=last.lease, deadline=DEADLINE)
        assert (await group.complete(_done(last))).accepted
        assert group.members == 4
        for job in (quiet, writer, reader, last, side):  # nothing is visible outside
            assert (await store.job(job.id)).status is JobStatus.RUNNING
        await group.commit()
        assert (await store.job(writer.id)).output == TRICKY_VALUE
        for job in (quiet, reader, last):
            assert (await store.job(job.id)).output == "grouped"
        assert (await store.job(side.id)).output == "side"

    async def test_an_undone_member_leaves_nothing_and_frees_what_it_wrote_at_once(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        """(Control: an undo that keeps what the member wrote: its side job's
        completion commits with the group, and its row stays locked until then.)"""
        await store.seed(*(store.new_job() for _ in range(6)))
        first, failing, last, *sides = await store.acquire(limit=6)
        group = await state_adapter.open_atomic_group()
        for job, side in zip((first, failing, last), sides, strict=True):
            tx = await group.enter(lease=job.lease, deadline=DEADLINE)
            await state_adapter.complete(tx, completions=[_done(side, '"side"')])
            if job is failing:
                await group.undo()
            else:
                done = await group.complete(_done(job))
                assert done.accepted
        assert group.members == 2
        # What it wrote is gone, its locks with it: the side job can be completed on
        # its own while the group is still open (bounded: a store that kept the lock
        # until the group's commit fails here).
        with anyio.fail_after(10):
            [alone] = await state_adapter.complete(None, completions=[_done(sides[1], '"alone"')])
        assert alone.accepted
        # And the member's job is its worker's to settle on its own.
        with anyio.fail_after(10):
            assert await state_adapter.fail(None, failures=[_failed(failing)]) == [True]
        await group.commit()
        assert (await store.job(first.id)).output == "grouped"
        assert (await store.job(last.id)).output == "grouped"
        assert (await store.job(failing.id)).status is JobStatus.FAILED
        assert (await store.job(sides[0].id)).output == "side"
        assert (await store.job(sides[1].id)).output == "alone"
        assert (await store.job(sides[2].id)).output == "side"

    async def test_a_failed_member_writes_its_failure_after_undo_and_commits_with_the_group(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        """A member whose handler failed is undone, then writes its failure through its
        handle and is kept: the failure commits with the group, and nothing the handler
        wrote stays. The first such member had used nothing before failing, the second
        had written. (Control: an undo after which the member's next use opens no
        savepoint of its own: the first member's failure, written outside the group's
        transaction, shows before the commit.)"""
        await store.seed(*(store.new_job() for _ in range(4)))
        quiet, wrote, kept, side = await store.acquire(limit=4)
        group = await state_adapter.open_atomic_group()
        tx = await group.enter(lease=quiet.lease, deadline=DEADLINE)
        await group.undo()
        assert await state_adapter.fail(tx, failures=[_failed(quiet)]) == [True]
        await group.keep()
        tx = await group.enter(lease=wrote.lease, deadline=DEADLINE)
        await state_adapter.complete(tx, completions=[_done(side, '"side"')])
        await group.undo()
        assert await state_adapter.fail(tx, failures=[_failed(wrote)]) == [True]
        await group.keep()
        await group.enter(lease=kept.lease, deadline=DEADLINE)
        assert (await group.complete(_done(kept))).accepted
        assert group.members == 3
        for job in (quiet, wrote, kept, side):  # nothing is visible before the commit
            assert (await store.job(job.id)).status is JobStatus.RUNNING
        await group.commit()
        for job in (quiet, wrote):
            stored = await store.job(job.id)
            assert stored.status is JobStatus.FAILED
            assert stored.last_attempt_error == BOOM
            assert [(a.attempt, a.error) for a in stored.attempt_history] == [(1, BOOM)]
        assert (await store.job(kept.id)).output == "grouped"
        stored = await store.job(side.id)
        assert stored.status is JobStatus.RUNNING
        assert stored.output is None

    async def test_a_member_whose_lease_no_longer_holds_is_refused_and_leaves_nothing(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        """The handler ends its own job: the completion behind it is refused, and the
        member is rolled back with everything it wrote; the group goes on. (Control: a
        refusal not rolled back to the member's savepoint: the group's transaction
        stays aborted, and the next member cannot go on.)"""
        await store.seed(*(store.new_job() for _ in range(3)))
        spoiled, kept, side = await store.acquire(limit=3)
        group = await state_adapter.open_atomic_group()
        tx = await group.enter(lease=spoiled.lease, deadline=DEADLINE)
        await state_adapter.complete(tx, completions=[_done(side, '"side"')])
        await state_adapter.complete(tx, completions=[_done(spoiled, '"early"')])
        refused = await group.complete(_done(spoiled))
        assert not refused.accepted
        assert group.members == 0
        await group.enter(lease=kept.lease, deadline=DEADLINE)
        assert (await group.complete(_done(kept))).accepted
        assert group.members == 1
        await group.commit()
        assert (await store.job(kept.id)).output == "grouped"
        for untouched in (spoiled, side):
            stored = await store.job(untouched.id)
            assert stored.status is JobStatus.RUNNING
            assert stored.output is None

    async def test_members_that_wrote_nothing_are_refused_when_their_leases_no_longer_hold(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        """Members that never used their transaction are fenced by their leases too:
        one whose lease never held (another token; the group's first member, whose
        completion begins the group's transaction), one whose job was completed
        elsewhere while it ran, one whose lease ran out and was reaped while it ran:
        each is refused, is not counted, and changes nothing, and the other members
        commit all the same. (Controls: completions written without their fence: the
        stranger's is accepted; a refusal not rolled back to the member's savepoint:
        the group's transaction stays aborted, and the next member cannot go on.)"""
        await store.seed(*(store.new_job() for _ in range(6)))
        stranger, taken, writer, kept, side = await store.acquire(limit=5)
        reaped = await store.acquire_one(lease=self.short_lease)
        group = await state_adapter.open_atomic_group()
        await group.enter(lease=Lease(stranger.id, uuid.uuid4()), deadline=DEADLINE)
        refused = [await group.complete(Completion(stranger.id, uuid.uuid4(), '"grouped"'))]
        await group.enter(lease=taken.lease, deadline=DEADLINE)
        # Meanwhile (its row is not locked): the job is completed elsewhere.
        with anyio.fail_after(10):
            [elsewhere] = await state_adapter.complete(
                None, completions=[_done(taken, '"elsewhere"')]
            )
        assert elsewhere.accepted
        refused.append(await group.complete(_done(taken)))
        await group.enter(lease=reaped.lease, deadline=DEADLINE)
        # Meanwhile: its lease runs out, and the job is taken back.
        taken_back = await store.reap_when_expired(timeout=self.expiry_timeout)
        assert [job.job_id for job in taken_back] == [reaped.id]
        refused.append(await group.complete(_done(reaped)))
        assert [(r.job_id, r.accepted) for r in refused] == [
            (stranger.id, False),
            (taken.id, False),
            (reaped.id, False),
        ]
        assert group.members == 0
        tx = await group.enter(lease=writer.lease, deadline=DEADLINE)
        await state_adapter.complete(tx, completions=[_done(side, '"side"')])
        assert (await group.complete(_done(writer))).accepted
        await group.enter(lease=kept.lease, deadline=DEADLINE)
        assert (await group.complete(_done(kept))).accepted
        assert group.members == 2
        await group.commit()
        stored = await store.job(stranger.id)
        assert stored.status is JobStatus.RUNNING
        assert stored.output is None
        assert (await store.job(taken.id)).output == "elsewhere"
        stored = await store.job(reaped.id)
        assert stored.status is JobStatus.PENDING
        assert stored.output is None
        for job in (writer, kept):
            assert (await store.job(job.id)).output == "grouped"
        assert (await store.job(side.id)).output == "side"

    async def test_a_kept_member_with_its_own_outcome_commits_with_the_group(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        await store.seed(store.new_job(), store.new_job())
        job, side = await store.acquire(limit=2)
        group = await state_adapter.open_atomic_group()
        tx = await group.enter(lease=job.lease, deadline=DEADLINE)
        await state_adapter.complete(tx, completions=[_done(side, '"side"'), _done(job)])
        await group.keep()
        assert group.members == 1
        for held in (job, side):
            assert (await store.job(held.id)).status is JobStatus.RUNNING
        await group.commit()
        assert (await store.job(job.id)).output == "grouped"
        assert (await store.job(side.id)).output == "side"

    async def test_a_discarded_group_commits_nothing(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        """Discarding rolls back every kept member, one that wrote and one that only
        completed alike: every job is still running, its worker's to settle. (Control:
        a discard that commits the group's transaction: the members commit.)"""
        await store.seed(*(store.new_job() for _ in range(3)))
        writer, quiet, side = await store.acquire(limit=3)
        group = await state_adapter.open_atomic_group()
        tx = await group.enter(lease=writer.lease, deadline=DEADLINE)
        await state_adapter.complete(tx, completions=[_done(side, '"side"')])
        assert (await group.complete(_done(writer))).accepted
        await group.enter(lease=quiet.lease, deadline=DEADLINE)
        assert (await group.complete(_done(quiet))).accepted
        await group.discard()
        for job in (writer, quiet, side):
            stored = await store.job(job.id)
            assert stored.status is JobStatus.RUNNING
            assert stored.output is None
            with anyio.fail_after(10):
                [again] = await state_adapter.complete(None, completions=[_done(job, '"later"')])
            assert again.accepted

    async def test_a_discarded_group_whose_members_wrote_nothing_commits_nothing(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        """No member used its transaction: their completions, written in the group's
        transaction as they were kept, are rolled back all the same, and their rows
        are free at once. (Control: completions of members that used nothing written
        outside the group's transaction: they commit as they are written.)"""
        await store.seed(store.new_job(), store.new_job())
        jobs = await store.acquire(limit=2)
        group = await state_adapter.open_atomic_group()
        for job in jobs:
            await group.enter(lease=job.lease, deadline=DEADLINE)
            assert (await group.complete(_done(job))).accepted
        await group.discard()
        for job in jobs:
            stored = await store.job(job.id)
            assert stored.status is JobStatus.RUNNING
            assert stored.output is None
            with anyio.fail_after(10):
                [again] = await state_adapter.complete(None, completions=[_done(job, '"later"')])
            assert again.accepted

    async def test_a_group_whose_connection_a_member_discarded_cannot_commit(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        await store.seed(*(store.new_job() for _ in range(4)))
        writer, quiet, abandoned, side = await store.acquire(limit=4)
        group = await state_adapter.open_atomic_group()
        tx = await group.enter(lease=writer.lease, deadline=DEADLINE)
        await state_adapter.complete(tx, completions=[_done(side, '"side"')])
        assert (await group.complete(_done(writer))).accepted
        await group.enter(lease=quiet.lease, deadline=DEADLINE)
        assert (await group.complete(_done(quiet))).accepted
        tx = await group.enter(lease=abandoned.lease, deadline=DEADLINE)
        await tx.discard()  # what the worker does to a handler it gave up on
        with pytest.raises(Exception):  # noqa: B017, PT011 - the adapter's own error type
            await group.commit()
        for job in (writer, quiet, side):  # nothing committed, nothing left locked
            with anyio.fail_after(10):
                [result] = await state_adapter.complete(None, completions=[_done(job, '"later"')])
            assert result.accepted

    @requires(ChainBlockers)
    async def test_members_that_end_chains_others_wait_on_make_them_ready(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        """A chain's dependants are settled in the group's transaction whether its
        member used its transaction or not, and a member undone after one that settled
        some does not take them with it; its result says where jobs became ready.
        (Control: dependants settled in the savepoint the next member goes on in: the
        undone member rolls them back, and the first dependant stays blocked.)"""
        members = [store.new_job() for _ in range(3)]
        await store.seed(*members)
        waiting = [store.new_job(BETA, queue=f"q{i}", blockers=[members[i].id]) for i in range(2)]
        await store.seed(*waiting)
        writer, quiet, undone = await store.acquire(limit=3)
        assert [writer.id, quiet.id] == [members[0].id, members[1].id]
        group = await state_adapter.open_atomic_group()
        tx = await group.enter(lease=writer.lease, deadline=DEADLINE)
        await _use(state_adapter, tx, writer)
        done = await group.complete(_done(writer))
        assert done.accepted
        assert done.ready_queues == ("q0",)
        tx = await group.enter(lease=undone.lease, deadline=DEADLINE)
        await _use(state_adapter, tx, undone)
        await group.undo()
        await group.enter(lease=quiet.lease, deadline=DEADLINE)
        done = await group.complete(_done(quiet))
        assert done.accepted
        assert done.ready_queues == ("q1",)
        for dependant in waiting:  # nothing is visible before the commit
            assert (await store.job(dependant.id)).status is JobStatus.BLOCKED
        await group.commit()
        for dependant in waiting:
            assert (await store.job(dependant.id)).status is JobStatus.PENDING
        assert (await store.job(undone.id)).status is JobStatus.RUNNING

    @requires(ChainBlockers)
    async def test_members_that_wrote_nothing_make_the_dependants_of_their_chains_ready(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        """No member used its transaction: their completions settle the dependants of
        the chains they end all the same, in the group's transaction, and each result
        says where jobs became ready. (Control: completions that leave the dependants
        of the chains they end unsettled: they stay blocked.)"""
        members = [store.new_job() for _ in range(2)]
        await store.seed(*members)
        waiting = [store.new_job(BETA, queue=f"q{i}", blockers=[members[i].id]) for i in range(2)]
        await store.seed(*waiting)
        jobs = await store.acquire(limit=2)
        group = await state_adapter.open_atomic_group()
        results = []
        for job in jobs:
            await group.enter(lease=job.lease, deadline=DEADLINE)
            results.append(await group.complete(_done(job)))
        assert all(r.accepted for r in results)
        assert {queue for r in results for queue in r.ready_queues} == {"q0", "q1"}
        for dependant in waiting:  # nothing is visible before the commit
            assert (await store.job(dependant.id)).status is JobStatus.BLOCKED
        await group.commit()
        for dependant in waiting:
            assert (await store.job(dependant.id)).status is JobStatus.PENDING

    @pytest.mark.parametrize("uses", [True, False], ids=["used-its-transaction", "wrote-nothing"])
    async def test_members_that_end_their_chains_complete_them_first_job_or_later(
        self, state_adapter: StateAdapter, store: StateHarness, uses: bool
    ) -> None:
        """A member ending a one-job chain, one ending a longer chain (its job not the
        chain's first), and a one-job chain's again: every chain completes with its
        last job's output, whether its member used its transaction or not."""
        following = await store.handed_on()
        first_new, last_new = store.new_job(), store.new_job()
        await store.seed(first_new, last_new)
        held = {job.id: job for job in await store.acquire(limit=3)}
        first, later, last = (held[new.id] for new in (first_new, following, last_new))
        assert later.chain_index == 1
        members = [first, later, last]
        group = await state_adapter.open_atomic_group()
        results = []
        for job in members:
            tx = await group.enter(lease=job.lease, deadline=DEADLINE)
            if uses:
                await _use(state_adapter, tx, job)
            results.append(await group.complete(_done(job, f'"{job.chain_index}"')))
        await group.commit()
        assert [r.job_id for r in results] == [job.id for job in members]
        for result in results:
            assert result.accepted
            assert result.chain_completed
        for job in members:
            chain = await store.chain(job.chain_id)
            assert chain.status is ChainStatus.COMPLETED, job
            assert chain.output == str(job.chain_index)
            assert chain.completed_at is not None
            assert (await store.job(job.id)).status is JobStatus.COMPLETED

    async def test_a_member_tells_whether_it_used_its_transaction_and_one_that_did_not_may_leave(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        """``used`` says whether the current member used its transaction, ``open``
        whether the group's transaction was begun. A member that did not use it may
        ``leave``: nothing of it is in the group (its job stays as it was, for its
        outcome to be written elsewhere), and the group goes on with the next member.
        (Control: a store that reports every member as having used its transaction:
        the worker could never let one go without a group.)"""
        await store.seed(store.new_job(), store.new_job())
        quiet, busy = await store.acquire(limit=2)
        group = await state_adapter.open_atomic_group()
        await group.enter(lease=quiet.lease, deadline=DEADLINE)
        assert not group.used
        assert not group.open
        group.leave()
        assert group.members == 0
        tx = await group.enter(lease=busy.lease, deadline=DEADLINE)
        assert not group.used
        await _use(state_adapter, tx, busy)
        assert group.used
        assert group.open
        done = await group.complete(_done(busy))
        assert done.accepted
        assert not group.used  # the next member's, not yet entered
        await group.commit()
        assert not group.open
        assert (await store.job(busy.id)).output == "grouped"
        stored = await store.job(quiet.id)
        assert stored.status is JobStatus.RUNNING
        assert stored.output is None
