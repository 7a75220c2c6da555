"""Fan-out: a completion that starts child chains and hands on to a step blocked on them.

A worker's handler starts children (``Completion.children``, new chains' first jobs)
and continues its chain with a step whose ``blockers`` are their ids (``blocker_need``:
all of them, or how many must be met). ``complete`` writes the children, then the
step, with the completion, when it is accepted and not at all otherwise. The step is
the chain's later job, ``blocked``; each child's end is settled on it alone, counted
once however often it is settled; the step's ``blocker_failure`` decides what a failed
or cancelled child does once the step can no longer get its need; ``blocker_outputs``
says which children were met when the step was released.

Role exercised: ``WorkerStore`` (``complete`` with children, ``resolve_dependants``,
``sweep_blocked``, ``blocker_outputs``) and ``ControlCore`` (cancel, retry).
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Literal

import pytest

from pgwork.adapters.state import (
    AcquiredJob,
    BlockerOutput,
    ChainBlockers,
    Completion,
    CompletionResult,
    NewJob,
    Resolution,
)
from pgwork.records import ChainStatus, JobStatus
from pgwork.testing.conformance._cut_off import CutOffEnds
from pgwork.testing.conformance._harness import ALPHA, BETA, StateHarness, requires
from pgwork.testing.conformance._rollback import rolled_back

Policy = Literal["fail", "cancel", "unblock"]


@requires(ChainBlockers)
class FanOutConformance(CutOffEnds):
    async def _splitting(
        self, store: StateHarness, size: int, *, need: int | None = None, policy: Policy = "fail"
    ) -> tuple[AcquiredJob, list[NewJob], NewJob, Completion]:
        """A parent acquired, and its completion, not yet written: with ``size``
        children (queue ``kids``, one attempt each) and a step (queue ``step``) blocked
        on them."""
        await store.seed(store.new_job(queue="parents"))
        parent = await store.acquire_one(ALPHA, queues=["parents"])
        children = [
            store.new_job(queue="kids", max_attempts=1, input={"i": i}) for i in range(size)
        ]
        step = replace(
            store.continuation(parent),
            queue="step",
            blockers=tuple(c.id for c in children),
            blocker_need=need,
            blocker_failure=policy,
        )
        completion = Completion(parent.id, parent.lease_token, '"split"', step, tuple(children))
        return parent, children, step, completion

    async def _fan_out(
        self,
        store: StateHarness,
        size: int,
        *,
        need: int | None = None,
        policy: Policy = "fail",
        tx_complete: bool = False,
    ) -> tuple[AcquiredJob, list[NewJob], NewJob, CompletionResult]:
        """``_splitting``'s parent completed (in a transaction of the store's own with
        ``tx_complete``)."""
        parent, children, step, completion = await self._splitting(
            store, size, need=need, policy=policy
        )
        if tx_complete:
            async with store.adapter.transaction() as tx:
                [result] = await store.adapter.complete(tx, completions=[completion])
        else:
            [result] = await store.adapter.complete(None, completions=[completion])
        return parent, children, step, result

    async def _read(
        self, store: StateHarness, step: NewJob
    ) -> list[tuple[bool, ChainStatus | None]]:
        """What the step reads of each child, in order: met or not, and its status."""
        outputs = await store.adapter.blocker_outputs(None, job_id=step.id)
        return [(o.met, o.status) for o in outputs]

    async def _first_child_failed(
        self, store: StateHarness, *, policy: Policy = "fail", retried: bool = False
    ) -> tuple[list[NewJob], NewJob]:
        """Three children, two needed: the first failed for good (put back by a retry
        with ``retried``), and the step still waits. The children and the step."""
        _, children, step, _ = await self._fan_out(store, 3, need=2, policy=policy)
        # (Children run in the order they were started: fail_for_good runs the next.)
        await store.fail_for_good(children[0])
        assert (await store.job(step.id)).status is JobStatus.BLOCKED
        if retried:
            async with store.adapter.transaction() as tx:
                await store.adapter.retry_failed(tx, job_ids=[children[0].id], front=False)
        return children, step

    async def test_a_completion_writes_its_children_then_a_step_blocked_on_them(
        self, store: StateHarness
    ) -> None:
        parent, children, step, result = await self._fan_out(store, 3)
        assert result.accepted
        assert not result.chain_completed
        assert result.continuation_id == step.id
        # The children are ready now; the step is not.
        assert result.ready_queues == ("kids",)
        for child in children:
            job = await store.job(child.id)
            assert (job.status, job.chain_id, job.chain_index) == (JobStatus.PENDING, child.id, 0)
            assert (await store.chain(child.id)).status is ChainStatus.ACTIVE
        waiting = await store.job(step.id)
        assert waiting.status is JobStatus.BLOCKED
        assert (waiting.chain_id, waiting.chain_index) == (parent.chain_id, 1)
        assert (await store.job(parent.id)).status is JobStatus.COMPLETED
        assert (await store.chain(parent.chain_id)).status is ChainStatus.ACTIVE
        assert await store.acquire(BETA, queues=["step"]) == []
        outputs = await store.adapter.blocker_outputs(None, job_id=step.id)
        assert [(o.chain_id, o.status, o.met) for o in outputs] == [
            (c.id, ChainStatus.ACTIVE, False) for c in children
        ]

    async def test_a_refused_completion_writes_neither_children_nor_step(
        self, store: StateHarness
    ) -> None:
        parent, children, step, completion = await self._splitting(store, 2)
        stale = replace(completion, lease_token=uuid.uuid4())
        [refused] = await store.adapter.complete(None, completions=[stale])
        assert not refused.accepted
        for job_id in (step.id, *(c.id for c in children)):
            assert not await store.exists(job_id)
        assert (await store.job(parent.id)).status is JobStatus.RUNNING

    async def test_children_written_in_a_callers_transaction_go_with_it(
        self, store: StateHarness
    ) -> None:
        parent, children, step, completion = await self._splitting(store, 2)
        async with rolled_back(store.adapter.transaction()) as tx:
            [result] = await store.adapter.complete(tx, completions=[completion])
            assert result.accepted
        for job_id in (step.id, *(c.id for c in children)):
            assert not await store.exists(job_id)
        assert (await store.job(parent.id)).status is JobStatus.RUNNING
        async with store.adapter.transaction() as tx:
            [result] = await store.adapter.complete(tx, completions=[completion])
            assert result.accepted
        assert (await store.job(step.id)).status is JobStatus.BLOCKED
        assert all([await store.exists(c.id) for c in children])

    async def test_the_step_is_released_by_its_last_childs_end_and_reads_their_outputs(
        self, store: StateHarness
    ) -> None:
        _, children, step, _ = await self._fan_out(store, 3)
        first = await store.finish(children[2].id, {"out": 2})
        assert first.ready_queues == ()
        await store.finish(children[0].id, {"out": 0})
        assert (await store.job(step.id)).status is JobStatus.BLOCKED
        last = await store.finish(children[1].id, {"out": 1})
        assert last.ready_queues == ("step",)
        released = await store.job(step.id)
        assert (released.status, released.attempt) == (JobStatus.PENDING, 0)
        assert (await store.acquire_one(BETA, queues=["step"])).id == step.id
        assert await store.adapter.blocker_outputs(None, job_id=step.id) == [
            BlockerOutput(c.id, ChainStatus.COMPLETED, ALPHA, {"out": i}, met=True)
            for i, c in enumerate(children)
        ]

    async def test_need_releases_the_step_at_that_many_completions_and_later_ends_change_nothing(
        self, store: StateHarness
    ) -> None:
        _, children, step, _ = await self._fan_out(store, 4, need=2)
        await store.finish(children[3].id, "three")
        assert (await store.job(step.id)).status is JobStatus.BLOCKED
        released = await store.finish(children[1].id, "one")
        assert released.ready_queues == ("step",)
        assert (await store.job(step.id)).status is JobStatus.PENDING
        late = await store.finish(children[0].id, "zero")
        assert late.ready_queues == ()
        await store.fail_for_good(children[2])
        assert (await store.job(step.id)).status is JobStatus.PENDING
        # Met: the two that completed before the release, whatever ended since.
        assert await self._read(store, step) == [
            (False, ChainStatus.COMPLETED),
            (True, ChainStatus.COMPLETED),
            (False, ChainStatus.FAILED),
            (True, ChainStatus.COMPLETED),
        ]

    async def test_need_met_by_children_ending_together_reads_only_that_many_as_met(
        self, store: StateHarness
    ) -> None:
        """Three of four children end in one completion (a worker's batch) where two
        are needed: the step reads two of them met, the first two it started."""
        _, children, step, _ = await self._fan_out(store, 4, need=2)
        ends = [Completion(c.id, None, str(i)) for i, c in enumerate(children[:3])]
        [*results, last] = await store.adapter.complete(None, completions=ends)
        assert all(r.accepted for r in (*results, last))
        assert (await store.job(step.id)).status is JobStatus.PENDING
        assert await self._read(store, step) == [
            (True, ChainStatus.COMPLETED),
            (True, ChainStatus.COMPLETED),
            (False, ChainStatus.COMPLETED),
            (False, ChainStatus.ACTIVE),
        ]

    @pytest.mark.parametrize("policy", ["fail", "cancel"])
    async def test_a_retried_child_is_waited_for_again_before_the_policy_ends_the_step(
        self, store: StateHarness, policy: Policy
    ) -> None:
        """Two of three needed; the first child fails and is retried: it runs again, so
        the second's failure leaves the step two chains that can still make the need."""
        children, step = await self._first_child_failed(store, policy=policy, retried=True)
        await store.fail_for_good(children[1])
        assert (await store.job(step.id)).status is JobStatus.BLOCKED
        await store.finish(children[2].id, "two")
        released = await store.finish(children[0].id, "zero, at last")
        assert released.ready_queues == ("step",)
        assert [met for met, _ in await self._read(store, step)] == [True, False, True]

    @pytest.mark.parametrize("policy", ["fail", "cancel", "unblock"])
    async def test_a_failed_child_applies_the_steps_policy_to_it_and_its_chain(
        self, store: StateHarness, policy: Policy
    ) -> None:
        parent, children, step, _ = await self._fan_out(store, 3, policy=policy)
        await store.adapter.mark_chain_awaited(chain_id=parent.chain_id)
        await store.finish(children[0].id, "zero")
        await store.fail_for_good(children[1])
        job = await store.job(step.id)
        chain = await store.chain(parent.chain_id)
        if policy == "unblock":
            assert (job.status, chain.status) == (JobStatus.BLOCKED, ChainStatus.ACTIVE)
            last = await store.finish(children[2].id, "two")
            assert last.ready_queues == ("step",)
            assert (await store.job(step.id)).status is JobStatus.PENDING
            assert await self._read(store, step) == [
                (True, ChainStatus.COMPLETED),
                (True, ChainStatus.FAILED),
                (True, ChainStatus.COMPLETED),
            ]
            return
        ended = JobStatus.FAILED if policy == "fail" else JobStatus.CANCELLED
        assert job.status is ended
        assert job.completed_at is not None
        assert job.last_attempt_error is not None
        assert str(children[1].id) in job.last_attempt_error.message
        assert chain.status is ChainStatus(ended.value)
        # The remaining child runs to its end, which changes nothing.
        assert (await store.job(children[2].id)).status is JobStatus.PENDING
        assert (await store.finish(children[2].id, "two")).ready_queues == ()
        assert (await store.job(step.id)).status is ended

    async def test_a_step_ended_by_a_child_reports_its_awaited_chain_and_its_dependants_follow(
        self, store: StateHarness
    ) -> None:
        parent, _, step, _ = await self._fan_out(store, 2)
        await store.adapter.mark_chain_awaited(chain_id=parent.chain_id)
        later = store.new_job(BETA, queue="later", blockers=[parent.chain_id])
        await store.seed(later)
        [child] = await store.acquire(ALPHA, queues=["kids"], limit=1)
        async with store.adapter.transaction() as tx:
            cancelled, resolution = await store.adapter.cancel_chains(tx, chain_ids=[child.id])
        assert [c.chain_id for c in cancelled] == [child.id]
        assert sorted(resolution.ended_chain_ids) == sorted([parent.chain_id, later.id])
        assert resolution.awaited_chain_ids == (parent.chain_id,)
        assert (await store.job(step.id)).status is JobStatus.FAILED
        assert (await store.job(later.id)).status is JobStatus.FAILED

    async def test_need_fails_the_step_only_once_it_can_no_longer_be_met(
        self, store: StateHarness
    ) -> None:
        children, step = await self._first_child_failed(store)
        await store.fail_for_good(children[1])
        assert (await store.job(step.id)).status is JobStatus.FAILED

    async def test_settling_a_childs_end_again_counts_it_once(self, store: StateHarness) -> None:
        _, children, step, _ = await self._fan_out(store, 3, need=2)
        await store.finish(children[0].id, "zero")
        adapter = store.adapter
        for _ in range(2):
            assert await adapter.resolve_dependants(None, chain_ids=[children[0].id]) == (
                Resolution()
            )
        assert await adapter.sweep_blocked() == Resolution()
        assert (await store.job(step.id)).status is JobStatus.BLOCKED
        await store.finish(children[1].id, "one")
        assert (await store.job(step.id)).status is JobStatus.PENDING

    async def test_a_retried_child_that_then_completes_counts_as_met(
        self, store: StateHarness
    ) -> None:
        children, step = await self._first_child_failed(store, retried=True)
        await store.finish(children[0].id, "zero, at last")
        assert (await store.job(step.id)).status is JobStatus.BLOCKED
        released = await store.finish(children[1].id, "one")
        assert released.ready_queues == ("step",)
        assert [met for met, _ in await self._read(store, step)] == [True, True, False]

    async def test_children_without_a_step_are_started_and_left_to_run(
        self, store: StateHarness
    ) -> None:
        await store.seed(store.new_job(queue="parents"))
        parent = await store.acquire_one(ALPHA, queues=["parents"])
        children = [store.new_job(queue="kids") for _ in range(2)]
        [result] = await store.adapter.complete(
            None,
            completions=[Completion(parent.id, parent.lease_token, '"p"', None, tuple(children))],
        )
        assert result.accepted
        assert result.chain_completed
        assert result.ready_queues == ("kids",)
        assert (await store.chain(parent.chain_id)).status is ChainStatus.COMPLETED
        ended = await store.finish(children[0].id, "done")
        assert ended.chain_completed
        assert ended.ready_queues == ()
        assert (await store.job(children[1].id)).status is JobStatus.PENDING

    async def test_cancelling_the_parents_chain_cancels_the_step_not_the_children(
        self, store: StateHarness
    ) -> None:
        parent, children, step, _ = await self._fan_out(store, 2)
        async with store.adapter.transaction() as tx:
            await store.adapter.cancel_chains(tx, chain_ids=[parent.chain_id])
        assert (await store.job(step.id)).status is JobStatus.CANCELLED
        assert [(await store.job(c.id)).status for c in children] == [JobStatus.PENDING] * 2
        assert (await store.finish(children[0].id)).ready_queues == ()
        assert (await store.job(step.id)).status is JobStatus.CANCELLED

    async def test_thousands_of_children_keep_their_order_and_settle_in_one_batch(
        self, store: StateHarness
    ) -> None:
        size = 1200
        _, children, step, _ = await self._fan_out(store, size, tx_complete=True)
        assert (await store.job(step.id)).status is JobStatus.BLOCKED
        ends = [Completion(c.id, None, str(i)) for i, c in enumerate(children)]
        results = await store.adapter.complete(None, completions=ends[:-1])
        assert all(r.accepted for r in results)
        assert (await store.job(step.id)).status is JobStatus.BLOCKED
        await store.adapter.complete(None, completions=ends[-1:])
        assert (await store.job(step.id)).status is JobStatus.PENDING
        outputs = await store.adapter.blocker_outputs(None, job_id=step.id)
        assert [o.output for o in outputs] == list(range(size))
        assert all(o.met for o in outputs)

    async def test_sweep_blocked_settles_a_childs_end_that_was_never_settled(
        self, store: StateHarness
    ) -> None:
        """A child's end cut off before it settled its step (as when its process dies)
        leaves the step blocked behind an ended child; the sweep counts it. An adapter
        that ends a chain and settles its dependants atomically leaves nothing behind."""
        adapter = store.adapter
        parent, children, step, _ = await self._fan_out(store, 1)
        [child] = children
        # Another transaction holds the parent's chain while the child's completion runs.
        ended = await self._end_cut_off(store, child.id, held=[parent.chain_id])
        if ended and (await store.job(step.id)).status is JobStatus.BLOCKED:
            swept = await adapter.sweep_blocked()
            assert swept.ready_queues == ("step",)
        assert await adapter.sweep_blocked() == Resolution()
        settled = JobStatus.PENDING if ended else JobStatus.BLOCKED
        assert (await store.job(step.id)).status is settled
