"""Enqueue: inserting jobs, reading them back, scheduling, and transactions.

Role exercised: ``EnqueueStore`` and ``Store`` (transactions), read back through
``ReadStore``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from pgwork.adapters.state import ChainBlockers, Completion, DedupSpec, NewJob, StateAdapter
from pgwork.records import ChainStatus, JobStatus
from pgwork.testing.conformance._harness import (
    ALPHA,
    BETA,
    CHAIN_TYPE,
    RecordingNotify,
    StateHarness,
    StateSuiteBase,
    requires,
)
from pgwork.testing.conformance._rollback import rolled_back

# A second is far more than two statements of one test ever drift apart on the store's
# clock, and far less than any schedule the tests set.
CLOCK_SLACK = timedelta(seconds=1)


class EnqueueConformance(StateSuiteBase):
    async def test_inserted_job_reads_back_with_every_field(self, store: StateHarness) -> None:
        payload = {"text": "héllo ✓", "items": [1, 2.5, None, True], "nested": {"k": "v"}}
        new = store.new_job(input=payload, queue="mail", priority=-7, max_attempts=5)
        [inserted] = await store.seed(new)
        assert inserted.job_id == new.id
        assert inserted.chain_id == new.chain_id
        assert inserted.status is JobStatus.PENDING
        assert not inserted.deduplicated

        job = await store.job(new.id)
        assert (job.id, job.type_name, job.chain_id, job.chain_type_name) == (
            new.id,
            ALPHA,
            new.id,
            CHAIN_TYPE,
        )
        assert job.chain_index == 0
        assert job.is_chain_root
        assert job.input == payload
        assert job.output is None
        assert job.status is JobStatus.PENDING
        assert (job.queue, job.priority, job.attempt, job.max_attempts) == ("mail", -7, 0, 5)
        assert job.started_at is None
        assert job.completed_at is None
        assert job.leased_by is None
        assert job.leased_until is None
        assert job.last_attempt_error is None
        assert job.last_attempt_at is None
        assert job.created_at.tzinfo is not None
        assert job.scheduled_at - job.created_at < CLOCK_SLACK

    async def test_a_limit_key_is_stored_and_read_back(self, store: StateHarness) -> None:
        keyed = replace(store.new_job(), limit_key="tenant-1")
        many = [
            replace(store.new_job(), limit_key=f"k{i % 3}" if i % 2 else None) for i in range(6)
        ]
        await store.seed(keyed)
        await store.seed(*many)
        assert (await store.job(keyed.id)).limit_key == "tenant-1"
        found = {
            job.id: job.limit_key
            for job in await store.adapter.get_jobs(None, job_ids=[job.id for job in many])
        }
        assert [found[job.id] for job in many] == [job.limit_key for job in many]

    async def test_jobs_are_stamped_with_the_stores_own_clock(self, store: StateHarness) -> None:
        before = await store.adapter.now()
        new = store.new_job()
        await store.seed(new)
        after = await store.adapter.now()
        assert before.tzinfo is not None
        assert before <= (await store.job(new.id)).created_at <= after

    async def test_get_jobs_returns_only_jobs_that_exist(self, store: StateHarness) -> None:
        first, second = store.new_job(), store.new_job()
        await store.seed(first, second)
        missing = store.new_job().id
        found = await store.adapter.get_jobs(None, job_ids=[second.id, missing, first.id])
        assert {job.id for job in found} == {first.id, second.id}
        assert await store.adapter.get_jobs(None, job_ids=[]) == []

    async def test_new_chain_reads_back_active_with_its_first_job(
        self, store: StateHarness
    ) -> None:
        new = store.new_job(input={"order": 42})
        await store.seed(new)
        chain = await store.chain(new.chain_id)
        assert chain.id == new.id
        assert chain.type_name == CHAIN_TYPE
        assert chain.status is ChainStatus.ACTIVE
        assert chain.input == {"order": 42}
        assert chain.output is None
        assert chain.completed_at is None
        assert chain.current_job.id == new.id
        assert await store.adapter.get_chains(None, chain_ids=[store.new_job().id]) == []

    async def test_list_chain_jobs_returns_the_chain_in_index_order(
        self, store: StateHarness
    ) -> None:
        new = store.new_job()
        await store.seed(new)
        held = await store.acquire_one()
        follow = store.continuation(held)
        await store.adapter.complete(
            None,
            completions=[Completion(held.id, held.lease_token, '{"ok": true}', follow)],
        )
        jobs = await store.adapter.list_chain_jobs(None, chain_id=new.chain_id)
        assert [(j.id, j.chain_index, j.type_name) for j in jobs] == [
            (new.id, 0, ALPHA),
            (follow.id, 1, BETA),
        ]
        assert [j.status for j in jobs] == [JobStatus.COMPLETED, JobStatus.PENDING]
        assert await store.adapter.list_chain_jobs(None, chain_id=store.new_job().id) == []

    async def test_rolled_back_transaction_leaves_no_job(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        new = store.new_job()
        async with rolled_back(state_adapter.transaction()) as tx:
            await state_adapter.insert_jobs(tx, jobs=[new])
            assert [j.id for j in await state_adapter.get_jobs(tx, job_ids=[new.id])] == [new.id]
        assert not await store.exists(new.id)
        assert await state_adapter.get_chains(None, chain_ids=[new.chain_id]) == []
        assert await store.acquire() == []

    async def test_uncommitted_job_is_invisible_outside_its_transaction(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        new = store.new_job()
        async with state_adapter.transaction() as tx:
            await state_adapter.insert_jobs(tx, jobs=[new])
            assert not await store.exists(new.id)
            assert await store.acquire() == []
        assert await store.exists(new.id)

    async def test_job_scheduled_at_a_future_time_waits_for_it(self, store: StateHarness) -> None:
        run_at = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
        new = store.new_job(run_at=run_at)
        await store.seed(new)
        assert (await store.job(new.id)).scheduled_at == run_at
        assert await store.acquire() == []

    async def test_job_with_run_after_becomes_acquirable_once_due(
        self, store: StateHarness
    ) -> None:
        delay = timedelta(seconds=0.4)
        new = store.new_job(run_after=delay)
        await store.seed(new)
        job = await store.job(new.id)
        assert abs(job.scheduled_at - (job.created_at + delay)) < CLOCK_SLACK / 4
        acquired = await store.acquire_when_due(timeout=self.expiry_timeout)
        assert acquired.id == new.id
        assert acquired.scheduled_at == job.scheduled_at

    async def test_past_run_at_is_clamped_to_now(self, store: StateHarness) -> None:
        new = store.new_job(run_at=datetime.now(UTC) - timedelta(hours=1))
        await store.seed(new)
        job = await store.job(new.id)
        assert job.scheduled_at >= job.created_at
        assert job.scheduled_at - job.created_at < CLOCK_SLACK
        assert (await store.acquire_one()).id == new.id

    async def test_later_of_run_at_and_run_after_wins(self, store: StateHarness) -> None:
        soon = datetime.now(UTC) + timedelta(hours=1)
        by_time = store.new_job(run_at=soon + timedelta(hours=1), run_after=timedelta(hours=1))
        by_delay = store.new_job(run_at=soon, run_after=timedelta(hours=3))
        await store.seed(by_time, by_delay)
        assert (await store.job(by_time.id)).scheduled_at == by_time.run_at
        delayed = await store.job(by_delay.id)
        expected = delayed.created_at + timedelta(hours=3)
        assert abs(delayed.scheduled_at - expected) < CLOCK_SLACK
        assert await store.acquire() == []

    async def test_insert_announces_each_queue_with_a_job_ready_now_once(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        notify = RecordingNotify()
        later = datetime.now(UTC) + timedelta(hours=1)
        jobs = [
            store.new_job(queue="mail"),
            store.new_job(queue="mail"),
            store.new_job(queue="sms"),
            store.new_job(queue="delayed", run_after=timedelta(hours=1)),
            store.new_job(queue="timed", run_at=later),
        ]
        async with state_adapter.transaction() as tx:
            await state_adapter.insert_jobs(tx, jobs=jobs, notify=notify)
        assert notify.ready_queues == ["mail", "sms"]

    @requires(ChainBlockers)
    async def test_insert_takes_its_jobs_from_a_one_shot_iterator_and_answers_in_order(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        # The client hands its jobs over as a generator; an adapter may start writing
        # before it has seen them all, so the jobs needing more than a plain insert
        # come late here, after enough plain ones to fill any bulk path's first write.
        first = store.new_job(dedup=DedupSpec("once"))
        blocker = store.new_job(queue="blocking")
        await store.seed(first, blocker)
        plain = [store.new_job(queue="bulk") for _ in range(300)]
        again = store.again(first)
        waiting = store.new_job(queue="merge", blockers=[blocker.id])
        delayed = store.new_job(queue="delayed", run_after=timedelta(hours=1))
        last = store.new_job(queue="last")
        jobs = [*plain[:200], again, waiting, *plain[200:], delayed, last]
        taken: list[NewJob] = []

        def one_shot() -> Iterator[NewJob]:
            for job in jobs:
                taken.append(job)
                yield job

        notify = RecordingNotify()
        async with state_adapter.transaction() as tx:
            results = await state_adapter.insert_jobs(tx, jobs=one_shot(), notify=notify)
        assert taken == jobs
        assert [r.job_id for r in results] == [first.id if j is again else j.id for j in jobs]
        assert [r.deduplicated for r in results] == [j is again for j in jobs]
        blocked = [r.job_id for r in results if r.status is JobStatus.BLOCKED]
        assert blocked == [waiting.id]
        # "blocking": the blocker still waits, see test_a_blocker_still_pending_is_announced.
        assert notify.ready_queues == ["blocking", "bulk", "last"]
        for job in (plain[0], plain[-1], waiting, delayed, last):
            assert await store.exists(job.id)
        assert not await store.exists(again.id)

    async def test_insert_without_notify_announces_nothing_and_needs_none(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        new = store.new_job()
        async with state_adapter.transaction() as tx:
            [inserted] = await state_adapter.insert_jobs(tx, jobs=[new])
        assert inserted.status is JobStatus.PENDING
        assert await store.exists(new.id)

    @requires(ChainBlockers)
    async def test_deduplicated_and_blocked_jobs_announce_nothing(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        first = store.new_job(dedup=DedupSpec("k"))
        await store.seed(first)
        await store.acquire_one()  # a blocker that runs: nothing of it to announce
        again = store.again(first)
        waiting = store.new_job(queue="merge", blockers=[first.id])
        notify = RecordingNotify()
        async with state_adapter.transaction() as tx:
            dup, blocked = await state_adapter.insert_jobs(tx, jobs=[again, waiting], notify=notify)
        assert dup.deduplicated
        assert blocked.status is JobStatus.BLOCKED
        assert notify.published == []

    @requires(ChainBlockers)
    async def test_a_blocker_still_pending_is_announced(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        # An adapter may hold a blocker chain's root while it records the dependant
        # (PostgreSQL locks the row until commit), hiding a job that was ready from a
        # concurrent acquire, whose worker then takes its queues for drained. So an
        # enqueue announces the blocker roots still pending that it names: ready now,
        # or at their due time.
        now_ready = store.new_job(queue="early")
        later = store.new_job(queue="late", run_after=timedelta(hours=1))
        running = store.new_job(queue="busy")
        await store.seed(running)
        await store.acquire_one(queues=["busy"])
        await store.seed(now_ready, later)
        waiting = store.new_job(queue="merge", blockers=[now_ready.id, later.id, running.id])
        notify = RecordingNotify()
        async with state_adapter.transaction() as tx:
            [blocked] = await state_adapter.insert_jobs(tx, jobs=[waiting], notify=notify)
        assert blocked.status is JobStatus.BLOCKED
        assert notify.ready_queues == ["early"]
        [(queue, at)] = [(n.queue, n.at) for n in notify.published if n.at is not None]
        assert queue == "late"
        assert abs(at - (datetime.now(UTC) + timedelta(hours=1)).timestamp()) < 60

    @requires(ChainBlockers)
    async def test_job_whose_blockers_already_ended_is_announced(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        blocker = store.new_job()
        await store.seed(blocker)
        held = await store.acquire_one()
        await state_adapter.complete(
            None, completions=[Completion(held.id, held.lease_token, "{}")]
        )
        dependant = store.new_job(queue="merge", blockers=[blocker.id])
        notify = RecordingNotify()
        async with state_adapter.transaction() as tx:
            [inserted] = await state_adapter.insert_jobs(tx, jobs=[dependant], notify=notify)
        assert inserted.status is JobStatus.PENDING
        assert notify.ready_queues == ["merge"]
