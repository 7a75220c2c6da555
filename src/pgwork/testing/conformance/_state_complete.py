"""Ending an attempt: completing (with or without a continuation) and failing.

Role exercised: ``WorkerStore`` (``complete``, ``fail``).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from pgwork.adapters.notify import Notice
from pgwork.adapters.state import Completion, Failure, StateAdapter
from pgwork.records import AttemptError, ChainStatus, JobStatus
from pgwork.testing.conformance._harness import BETA, RecordingNotify, StateHarness, StateSuiteBase
from pgwork.testing.conformance._rollback import rolled_back

CLOCK_SLACK = timedelta(seconds=1)
BOOM = AttemptError(type="ValueError", message="boom", traceback="Traceback: ...")


class CompleteConformance(StateSuiteBase):
    async def test_completion_ends_the_job_and_its_chain(self, store: StateHarness) -> None:
        new = store.new_job()
        await store.seed(new)
        held = await store.acquire_one()
        [result] = await store.adapter.complete(
            None, completions=[Completion(held.id, held.lease_token, '{"sent": 3}')]
        )
        assert result.job_id == held.id
        assert result.accepted
        assert result.chain_completed
        assert result.continuation_id is None
        job = await store.job(held.id)
        assert job.status is JobStatus.COMPLETED
        assert job.output == {"sent": 3}
        assert job.completed_at is not None
        assert job.attempt == 1
        assert job.leased_by is None
        assert job.leased_until is None
        chain = await store.chain(new.chain_id)
        assert chain.status is ChainStatus.COMPLETED
        assert chain.output == {"sent": 3}
        assert chain.completed_at is not None
        assert chain.current_job.id == held.id

    async def test_completion_with_a_wrong_token_changes_nothing(self, store: StateHarness) -> None:
        await store.seed(store.new_job())
        held = await store.acquire_one()
        [result] = await store.adapter.complete(
            None, completions=[Completion(held.id, uuid.uuid4(), '"forged"')]
        )
        assert not result.accepted
        assert not result.chain_completed
        job = await store.job(held.id)
        assert job.status is JobStatus.RUNNING
        assert job.output is None
        assert job.leased_until == held.leased_until
        [real] = await store.adapter.complete(
            None, completions=[Completion(held.id, held.lease_token, '"real"')]
        )
        assert real.accepted

    async def test_second_completion_of_a_job_is_not_accepted(self, store: StateHarness) -> None:
        await store.seed(store.new_job())
        held = await store.acquire_one()
        first = Completion(held.id, held.lease_token, '"first"')
        assert (await store.adapter.complete(None, completions=[first]))[0].accepted
        for late in (
            Completion(held.id, held.lease_token, '"late"'),
            Completion(held.id, None, '"x"'),
        ):
            [result] = await store.adapter.complete(None, completions=[late])
            assert not result.accepted
        assert (await store.job(held.id)).output == "first"

    async def test_completion_without_a_token_completes_a_pending_job(
        self, store: StateHarness
    ) -> None:
        new = store.new_job()
        await store.seed(new)
        [result] = await store.adapter.complete(
            None, completions=[Completion(new.id, None, '{"by": "hand"}')]
        )
        assert result.accepted
        assert result.chain_completed
        assert (await store.job(new.id)).status is JobStatus.COMPLETED
        assert (await store.chain(new.chain_id)).output == {"by": "hand"}
        assert await store.acquire() == []

    async def test_completion_with_continuation_inserts_the_next_job_and_keeps_chain_active(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        new = store.new_job()
        await store.seed(new)
        held = await store.acquire_one()
        follow = store.continuation(held, input={"step": 2})
        async with state_adapter.transaction() as tx:
            [result] = await state_adapter.complete(
                tx, completions=[Completion(held.id, held.lease_token, '"one"', follow)]
            )
            # Nothing of it is visible before the transaction commits.
            assert (await store.job(held.id)).status is JobStatus.RUNNING
            assert not await store.exists(follow.id)
        assert result.accepted
        assert not result.chain_completed
        assert result.continuation_id == follow.id

        first = await store.job(held.id)
        assert first.status is JobStatus.COMPLETED
        assert first.output == "one"
        nxt = await store.job(follow.id)
        assert nxt.status is JobStatus.PENDING
        assert nxt.chain_index == 1
        assert nxt.chain_id == new.chain_id
        assert nxt.type_name == BETA
        assert nxt.input == {"step": 2}
        assert nxt.attempt == 0
        chain = await store.chain(new.chain_id)
        assert chain.status is ChainStatus.ACTIVE
        assert chain.output is None
        assert chain.completed_at is None
        assert chain.current_job.id == follow.id
        assert await state_adapter.get_chains(None, chain_ids=[follow.id]) == []

        last = await store.acquire_one(BETA)
        assert last.id == follow.id
        assert last.chain_index == 1
        [end] = await state_adapter.complete(
            None, completions=[Completion(last.id, last.lease_token, '"two"')]
        )
        assert end.accepted
        assert end.chain_completed
        chain = await store.chain(new.chain_id)
        assert chain.status is ChainStatus.COMPLETED
        assert chain.output == "two"
        assert chain.input == json.loads(new.input_json)
        assert chain.current_job.id == follow.id

    async def test_completion_with_continuation_outside_a_transaction_is_atomic(
        self, store: StateHarness
    ) -> None:
        await store.seed(store.new_job())
        held = await store.acquire_one()
        follow = store.continuation(held)
        [result] = await store.adapter.complete(
            None, completions=[Completion(held.id, held.lease_token, "1", follow)]
        )
        assert result.accepted
        assert result.continuation_id == follow.id
        assert (await store.job(follow.id)).status is JobStatus.PENDING

    async def test_a_continuation_is_written_with_its_limit_key(self, store: StateHarness) -> None:
        # Handed on in the caller's transaction, and outside any (one statement).
        await store.seed(store.new_job(), store.new_job())
        first, second = await store.acquire_one(), await store.acquire_one()
        inside = replace(store.continuation(first), limit_key="tenant-1")
        outside = replace(store.continuation(second), limit_key="mail")
        async with store.adapter.transaction() as tx:
            await store.adapter.complete(
                tx, completions=[Completion(first.id, first.lease_token, "1", inside)]
            )
        await store.adapter.complete(
            None, completions=[Completion(second.id, second.lease_token, "1", outside)]
        )
        assert (await store.job(inside.id)).limit_key == "tenant-1"
        assert (await store.job(outside.id)).limit_key == "mail"

    async def test_rejected_completion_inserts_no_continuation(self, store: StateHarness) -> None:
        await store.seed(store.new_job())
        held = await store.acquire_one()
        follow = store.continuation(held)
        [result] = await store.adapter.complete(
            None, completions=[Completion(held.id, uuid.uuid4(), "1", follow)]
        )
        assert not result.accepted
        assert result.continuation_id is None
        assert not await store.exists(follow.id)

    async def test_hand_on_with_notify_announces_its_continuation_once(
        self, store: StateHarness
    ) -> None:
        await store.seed(store.new_job())
        held = await store.acquire_one()
        follow = store.continuation(held)
        notify = RecordingNotify(in_transaction_only=False)
        [result] = await store.adapter.complete(
            None, completions=[Completion(held.id, held.lease_token, "1", follow)], notify=notify
        )
        assert result.accepted
        assert result.ready_queues == (follow.queue,)
        # Counted as the one job it is (a broker hands out one look), or not counted.
        [announced] = notify.published
        assert announced.count in (None, 1)
        assert replace(announced, count=None) == Notice(kind="ready", queue=follow.queue)
        assert (await store.job(follow.id)).status is JobStatus.PENDING

    async def test_refused_hand_on_announces_nothing_and_scheduled_one_its_due_time(
        self, store: StateHarness
    ) -> None:
        await store.seed(store.new_job(), store.new_job())
        held = await store.acquire_one()
        notify = RecordingNotify(in_transaction_only=False)
        follow = store.continuation(held)
        [refused] = await store.adapter.complete(
            None, completions=[Completion(held.id, uuid.uuid4(), "1", follow)], notify=notify
        )
        assert not refused.accepted
        assert notify.published == []
        assert not await store.exists(follow.id)
        later = replace(store.continuation(held), run_after=timedelta(hours=1))
        [scheduled] = await store.adapter.complete(
            None, completions=[Completion(held.id, held.lease_token, "1", later)], notify=notify
        )
        assert scheduled.accepted
        assert scheduled.ready_queues == ()
        due = (await store.job(later.id)).scheduled_at
        assert due > datetime.now(UTC)
        # Time has no notification: the due time is announced now, for a timer.
        [announced] = notify.published
        assert (announced.kind, announced.queue) == ("ready", later.queue)
        assert announced.at is not None
        assert abs(announced.at - due.timestamp()) < 60

    async def test_completion_with_notify_announces_the_end_of_an_awaited_chain(
        self, store: StateHarness
    ) -> None:
        watched = store.new_job()
        await store.seed(watched)
        await store.adapter.mark_chain_awaited(chain_id=watched.id)
        held = await store.acquire_one()
        notify = RecordingNotify(in_transaction_only=False)
        [result] = await store.adapter.complete(
            None, completions=[Completion(held.id, held.lease_token, "1")], notify=notify
        )
        assert result.chain_awaited
        assert notify.published == [Notice(kind="chain_done", chain_id=watched.id)]

    async def test_rolled_back_completion_leaves_job_running_and_no_continuation(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        await store.seed(store.new_job())
        held = await store.acquire_one()
        follow = store.continuation(held)
        async with rolled_back(state_adapter.transaction()) as tx:
            await state_adapter.complete(
                tx, completions=[Completion(held.id, held.lease_token, "1", follow)]
            )
        job = await store.job(held.id)
        assert job.status is JobStatus.RUNNING
        assert job.leased_until == held.leased_until
        assert not await store.exists(follow.id)
        [result] = await state_adapter.complete(
            None, completions=[Completion(held.id, held.lease_token, "1")]
        )
        assert result.accepted

    async def test_completing_a_batch_reports_each_job_in_order(self, store: StateHarness) -> None:
        await store.seed(store.new_job(), store.new_job())
        one, two = await store.acquire(limit=2)
        results = await store.adapter.complete(
            None,
            completions=[
                Completion(two.id, two.lease_token, "2"),
                Completion(one.id, uuid.uuid4(), "forged"),
                Completion(uuid.uuid4(), uuid.uuid4(), "missing"),
            ],
        )
        assert [r.accepted for r in results] == [True, False, False]
        assert results[0].job_id == two.id
        assert results[1].job_id == one.id
        assert await store.adapter.complete(None, completions=[]) == []


class FailConformance(StateSuiteBase):
    async def test_failure_with_retry_puts_job_back_later_and_records_the_error(
        self, store: StateHarness
    ) -> None:
        new = store.new_job()
        await store.seed(new)
        held = await store.acquire_one()
        retry = timedelta(minutes=10)
        assert await store.adapter.fail(
            None, failures=[Failure(held.id, held.lease_token, BOOM, retry)]
        ) == [True]
        job = await store.job(held.id)
        assert job.status is JobStatus.PENDING
        assert job.attempt == 1
        assert job.last_attempt_error == BOOM
        assert job.last_attempt_at is not None
        assert abs(job.scheduled_at - (job.last_attempt_at + retry)) < CLOCK_SLACK
        assert job.leased_by is None
        assert job.leased_until is None
        assert job.completed_at is None
        assert (await store.chain(new.chain_id)).status is ChainStatus.ACTIVE
        assert await store.acquire() == []

    async def test_retried_job_runs_again_with_its_last_error(self, store: StateHarness) -> None:
        await store.seed(store.new_job())
        held = await store.acquire_one()
        await store.adapter.fail(
            None, failures=[Failure(held.id, held.lease_token, BOOM, timedelta(seconds=0.2))]
        )
        again = await store.acquire_when_due(timeout=self.expiry_timeout)
        assert again.id == held.id
        assert again.attempt == 2
        assert again.last_attempt_error == BOOM
        assert again.lease_token != held.lease_token

    async def test_terminal_failure_fails_the_job_and_its_chain(self, store: StateHarness) -> None:
        new = store.new_job()
        await store.seed(new)
        held = await store.acquire_one()
        assert await store.adapter.fail(
            None, failures=[Failure(held.id, held.lease_token, BOOM, None)]
        ) == [True]
        job = await store.job(held.id)
        assert job.status is JobStatus.FAILED
        assert job.last_attempt_error == BOOM
        assert job.completed_at is not None
        assert job.leased_until is None
        chain = await store.chain(new.chain_id)
        assert chain.status is ChainStatus.FAILED
        assert chain.completed_at is not None
        assert chain.output is None
        assert await store.acquire() == []

    async def test_terminal_failure_of_a_later_job_fails_the_chain(
        self, store: StateHarness
    ) -> None:
        new = store.new_job()
        await store.seed(new)
        held = await store.acquire_one()
        follow = store.continuation(held)
        await store.adapter.complete(
            None, completions=[Completion(held.id, held.lease_token, "1", follow)]
        )
        second = await store.acquire_one(BETA)
        await store.adapter.fail(
            None, failures=[Failure(second.id, second.lease_token, BOOM, None)]
        )
        chain = await store.chain(new.chain_id)
        assert chain.status is ChainStatus.FAILED
        assert chain.current_job.id == follow.id
        assert (await store.job(held.id)).status is JobStatus.COMPLETED

    async def test_failure_with_a_wrong_token_changes_nothing(self, store: StateHarness) -> None:
        await store.seed(store.new_job(), store.new_job())
        held, other = await store.acquire(limit=2)
        results = await store.adapter.fail(
            None,
            failures=[
                Failure(held.id, uuid.uuid4(), BOOM, None),
                Failure(other.id, other.lease_token, BOOM, timedelta(hours=1)),
            ],
        )
        assert results == [False, True]
        job = await store.job(held.id)
        assert job.status is JobStatus.RUNNING
        assert job.last_attempt_error is None
        assert await store.adapter.fail(None, failures=[]) == []
