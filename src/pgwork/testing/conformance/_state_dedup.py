"""Deduplication: one chain per (chain type, key) within the requested scope.

Role exercised: ``EnqueueStore`` (``insert_jobs`` with ``DedupSpec``).
"""

from __future__ import annotations

import time
from datetime import timedelta

import anyio

from pgwork.adapters.state import Completion, DedupSpec, InsertedJob, StateAdapter
from pgwork.records import JobStatus
from pgwork.testing.conformance._harness import LockWaiters, StateHarness, StateSuiteBase


class DedupConformance(StateSuiteBase):
    async def test_dedup_incomplete_matches_an_active_chain_only(self, store: StateHarness) -> None:
        first = store.new_job(dedup=DedupSpec("invoice-7"))
        [original] = await store.seed(first)
        assert not original.deduplicated
        [dup] = await store.seed(store.again(first))
        assert dup.deduplicated
        assert dup.job_id == first.id
        assert dup.chain_id == first.chain_id
        assert dup.status is JobStatus.PENDING
        assert (await store.job(first.id)).dedup_key == "invoice-7"

        held = await store.acquire_one()
        [running] = await store.seed(store.again(first))
        assert running.deduplicated
        assert running.status is JobStatus.RUNNING
        await store.adapter.complete(None, completions=[Completion(held.id, held.lease_token, "1")])
        later = store.again(first)
        [fresh] = await store.seed(later)
        assert not fresh.deduplicated
        assert fresh.job_id == later.id
        assert await store.exists(later.id)

    async def test_dedup_ignored_records_write_nothing(self, store: StateHarness) -> None:
        first = store.new_job(dedup=DedupSpec("k"))
        await store.seed(first)
        dup = store.again(first)
        await store.seed(dup)
        assert not await store.exists(dup.id)
        assert len(await store.acquire(limit=10)) == 1

    async def test_dedup_keys_are_per_chain_type(self, store: StateHarness) -> None:
        spec = DedupSpec("same-key")
        one = store.new_job(dedup=spec, chain_type_name="conformance.chain_one")
        two = store.new_job(dedup=spec, chain_type_name="conformance.chain_two")
        other_key = store.new_job(dedup=DedupSpec("other"), chain_type_name="conformance.chain_one")
        results = await store.seed(one, two, other_key)
        assert [r.deduplicated for r in results] == [False, False, False]

    async def test_dedup_ever_matches_finished_chains_too(self, store: StateHarness) -> None:
        first = store.new_job(dedup=DedupSpec("once", scope="ever"))
        await store.seed(first)
        held = await store.acquire_one()
        await store.adapter.complete(None, completions=[Completion(held.id, held.lease_token, "1")])
        [dup] = await store.seed(store.again(first))
        assert dup.deduplicated
        assert dup.job_id == first.id
        assert dup.status is JobStatus.COMPLETED

    async def test_dedup_window_matches_chains_created_within_it(self, store: StateHarness) -> None:
        hour = DedupSpec("hourly", scope="window", window=timedelta(hours=1))
        first = store.new_job(dedup=hour)
        await store.seed(first)
        held = await store.acquire_one()
        await store.adapter.complete(None, completions=[Completion(held.id, held.lease_token, "1")])
        [dup] = await store.seed(store.again(first))
        assert dup.deduplicated
        assert dup.job_id == first.id

    async def test_dedup_window_lets_a_new_chain_in_once_it_has_passed(
        self, store: StateHarness
    ) -> None:
        window = timedelta(seconds=0.3)
        short = DedupSpec("brief", scope="window", window=window)
        first = store.new_job(dedup=short)
        await store.seed(first)
        # Deduplicated attempts write nothing, so retrying until one gets through waits
        # for the window to pass on the store's clock.
        deadline = time.monotonic() + self.expiry_timeout
        while True:
            [result] = await store.seed(store.again(first))
            if not result.deduplicated:
                break
            assert result.job_id == first.id
            assert time.monotonic() < deadline, "the dedup window never passed"
            await anyio.sleep(self.poll)
        assert result.job_id != first.id
        created = {
            j.id: j.created_at
            for j in await store.adapter.get_jobs(None, job_ids=[first.id, result.job_id])
        }
        assert created[result.job_id] - created[first.id] >= window, (
            "a new chain got in while the earlier one was still within the window"
        )

    async def test_duplicates_within_one_batch_fold_into_the_first(
        self, store: StateHarness
    ) -> None:
        a = store.new_job(dedup=DedupSpec("batch"))
        b = store.again(a)
        c = store.new_job(dedup=DedupSpec("another"))
        d = store.again(a)
        results = await store.seed(a, b, c, d)
        assert [r.deduplicated for r in results] == [False, True, False, True]
        assert results[1].job_id == a.id
        assert results[3].chain_id == a.chain_id
        assert {j.id for j in await store.acquire(limit=10)} == {a.id, c.id}

    async def test_concurrent_enqueue_of_a_key_waits_for_the_first_commit_then_dedups(
        self,
        state_adapter: StateAdapter,
        store: StateHarness,
        lock_waiters: LockWaiters | None,
    ) -> None:
        spec = DedupSpec("race")
        first = store.new_job(dedup=spec)
        second = store.again(first)
        events: list[str] = []
        results: dict[str, InsertedJob] = {}
        second_inserted = anyio.Event()

        async def enqueue_second() -> None:
            async with state_adapter.transaction() as tx:
                [results["second"]] = await state_adapter.insert_jobs(tx, jobs=[second])
                events.append("second inserted")
                second_inserted.set()

        with anyio.fail_after(self.test_timeout):
            # The transaction commits as the block ends; the task group then waits.
            async with anyio.create_task_group() as tg, state_adapter.transaction() as tx:
                [results["first"]] = await state_adapter.insert_jobs(tx, jobs=[first])
                tg.start_soon(enqueue_second)
                await self._until_blocked(second_inserted, lock_waiters)
                assert not second_inserted.is_set(), (
                    "a concurrent enqueue of the same dedup key went through while the "
                    "first was uncommitted"
                )
                events.append("first committing")
        assert events == ["first committing", "second inserted"]
        assert not results["first"].deduplicated
        assert results["second"].deduplicated
        assert results["second"].job_id == first.id
        assert not await store.exists(second.id)

    async def test_concurrent_enqueues_of_other_keys_do_not_wait(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        held = store.new_job(dedup=DedupSpec("held"))
        others = [store.new_job(dedup=DedupSpec("other")), store.new_job()]
        went_through = anyio.Event()

        async def enqueue_others() -> None:
            await store.seed(*others)
            went_through.set()

        with anyio.fail_after(self.test_timeout):
            async with anyio.create_task_group() as tg, state_adapter.transaction() as tx:
                await state_adapter.insert_jobs(tx, jobs=[held])
                tg.start_soon(enqueue_others)
                # Finishing while the first transaction is still open is the proof.
                await went_through.wait()
        assert all([await store.exists(job.id) for job in (held, *others)])

    async def _until_blocked(self, done: anyio.Event, lock_waiters: LockWaiters | None) -> None:
        """Return once the second writer is seen waiting (probe) or, without a probe,
        once it has failed to finish for ``blocking_grace`` seconds."""
        if lock_waiters is None:
            with anyio.move_on_after(self.blocking_grace):
                await done.wait()
            return
        deadline = time.monotonic() + self.expiry_timeout
        while not done.is_set() and await lock_waiters() < 1:
            assert time.monotonic() < deadline, "the second enqueue never started waiting"
            await anyio.sleep(self.poll / 5)
