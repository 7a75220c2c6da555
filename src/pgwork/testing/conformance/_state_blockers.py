"""Blockers: jobs that wait for other chains, and what those chains' ends do to them.

A blocked job here is a chain root inserted with ``NewJob.blockers`` (a later job of a
chain blocked on the children its parent started is ``_state_fan_out``'s). It stays
``blocked`` until its blocker chains end; then each edge's ``blocker_failure`` policy
decides: all completed (or ended, where the edge says ``unblock``) makes it pending; a
failed or cancelled blocker under ``fail`` / ``cancel`` ends it, and its chain, that
way — and that chain's own dependants follow.

Role exercised: ``EnqueueStore`` (blocked inserts) and ``WorkerStore``
(``resolve_dependants``, ``sweep_blocked``, ``blocker_outputs``).
"""

from __future__ import annotations

import uuid
from typing import Literal

import pytest

from pgwork.adapters.state import BlockerOutput, ChainBlockers, Completion, NewJob, Resolution
from pgwork.errors import ChainNotFoundError
from pgwork.records import ChainStatus, JobStatus
from pgwork.testing.conformance._cut_off import CutOffEnds
from pgwork.testing.conformance._harness import ALPHA, BETA, StateHarness, requires

Ending = Literal["failed", "cancelled", "reaped"]


@requires(ChainBlockers)
class BlockerConformance(CutOffEnds):
    async def test_job_with_active_blockers_is_inserted_blocked_and_not_acquirable(
        self, store: StateHarness
    ) -> None:
        first, second = store.new_job(queue="a"), store.new_job(queue="b")
        await store.seed(first, second)
        dependant = store.new_job(BETA, queue="merge", blockers=[first.id, second.id])
        [inserted] = await store.seed(dependant)
        assert inserted.status is JobStatus.BLOCKED
        assert not inserted.deduplicated
        job = await store.job(dependant.id)
        assert job.status is JobStatus.BLOCKED
        assert job.attempt == 0
        assert (await store.chain(dependant.id)).status is ChainStatus.ACTIVE
        assert await store.acquire(BETA, queues=None) == []

    async def test_blocking_on_unknown_chains_names_them_and_inserts_nothing(
        self, store: StateHarness
    ) -> None:
        real = store.new_job()
        await store.seed(real)
        held = await store.acquire_one()
        follow = store.continuation(held)
        await store.adapter.complete(
            None, completions=[Completion(held.id, held.lease_token, "1", follow)]
        )
        ghost = uuid.uuid4()
        # A job id that is not its chain's first names no chain either.
        dependant = store.new_job(BETA, blockers=[real.id, ghost, follow.id])
        bystander = store.new_job()
        with pytest.raises(ChainNotFoundError) as caught:
            async with store.adapter.transaction() as tx:
                await store.adapter.insert_jobs(tx, jobs=[bystander, dependant])
        assert set(caught.value.chain_ids) == {ghost, follow.id}
        assert not await store.exists(dependant.id)
        assert not await store.exists(bystander.id)

    async def test_blockers_that_already_ended_settle_the_new_job_at_once(
        self, store: StateHarness
    ) -> None:
        done, failed = store.new_job(queue="done"), store.new_job(queue="failed")
        await store.seed(done, failed)
        await store.finish(done.id, "ok")
        await store.fail_for_good(failed)
        ready = store.new_job(BETA, queue="merge", blockers=[done.id])
        doomed = store.new_job(BETA, queue="merge", blockers=[done.id, failed.id])
        let_through = store.new_job(
            BETA, queue="merge", blockers=[failed.id], blocker_failure="unblock"
        )
        inserted = await store.seed(ready, doomed, let_through)
        assert [i.status for i in inserted] == [
            JobStatus.PENDING,
            JobStatus.FAILED,
            JobStatus.PENDING,
        ]
        assert (await store.chain(doomed.id)).status is ChainStatus.FAILED
        taken = await store.acquire(BETA, queues=["merge"])
        assert {j.id for j in taken} == {ready.id, let_through.id}

    async def test_completing_the_last_blocker_makes_the_dependant_pending_and_reports_its_queue(
        self, store: StateHarness
    ) -> None:
        first, second = store.new_job(queue="a"), store.new_job(queue="b")
        await store.seed(first, second)
        dependant = store.new_job(BETA, queue="merge", blockers=[first.id, second.id])
        await store.seed(dependant)

        follow = store.continuation(await store.job(first.id), ALPHA)
        continued = await store.finish(first.id, "one", continuation=follow)
        assert continued.ready_queues == ("a",)
        ended = await store.finish(second.id, "two")
        assert ended.chain_completed
        assert ended.ready_queues == ()
        assert (await store.job(dependant.id)).status is JobStatus.BLOCKED

        last = await store.finish(follow.id, "three")
        assert last.chain_completed
        assert last.ready_queues == ("merge",)
        job = await store.job(dependant.id)
        assert job.status is JobStatus.PENDING
        assert job.attempt == 0
        held = await store.acquire_one(BETA, queues=["merge"])
        assert held.id == dependant.id

    @pytest.mark.parametrize("ending", ["failed", "cancelled", "reaped"])
    async def test_an_ended_blocker_applies_each_dependants_policy(
        self, store: StateHarness, ending: Ending
    ) -> None:
        blocker = store.new_job(queue="source", max_attempts=1)
        await store.seed(blocker)
        on_fail = store.new_job(BETA, queue="merge", blockers=[blocker.id])
        on_cancel = store.new_job(
            BETA, queue="merge", blockers=[blocker.id], blocker_failure="cancel"
        )
        on_unblock = store.new_job(
            BETA, queue="merge", blockers=[blocker.id], blocker_failure="unblock"
        )
        await store.seed(on_fail, on_cancel, on_unblock)

        await self._end(store, blocker, ending)
        ended_as = ChainStatus.CANCELLED if ending == "cancelled" else ChainStatus.FAILED
        assert (await store.chain(blocker.id)).status is ended_as

        failed = await store.job(on_fail.id)
        assert failed.status is JobStatus.FAILED
        assert failed.completed_at is not None
        assert failed.last_attempt_error is not None
        assert str(blocker.id) in failed.last_attempt_error.message
        assert (await store.chain(on_fail.id)).status is ChainStatus.FAILED
        cancelled = await store.job(on_cancel.id)
        assert cancelled.status is JobStatus.CANCELLED
        assert cancelled.completed_at is not None
        assert (await store.chain(on_cancel.id)).status is ChainStatus.CANCELLED
        assert (await store.job(on_unblock.id)).status is JobStatus.PENDING
        assert (await store.chain(on_unblock.id)).status is ChainStatus.ACTIVE

        held = await store.acquire_one(BETA, queues=["merge"])
        assert held.id == on_unblock.id
        assert await store.adapter.blocker_outputs(None, job_id=on_unblock.id) == [
            BlockerOutput(chain_id=blocker.id, status=ended_as, type_name=ALPHA, output=None)
        ]

    async def _end(self, store: StateHarness, blocker: NewJob, ending: Ending) -> None:
        if ending == "failed":
            await store.fail_for_good(blocker)
        elif ending == "cancelled":
            async with store.adapter.transaction() as tx:
                await store.adapter.cancel_chains(tx, chain_ids=[blocker.id])
        else:
            await store.acquire_one(queues=[blocker.queue], lease=self.short_lease)
            [reaped] = await store.reap_when_expired(timeout=self.expiry_timeout)
            assert reaped.status is JobStatus.FAILED

    async def test_fail_ends_a_dependant_at_once_but_unblock_waits_for_every_blocker(
        self, store: StateHarness
    ) -> None:
        failing, slow = store.new_job(queue="failing"), store.new_job(queue="slow")
        await store.seed(failing, slow)
        strict = store.new_job(BETA, queue="merge", blockers=[failing.id, slow.id])
        lenient = store.new_job(
            BETA, queue="merge", blockers=[failing.id, slow.id], blocker_failure="unblock"
        )
        await store.seed(strict, lenient)
        await store.fail_for_good(failing)
        assert (await store.job(strict.id)).status is JobStatus.FAILED
        assert (await store.job(lenient.id)).status is JobStatus.BLOCKED
        result = await store.finish(slow.id, "late")
        assert result.ready_queues == ("merge",)
        assert (await store.job(lenient.id)).status is JobStatus.PENDING

    async def test_blocker_outputs_follow_declaration_order_with_each_chains_final_output(
        self, store: StateHarness
    ) -> None:
        direct, continued, running = (store.new_job(queue=q) for q in ("d", "c", "r"))
        await store.seed(direct, continued, running)
        dependant = store.new_job(
            BETA, queue="merge", blockers=[continued.id, direct.id, running.id]
        )
        await store.seed(dependant)
        follow = store.continuation(await store.job(continued.id), BETA)
        await store.finish(continued.id, "first step", continuation=follow)
        await store.finish(follow.id, {"final": [1, 2]})
        await store.finish(direct.id, {"direct": True})

        outputs = await store.adapter.blocker_outputs(None, job_id=dependant.id)
        assert outputs == [
            BlockerOutput(continued.id, ChainStatus.COMPLETED, BETA, {"final": [1, 2]}),
            BlockerOutput(direct.id, ChainStatus.COMPLETED, ALPHA, {"direct": True}),
            # Still running: not met (the dependant is still blocked on it).
            BlockerOutput(running.id, ChainStatus.ACTIVE, ALPHA, None, met=False),
        ]
        assert await store.adapter.blocker_outputs(None, job_id=direct.id) == []

    async def test_a_dependant_that_fails_ends_its_chain_and_its_own_dependants_follow(
        self, store: StateHarness
    ) -> None:
        source = store.new_job(queue="source")
        await store.seed(source)
        middle = store.new_job(BETA, queue="middle", blockers=[source.id])
        await store.seed(middle)
        strict = store.new_job(BETA, queue="strict", blockers=[middle.id])
        lenient = store.new_job(
            BETA, queue="lenient", blockers=[middle.id], blocker_failure="unblock"
        )
        await store.seed(strict, lenient)

        await store.fail_for_good(source)
        assert (await store.chain(middle.id)).status is ChainStatus.FAILED
        assert (await store.job(strict.id)).status is JobStatus.FAILED
        assert (await store.chain(strict.id)).status is ChainStatus.FAILED
        assert (await store.job(lenient.id)).status is JobStatus.PENDING
        assert (await store.acquire_one(BETA, queues=["lenient"])).id == lenient.id

    async def test_cancelling_a_blocker_reports_the_whole_cascade(
        self, store: StateHarness
    ) -> None:
        source = store.new_job(queue="source")
        await store.seed(source)
        middle = store.new_job(BETA, queue="middle", blockers=[source.id], blocker_failure="cancel")
        await store.seed(middle)
        strict = store.new_job(BETA, queue="strict", blockers=[middle.id])
        lenient = store.new_job(
            BETA, queue="lenient", blockers=[middle.id], blocker_failure="unblock"
        )
        await store.seed(strict, lenient)
        await store.adapter.mark_chain_awaited(chain_id=strict.id)

        async with store.adapter.transaction() as tx:
            cancelled, resolution = await store.adapter.cancel_chains(tx, chain_ids=[source.id])
        assert [(c.chain_id, c.job_ids) for c in cancelled] == [(source.id, (source.id,))]
        assert sorted(resolution.ended_chain_ids) == sorted([middle.id, strict.id])
        assert resolution.awaited_chain_ids == (strict.id,)
        assert resolution.ready_queues == ("lenient",)
        assert (await store.job(middle.id)).status is JobStatus.CANCELLED
        assert (await store.job(strict.id)).status is JobStatus.FAILED
        assert (await store.job(lenient.id)).status is JobStatus.PENDING

    async def test_resolve_and_sweep_leave_jobs_whose_blockers_are_active_alone(
        self, store: StateHarness
    ) -> None:
        blocker = store.new_job(queue="a")
        await store.seed(blocker)
        dependant = store.new_job(BETA, queue="merge", blockers=[blocker.id])
        await store.seed(dependant)

        adapter = store.adapter
        assert await adapter.resolve_dependants(None, chain_ids=[blocker.id]) == Resolution()
        async with adapter.transaction() as tx:
            assert await adapter.resolve_dependants(tx, chain_ids=[blocker.id]) == Resolution()
        assert await adapter.resolve_dependants(None, chain_ids=[uuid.uuid4()]) == Resolution()
        assert await adapter.resolve_dependants(None, chain_ids=[]) == Resolution()
        assert await adapter.sweep_blocked() == Resolution()
        assert (await store.job(dependant.id)).status is JobStatus.BLOCKED

        await store.finish(blocker.id)
        assert (await store.job(dependant.id)).status is JobStatus.PENDING
        # Already settled: settling again changes and reports nothing.
        assert await adapter.resolve_dependants(None, chain_ids=[blocker.id]) == Resolution()
        assert await adapter.sweep_blocked() == Resolution()
        assert (await store.job(dependant.id)).status is JobStatus.PENDING

    async def test_sweep_blocked_settles_what_an_interrupted_completion_left_blocked(
        self, store: StateHarness
    ) -> None:
        """A completion cut off while the dependants' rows are busy elsewhere (as when
        its process dies) may leave them blocked behind an ended chain; the sweep then
        settles them, at most ``limit`` per call. An adapter that ends a chain and
        settles its dependants atomically leaves nothing behind, and sweeps nothing."""
        adapter = store.adapter
        blocker = store.new_job(queue="a")
        await store.seed(blocker)
        dependants = [store.new_job(BETA, queue="merge", blockers=[blocker.id]) for _ in "12"]
        await store.seed(*dependants)

        # Another transaction holds the dependants while the blocker's completion runs.
        ended = await self._end_cut_off(store, blocker.id, held=[d.id for d in dependants])
        stuck = [d.id for d in dependants if (await store.job(d.id)).status is JobStatus.BLOCKED]
        if ended and stuck:
            first = await adapter.sweep_blocked(limit=1)
            assert first.ready_queues == ("merge",)
            assert first.ended_chain_ids == ()
            still = [i for i in stuck if (await store.job(i)).status is JobStatus.BLOCKED]
            assert len(still) == len(stuck) - 1
        await adapter.sweep_blocked()
        assert await adapter.sweep_blocked() == Resolution()
        settled = JobStatus.PENDING if ended else JobStatus.BLOCKED
        assert [(await store.job(d.id)).status for d in dependants] == [settled, settled]
