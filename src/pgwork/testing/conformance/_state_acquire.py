"""Acquire: which ready jobs a worker gets, in what order, and never twice.

Role exercised: ``WorkerStore`` (``acquire``).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from uuid import UUID

import anyio

from pgwork.adapters.state import AcquiredJob, Completion, DueTimes, Lease
from pgwork.records import JobStatus
from pgwork.testing.conformance._harness import (
    ALPHA,
    BETA,
    CHAIN_TYPE,
    StateHarness,
    StateSuiteBase,
    requires,
)
from pgwork.testing.conformance._rollback import rolled_back

CLOCK_SLACK = timedelta(seconds=1)


class AcquireConformance(StateSuiteBase):
    async def test_acquire_leases_job_with_attempt_incremented_and_fresh_token(
        self, store: StateHarness
    ) -> None:
        new = store.new_job(input={"to": "a"}, queue="default", priority=3, max_attempts=4)
        await store.seed(new)
        held = await store.acquire_one(worker="worker-a")
        assert (held.id, held.type_name, held.chain_id, held.chain_type_name) == (
            new.id,
            ALPHA,
            new.id,
            CHAIN_TYPE,
        )
        assert (held.chain_index, held.input, held.queue, held.priority) == (
            0,
            {"to": "a"},
            "default",
            3,
        )
        assert (held.attempt, held.max_attempts) == (1, 4)
        assert isinstance(held.lease_token, UUID)
        assert held.lease == Lease(new.id, held.lease_token)
        assert held.last_attempt_error is None

        job = await store.job(new.id)
        assert job.status is JobStatus.RUNNING
        assert job.attempt == 1
        assert job.leased_by == "worker-a"
        assert job.leased_until == held.leased_until
        assert job.started_at is not None
        assert job.scheduled_at == held.scheduled_at
        assert job.created_at == held.created_at

        assert await store.adapter.release(leases=[held.lease]) == 1
        again = await store.acquire_one(worker="worker-b")
        assert again.id == new.id
        assert again.lease_token != held.lease_token

    async def test_acquire_takes_lower_priority_numbers_first(self, store: StateHarness) -> None:
        jobs = {p: store.new_job(priority=p) for p in (5, -2, 0, 9, 1)}
        await store.seed(*jobs.values())
        order = [(await store.acquire_one()).priority for _ in jobs]
        assert order == [-2, 0, 1, 5, 9]

    async def test_acquire_takes_earlier_scheduled_first_within_a_priority(
        self, store: StateHarness
    ) -> None:
        # Separate transactions: each later one is scheduled at a later "now".
        first, second, third = store.new_job(), store.new_job(), store.new_job()
        for job in (first, second, third):
            await store.seed(job)
        urgent = store.new_job(priority=-1)
        await store.seed(urgent)
        order = [(await store.acquire_one()).id for _ in range(4)]
        assert order == [urgent.id, first.id, second.id, third.id]

    async def test_acquire_drains_queues_strictly_in_the_given_order(
        self, store: StateHarness
    ) -> None:
        low = store.new_job(queue="low", priority=-100)
        high = [store.new_job(queue="high", priority=100) for _ in range(2)]
        await store.seed(low, *high)
        taken = await store.acquire(queues=["high", "low"], limit=2)
        assert {j.id for j in taken} == {j.id for j in high}
        last = await store.acquire_one(queues=["high", "low"])
        assert last.id == low.id
        # The order is the caller's: the same jobs asked for the other way round.
        assert await store.adapter.release(leases=[j.lease for j in (*taken, last)]) == 3
        assert (await store.acquire_one(queues=["low", "high"])).id == low.id

    async def test_acquire_without_queues_takes_from_any_queue(self, store: StateHarness) -> None:
        jobs = [store.new_job(queue=q) for q in ("a", "b", "c")]
        await store.seed(*jobs)
        taken = await store.acquire(queues=None, limit=10)
        assert {j.id for j in taken} == {j.id for j in jobs}

    async def test_acquire_ignores_queues_not_asked_for(self, store: StateHarness) -> None:
        await store.seed(store.new_job(queue="elsewhere"))
        assert await store.acquire(queues=["default"]) == []
        assert await store.acquire(queues=[]) == []

    async def test_acquire_skips_paused_queues_until_resumed(self, store: StateHarness) -> None:
        paused, open_ = store.new_job(queue="paused"), store.new_job(queue="open")
        await store.seed(paused, open_)
        async with rolled_back(store.adapter.transaction()) as tx:
            await store.adapter.set_queue_paused(tx, queue="open", paused=True)
        await store.adapter.set_queue_paused(None, queue="paused", paused=True)
        taken = await store.acquire(queues=["paused", "open"])
        assert [j.id for j in taken] == [open_.id]
        assert await store.adapter.release(leases=[j.lease for j in taken]) == 1
        assert [j.id for j in await store.acquire(queues=None)] == [open_.id]
        await store.adapter.set_queue_paused(None, queue="paused", paused=False)
        assert (await store.acquire_one(queues=["paused"])).id == paused.id

    async def test_acquire_returns_at_most_limit_jobs(self, store: StateHarness) -> None:
        await store.seed(*(store.new_job() for _ in range(5)))
        assert await store.acquire(limit=0) == []
        assert len(await store.acquire(limit=3)) == 3
        assert len(await store.acquire(limit=3)) == 2
        assert await store.acquire(limit=3) == []

    async def test_acquire_takes_the_best_jobs_when_limited(self, store: StateHarness) -> None:
        jobs = [store.new_job(priority=p) for p in (4, 1, 3, 2)]
        await store.seed(*jobs)
        assert sorted(j.priority for j in await store.acquire(limit=2)) == [1, 2]

    async def test_acquire_leases_each_type_for_its_own_duration(self, store: StateHarness) -> None:
        await store.seed(store.new_job(ALPHA), store.new_job(BETA))
        taken = await store.adapter.acquire(
            worker_id="worker-a",
            leases={ALPHA: timedelta(seconds=30), BETA: timedelta(seconds=300)},
            queues=["default"],
            limit=2,
        )
        until = {j.type_name: j.leased_until for j in taken}
        assert set(until) == {ALPHA, BETA}
        assert abs(until[BETA] - until[ALPHA] - timedelta(seconds=270)) < CLOCK_SLACK

    async def test_acquire_ignores_types_not_asked_for(self, store: StateHarness) -> None:
        await store.seed(store.new_job(ALPHA), store.new_job("conformance.other"))
        taken = await store.acquire(ALPHA, limit=10)
        assert [j.type_name for j in taken] == [ALPHA]
        assert await store.acquire(ALPHA, BETA) == []
        assert (
            await store.adapter.acquire(
                worker_id="worker-a", leases={}, queues=["default"], limit=10
            )
            == []
        )

    async def test_acquire_skips_running_and_finished_jobs(self, store: StateHarness) -> None:
        await store.seed(store.new_job(), store.new_job())
        running = await store.acquire_one()
        finished = await store.acquire_one()
        await store.adapter.complete(
            None, completions=[Completion(finished.id, finished.lease_token, "null")]
        )
        assert await store.acquire() == []
        assert (await store.job(running.id)).status is JobStatus.RUNNING

    async def test_concurrent_acquirers_never_share_a_job(self, store: StateHarness) -> None:
        jobs = [store.new_job(priority=i % 3) for i in range(200)]
        await store.seed(*jobs)
        taken: dict[str, list[AcquiredJob]] = {}

        async def drain(worker: str) -> None:
            mine = taken.setdefault(worker, [])
            while batch := await store.acquire(worker=worker, limit=7):
                mine.extend(batch)

        with anyio.fail_after(self.test_timeout):
            async with anyio.create_task_group() as tg:
                for n in range(8):
                    tg.start_soon(drain, f"worker-{n}")

        everything = [job.id for batch in taken.values() for job in batch]
        assert len(everything) == len(set(everything)), "a job was handed to two acquirers"
        assert set(everything) == {job.id for job in jobs}
        tokens = [job.lease_token for batch in taken.values() for job in batch]
        assert len(set(tokens)) == len(tokens)
        busy = sum(1 for batch in taken.values() if batch)
        assert busy > 1, "only one acquirer got jobs: the test exercised no concurrency"

    @requires(DueTimes)
    async def test_next_due_is_the_wait_until_the_earliest_job_not_due_yet(
        self, store: StateHarness
    ) -> None:
        types, queues = [ALPHA], ["default", "mail"]
        assert await store.adapter.next_due(type_names=types, queues=queues) is None
        await store.seed(store.new_job())  # due now: the acquire's business, not next_due's
        assert await store.adapter.next_due(type_names=types, queues=queues) is None
        await store.seed(
            store.new_job(run_after=timedelta(hours=2)),
            store.new_job(queue="mail", priority=7, run_after=timedelta(minutes=30)),
            store.new_job(priority=-3, run_after=timedelta(hours=1)),
        )
        wait = await store.adapter.next_due(type_names=types, queues=queues)
        assert wait is not None
        assert abs(wait - 1800) < CLOCK_SLACK.total_seconds() * 5

    @requires(DueTimes)
    async def test_next_due_counts_a_job_due_since_the_last_acquire_as_due_now(
        self, store: StateHarness
    ) -> None:
        """An acquire sent then may have seen it not due yet; a job due before that
        acquire was passed over by it and must not hide the next one."""
        types, queues = [ALPHA], ["default"]
        due_in = timedelta(seconds=0.5)
        seeded = datetime.now(UTC)
        await store.seed(store.new_job(run_after=due_in))
        await store.wait_for_store_clock(seeded + due_in + timedelta(seconds=0.5))

        async def next_due(sent_ago: float | None) -> float | None:
            sent = None if sent_ago is None else time.monotonic() - sent_ago
            return await store.adapter.next_due(type_names=types, queues=queues, missed_after=sent)

        assert await next_due(60) == 0.0
        assert await next_due(0) is None
        assert await next_due(None) is None
        await store.seed(store.new_job(run_after=timedelta(minutes=5)))
        wait = await next_due(0)
        assert wait is not None
        assert abs(wait - 300) < CLOCK_SLACK.total_seconds() * 5
        assert await next_due(60) == 0.0

    @requires(DueTimes)
    async def test_next_due_looks_only_at_the_given_types_and_queues(
        self, store: StateHarness
    ) -> None:
        await store.seed(
            store.new_job(BETA, run_after=timedelta(minutes=1)),
            store.new_job(queue="elsewhere", run_after=timedelta(minutes=2)),
            store.new_job(run_after=timedelta(minutes=3)),
        )
        wait = await store.adapter.next_due(type_names=[ALPHA], queues=["default"])
        assert wait is not None
        assert abs(wait - 180) < CLOCK_SLACK.total_seconds() * 5
        assert await store.adapter.next_due(type_names=[ALPHA], queues=["nowhere"]) is None
