"""A worker's turn: complete the finished batch and lease the next in one call.

Role exercised: ``WorkerStore`` (``complete_and_acquire``).
"""

from __future__ import annotations

import json

import pytest

from pgwork.adapters.state import AcquiredJob, BatchedTurns, ChainBlockers, Completion
from pgwork.records import JobStatus
from pgwork.testing.conformance._harness import ALPHA, BETA, StateHarness, StateSuiteBase, requires
from pgwork.testing.conformance._rollback import rolled_back


def _done(held: AcquiredJob, output: object = None) -> Completion:
    return Completion(held.id, held.lease_token, json.dumps(output))


@requires(BatchedTurns)
class TurnConformance(StateSuiteBase):
    async def test_turn_completes_the_batch_and_leases_the_next_jobs(
        self, store: StateHarness
    ) -> None:
        first = [store.new_job(input={"n": n}) for n in range(3)]
        await store.seed(*first)
        held = await store.acquire(limit=3)
        later = [store.new_job(input={"n": n}) for n in range(3, 5)]
        await store.seed(*later)

        results, acquired = await store.adapter.complete_and_acquire(
            completions=[_done(h, {"ok": h.input["n"]}) for h in held],
            worker_id="worker-a",
            leases={ALPHA: store.lease},
            queues=["default"],
            limit=5,
        )
        assert [r.job_id for r in results] == [h.id for h in held]
        assert all(r.accepted and r.chain_completed for r in results)
        assert sorted(j.id for j in acquired) == sorted(j.id for j in later)
        for h in held:
            job = await store.job(h.id)
            assert (job.status, job.output) == (JobStatus.COMPLETED, {"ok": h.input["n"]})
            assert (await store.chain(h.id)).status.value == "completed"
        for j in acquired:
            assert (await store.job(j.id)).status is JobStatus.RUNNING
            assert j.attempt == 1

    async def test_turn_defers_a_completion_whose_row_another_transaction_holds(
        self, store: StateHarness
    ) -> None:
        """The turn never waits on a row a caller holds (here an uncommitted cancel):
        that completion is deferred, the rest written and the next jobs leased."""
        await store.seed(*(store.new_job(input={"n": n}) for n in range(2)))
        held, free = await store.acquire(limit=2)
        await store.seed(store.new_job(input={"n": 2}))
        async with rolled_back(store.adapter.transaction()) as tx:
            await store.adapter.cancel_chains(tx, chain_ids=[held.id])
            results, acquired = await store.adapter.complete_and_acquire(
                completions=[_done(held), _done(free)],
                worker_id="worker-a",
                leases={ALPHA: store.lease},
                queues=["default"],
                limit=5,
            )
            assert [(r.accepted, r.deferred) for r in results] == [(False, True), (True, False)]
            assert len(acquired) == 1
        assert (await store.job(held.id)).status is JobStatus.RUNNING

    async def test_turn_leases_like_acquire_by_queue_order_limit_and_type(
        self, store: StateHarness
    ) -> None:
        low, high = store.new_job(queue="low"), store.new_job(queue="high", priority=5)
        other = store.new_job(BETA, queue="high")
        await store.seed(low, high, other)
        _, acquired = await store.adapter.complete_and_acquire(
            completions=[],
            worker_id="worker-a",
            leases={ALPHA: store.lease},
            queues=["high", "low"],
            limit=1,
        )
        assert [j.id for j in acquired] == [high.id]
        _, anywhere = await store.adapter.complete_and_acquire(
            completions=[],
            worker_id="worker-a",
            leases={ALPHA: store.lease, BETA: store.lease},
            queues=None,
            limit=5,
        )
        assert sorted(j.id for j in anywhere) == sorted([low.id, other.id])

    async def test_turn_with_a_stale_token_refuses_that_completion_only(
        self, store: StateHarness
    ) -> None:
        mine, stolen = store.new_job(), store.new_job()
        await store.seed(mine, stolen)
        held = {h.id: h for h in await store.acquire(limit=2)}
        assert await store.adapter.release(leases=[held[stolen.id].lease]) == 1
        retaken = await store.acquire_one(worker="worker-b")
        assert retaken.id == stolen.id

        results, acquired = await store.adapter.complete_and_acquire(
            completions=[_done(held[mine.id]), _done(held[stolen.id])],
            worker_id="worker-a",
            leases={ALPHA: store.lease},
            queues=["default"],
            limit=5,
        )
        assert [(r.job_id, r.accepted) for r in results] == [(mine.id, True), (stolen.id, False)]
        assert acquired == []
        assert (await store.job(stolen.id)).status is JobStatus.RUNNING
        assert (await store.job(stolen.id)).leased_by == "worker-b"

    async def test_turn_without_room_only_completes(self, store: StateHarness) -> None:
        done_job, waiting = store.new_job(), store.new_job()
        await store.seed(done_job)
        held = await store.acquire_one()
        await store.seed(waiting)
        results, acquired = await store.adapter.complete_and_acquire(
            completions=[_done(held)],
            worker_id="worker-a",
            leases={ALPHA: store.lease},
            queues=["default"],
            limit=0,
        )
        assert [r.accepted for r in results] == [True]
        assert acquired == []
        assert (await store.job(waiting.id)).status is JobStatus.PENDING

    @requires(ChainBlockers)
    async def test_turn_reports_unblocked_dependants_and_awaited_chains(
        self, store: StateHarness
    ) -> None:
        blocker = store.new_job(queue="work")
        await store.seed(blocker)
        dependant = store.new_job(BETA, queue="merge", blockers=[blocker.id])
        await store.seed(dependant)
        awaited = store.new_job(queue="work")
        await store.seed(awaited)
        await store.adapter.mark_chain_awaited(chain_id=awaited.id)
        held = {h.id: h for h in await store.acquire(limit=2, queues=["work"])}

        results, _ = await store.adapter.complete_and_acquire(
            completions=[_done(held[blocker.id]), _done(held[awaited.id])],
            worker_id="worker-a",
            leases={ALPHA: store.lease},
            queues=["work"],
            limit=5,
        )
        by_id = {r.job_id: r for r in results}
        assert by_id[blocker.id].ready_queues == ("merge",)
        assert by_id[awaited.id].chain_awaited
        assert not by_id[blocker.id].chain_awaited
        assert (await store.job(dependant.id)).status is JobStatus.PENDING

    async def test_turn_refuses_a_completion_with_a_continuation_and_changes_nothing(
        self, store: StateHarness
    ) -> None:
        job, waiting = store.new_job(), store.new_job()
        await store.seed(job)
        held = await store.acquire_one()
        await store.seed(waiting)
        follow = store.continuation(held)
        with pytest.raises(ValueError, match="continuation"):
            await store.adapter.complete_and_acquire(
                completions=[Completion(held.id, held.lease_token, "null", follow)],
                worker_id="worker-a",
                leases={ALPHA: store.lease},
                queues=["default"],
                limit=5,
            )
        assert (await store.job(job.id)).status is JobStatus.RUNNING
        assert (await store.job(waiting.id)).status is JobStatus.PENDING
        assert not await store.exists(follow.id)
