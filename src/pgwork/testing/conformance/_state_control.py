"""Steering chains from outside a worker: resolve ids to chains, cancel, retry failed
jobs, trigger scheduled ones, and flag a chain as awaited.

Role exercised: ``ControlStore``, with ``ReadStore.chains_of`` and
``EnqueueStore.mark_chain_awaited``.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from pgwork.adapters.state import ChainBlockers, ChainRef, Completion, Failure
from pgwork.records import AttemptError, ChainStatus, JobStatus
from pgwork.testing.conformance._harness import ALPHA, BETA, StateHarness, StateSuiteBase, requires
from pgwork.testing.conformance._rollback import rolled_back

BOOM = AttemptError(type="RuntimeError", message="cancelled under it")


class ControlConformance(StateSuiteBase):
    async def test_chains_of_resolves_chain_and_job_ids_to_their_chains(
        self, store: StateHarness
    ) -> None:
        first = store.new_job()
        await store.seed(first)
        root = await store.acquire_one()
        follow = store.continuation(root)
        await store.adapter.complete(
            None, completions=[Completion(root.id, root.lease_token, "1", follow)]
        )
        await store.acquire_one(BETA, worker="worker-b")
        ended = store.new_job(queue="other")
        await store.seed(ended)
        await store.finish(ended.id)
        ghost = uuid.uuid4()

        refs = await store.adapter.chains_of(None, ids=[follow.id, ghost, first.id, ended.id])
        found = {ref.id: ref for ref in refs}
        assert len(refs) == 4
        active, done = ChainStatus.ACTIVE, ChainStatus.COMPLETED
        assert found[follow.id] == ChainRef(
            follow.id, first.id, active, JobStatus.RUNNING, "worker-b"
        )
        assert found[first.id] == ChainRef(first.id, first.id, active, JobStatus.COMPLETED, None)
        assert found[ended.id] == ChainRef(ended.id, ended.id, done, JobStatus.COMPLETED, None)
        assert found[ghost] == ChainRef(ghost, None, None, None, None)
        assert await store.adapter.chains_of(None, ids=[]) == []

    @requires(ChainBlockers)
    async def test_cancel_chains_cancels_every_unfinished_job_and_skips_ended_chains(
        self, store: StateHarness
    ) -> None:
        long = store.new_job()
        await store.seed(long)
        root = await store.acquire_one()
        follow = store.continuation(root)
        await store.adapter.complete(
            None, completions=[Completion(root.id, root.lease_token, "1", follow)]
        )
        waiting = store.new_job(queue="later", run_after=timedelta(hours=1))
        ended = store.new_job(queue="ended")
        await store.seed(waiting, ended)
        await store.finish(ended.id)
        blocked = store.new_job(BETA, queue="merge", blockers=[waiting.id])
        await store.seed(blocked)

        wanted = [long.id, waiting.id, ended.id, blocked.id]
        async with rolled_back(store.adapter.transaction()) as tx:
            await store.adapter.cancel_chains(tx, chain_ids=wanted)
        assert (await store.chain(long.id)).status is ChainStatus.ACTIVE
        async with store.adapter.transaction() as tx:
            cancelled, _ = await store.adapter.cancel_chains(tx, chain_ids=wanted)
            assert (await store.job(follow.id)).status is JobStatus.PENDING
        assert {c.chain_id: set(c.job_ids) for c in cancelled} == {
            long.id: {follow.id},
            waiting.id: {waiting.id},
            blocked.id: {blocked.id},
        }
        for chain_id in (long.id, waiting.id, blocked.id):
            chain = await store.chain(chain_id)
            assert chain.status is ChainStatus.CANCELLED
            assert chain.completed_at is not None
            assert chain.current_job.status is JobStatus.CANCELLED
            assert chain.current_job.completed_at is not None
        assert (await store.job(root.id)).status is JobStatus.COMPLETED
        assert (await store.chain(ended.id)).status is ChainStatus.COMPLETED
        assert await store.acquire(queues=None) == []
        async with store.adapter.transaction() as tx:
            again, _ = await store.adapter.cancel_chains(tx, chain_ids=wanted)
        assert again == []

    async def test_a_cancelled_running_job_keeps_no_lease(self, store: StateHarness) -> None:
        new = store.new_job()
        await store.seed(new)
        held = await store.acquire_one()
        async with store.adapter.transaction() as tx:
            [cancelled], _ = await store.adapter.cancel_chains(tx, chain_ids=[new.id])
        assert cancelled.job_ids == (held.id,)

        [renewal] = await store.adapter.renew(leases=[held.lease], duration={held.id: self.lease})
        assert not renewal.renewed
        assert renewal.leased_until is None
        assert renewal.status is JobStatus.CANCELLED
        [completion] = await store.adapter.complete(
            None, completions=[Completion(held.id, held.lease_token, '"late"')]
        )
        assert not completion.accepted
        failure = Failure(held.id, held.lease_token, BOOM, timedelta(seconds=1))
        assert await store.adapter.fail(None, failures=[failure]) == [False]
        assert await store.adapter.release(leases=[held.lease]) == 0
        job = await store.job(held.id)
        assert job.status is JobStatus.CANCELLED
        assert job.leased_by is None
        assert job.leased_until is None
        assert job.output is None
        assert (
            await store.adapter.reap(
                type_names=[ALPHA], exclude_worker="reaper", limit=10, dead_workers=["worker-a"]
            )
            == []
        )

    async def test_retry_failed_gives_fresh_attempts_and_reopens_the_chain(
        self, store: StateHarness
    ) -> None:
        new = store.new_job(queue="work")
        await store.seed(new)
        root = await store.acquire_one(queues=["work"])
        follow = store.continuation(root, max_attempts=2)
        await store.adapter.complete(
            None, completions=[Completion(root.id, root.lease_token, "1", follow)]
        )
        for _ in range(2):
            held = await store.acquire_one(BETA, queues=["work"])
            retry = None if held.attempt == 2 else timedelta(0)
            await store.adapter.fail(
                None, failures=[Failure(held.id, held.lease_token, BOOM, retry)]
            )
        assert (await store.chain(new.id)).status is ChainStatus.FAILED
        pending = store.new_job(queue="work")
        await store.seed(pending)

        async with store.adapter.transaction() as tx:
            retried = await store.adapter.retry_failed(
                tx, job_ids=[follow.id, pending.id, root.id, uuid.uuid4()], front=False
            )
        assert retried == [(follow.id, "work")]
        job = await store.job(follow.id)
        assert job.status is JobStatus.PENDING
        assert job.attempt == 0
        assert job.completed_at is None
        chain = await store.chain(new.id)
        assert chain.status is ChainStatus.ACTIVE
        assert chain.completed_at is None
        assert (await store.job(pending.id)).status is JobStatus.PENDING
        assert (await store.job(root.id)).status is JobStatus.COMPLETED

        again = await store.acquire_one(BETA, queues=["work"])
        assert again.id == follow.id
        assert again.attempt == 1
        assert (await store.finish(follow.id, "second time")).chain_completed
        assert (await store.chain(new.id)).status is ChainStatus.COMPLETED

    async def test_retry_in_front_runs_before_older_pending_jobs(self, store: StateHarness) -> None:
        front, back = store.new_job(max_attempts=1), store.new_job(max_attempts=1)
        await store.seed(front, back)
        for _ in range(2):
            held = await store.acquire_one()
            await store.adapter.fail(
                None, failures=[Failure(held.id, held.lease_token, BOOM, None)]
            )
        waiting = [store.new_job() for _ in range(2)]
        await store.seed(waiting[0])
        await store.seed(waiting[1])

        async with store.adapter.transaction() as tx:
            assert await store.adapter.retry_failed(tx, job_ids=[back.id], front=False) == [
                (back.id, "default")
            ]
            assert await store.adapter.retry_failed(tx, job_ids=[front.id], front=True) == [
                (front.id, "default")
            ]
        order = [(await store.acquire_one()).id for _ in range(4)]
        assert order == [front.id, waiting[0].id, waiting[1].id, back.id]

    async def test_trigger_makes_a_scheduled_job_due_now_and_returns_its_queue(
        self, store: StateHarness
    ) -> None:
        later = store.new_job(queue="later", run_after=timedelta(hours=1))
        due = store.new_job(queue="due")
        await store.seed(later, due)
        assert await store.acquire(queues=["later"]) == []
        async with rolled_back(store.adapter.transaction()) as tx:
            assert await store.adapter.trigger(tx, job_ids=[later.id]) == ["later"]
        assert await store.acquire(queues=["later"]) == []

        async with store.adapter.transaction() as tx:
            queues = await store.adapter.trigger(tx, job_ids=[later.id, due.id, uuid.uuid4()])
        assert queues == ["later"]
        assert (await store.acquire_one(queues=["later"])).id == later.id
        async with store.adapter.transaction() as tx:
            assert await store.adapter.trigger(tx, job_ids=[later.id, due.id]) == []

    async def test_completion_reports_an_awaited_chain_only_when_it_ends(
        self, store: StateHarness
    ) -> None:
        watched, unwatched = store.new_job(queue="w"), store.new_job(queue="u")
        await store.seed(watched, unwatched)
        await store.adapter.mark_chain_awaited(chain_id=watched.id)
        await store.adapter.mark_chain_awaited(chain_id=watched.id)
        await store.adapter.mark_chain_awaited(chain_id=uuid.uuid4())

        follow = store.continuation(await store.job(watched.id))
        step = await store.finish(watched.id, "1", continuation=follow)
        assert not step.chain_completed
        assert not step.chain_awaited
        end = await store.finish(follow.id, "2")
        assert end.chain_completed
        assert end.chain_awaited
        assert not (await store.finish(unwatched.id, "3")).chain_awaited

        # Flagged after the chain ended: nothing left to report, nothing raised.
        await store.adapter.mark_chain_awaited(chain_id=unwatched.id)
        assert (await store.chain(unwatched.id)).status is ChainStatus.COMPLETED
