"""Debounce: a burst of enqueues of one key becomes one job, due once the burst settles.

Role exercised: the ``Debouncing`` capability (``debounce_jobs``). Times are read on
the store's clock: a job's start and deadline are compared with its ``created_at``.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Literal

import anyio

from pgwork.adapters.state import (
    Debounce,
    Debouncing,
    Failure,
    InsertedJob,
    NewJob,
    StateAdapter,
)
from pgwork.records import AttemptError, JobStatus
from pgwork.testing.conformance._harness import (
    LockWaiters,
    RecordingNotify,
    StateHarness,
    StateSuiteBase,
    requires,
)

HOUR = timedelta(hours=1)


async def debounce(
    store: StateHarness, *jobs: NewJob, notify: RecordingNotify | None = None
) -> list[InsertedJob]:
    """``debounce_jobs`` in one transaction of the store's own, committed."""
    adapter = store.adapter
    assert isinstance(adapter, Debouncing)
    async with adapter.transaction() as tx:
        return await adapter.debounce_jobs(tx, jobs=list(jobs), notify=notify)


def debounced(
    store: StateHarness,
    key: str,
    input: Any,
    *,
    delay: timedelta = HOUR,
    max_wait: timedelta = 2 * HOUR,
    keep: Literal["last", "first"] = "last",
    chain_type_name: str | None = None,
) -> NewJob:
    """A new chain's first job, debounced on ``key``, in a chain of the suite's type or
    of ``chain_type_name``."""
    spec = Debounce(key, delay=delay, max_wait=max_wait, keep=keep)
    if chain_type_name is None:
        return store.new_job(input=input, dedup=spec)
    return store.new_job(input=input, dedup=spec, chain_type_name=chain_type_name)


@requires(Debouncing)
class DebounceConformance(StateSuiteBase):
    async def test_debounce_first_enqueue_is_due_after_its_delay_with_its_deadline(
        self, store: StateHarness
    ) -> None:
        notify = RecordingNotify()
        first = debounced(store, "doc-1", {"v": 1}, delay=HOUR, max_wait=3 * HOUR)
        [result] = await debounce(store, first, notify=notify)
        assert (result.job_id, result.chain_id) == (first.id, first.id)
        assert not result.deduplicated
        assert not result.debounced
        assert result.status is JobStatus.PENDING
        job = await store.job(first.id)
        assert job.input == {"v": 1}
        assert job.dedup_key == "doc-1"
        assert job.scheduled_at - job.created_at == HOUR
        assert job.debounce_deadline is not None
        assert job.debounce_deadline - job.created_at == 3 * HOUR
        assert job.debouncing
        # Announced with the time it is due, not as ready now.
        assert [(n.queue, n.at is not None) for n in notify.published] == [("default", True)]

    async def test_debounce_merge_takes_the_new_input_and_pushes_the_start_back(
        self, store: StateHarness
    ) -> None:
        first = debounced(store, "doc-2", {"v": 1})
        await debounce(store, first)
        before = await store.job(first.id)
        await store.wait_for_store_clock(before.created_at)
        notify = RecordingNotify()
        again = debounced(store, "doc-2", {"v": 2})
        [merged] = await debounce(store, again, notify=notify)
        assert (merged.job_id, merged.chain_id) == (first.id, first.id)
        assert merged.deduplicated
        assert merged.debounced
        assert merged.status is JobStatus.PENDING
        assert not await store.exists(again.id)
        after = await store.job(first.id)
        assert after.input == {"v": 2}
        assert after.scheduled_at > before.scheduled_at, "the merge did not push the start back"
        assert after.debounce_deadline == before.debounce_deadline
        assert after.created_at == before.created_at
        assert notify.published == [], "a merge announced a job that is not due sooner"

    async def test_debounce_keep_first_keeps_the_input_and_still_pushes_the_start_back(
        self, store: StateHarness
    ) -> None:
        first = debounced(store, "doc-3", {"v": 1}, keep="first")
        await debounce(store, first)
        before = await store.job(first.id)
        await store.wait_for_store_clock(before.created_at)
        [merged] = await debounce(store, debounced(store, "doc-3", {"v": 2}, keep="first"))
        assert merged.debounced
        assert merged.job_id == first.id
        after = await store.job(first.id)
        assert after.input == {"v": 1}
        assert after.scheduled_at > before.scheduled_at

    async def test_debounce_never_pushes_the_start_past_the_deadline(
        self, store: StateHarness
    ) -> None:
        # The deadline is a millisecond after the first start: any later enqueue would
        # push the start past it, and is held to it instead.
        first = debounced(store, "doc-4", {"v": 1}, delay=HOUR, max_wait=HOUR + _MS)
        await debounce(store, first)
        before = await store.job(first.id)
        assert before.debounce_deadline is not None
        await store.wait_for_store_clock(before.created_at + 10 * _MS)
        [merged] = await debounce(
            store, debounced(store, "doc-4", {"v": 2}, delay=HOUR, max_wait=HOUR + _MS)
        )
        assert merged.debounced
        after = await store.job(first.id)
        assert after.scheduled_at == before.debounce_deadline, (
            f"the start moved to {after.scheduled_at}, past the deadline {before.debounce_deadline}"
        )
        assert after.input == {"v": 2}

    async def test_debounce_never_moves_the_start_earlier(self, store: StateHarness) -> None:
        first = debounced(store, "doc-5", {"v": 1}, delay=2 * HOUR, max_wait=3 * HOUR)
        await debounce(store, first)
        before = await store.job(first.id)
        await debounce(store, debounced(store, "doc-5", {"v": 2}, delay=HOUR, max_wait=3 * HOUR))
        after = await store.job(first.id)
        assert after.scheduled_at == before.scheduled_at
        assert after.input == {"v": 2}

    async def test_debounce_after_the_job_started_starts_a_new_chain(
        self, store: StateHarness
    ) -> None:
        first = debounced(store, "doc-6", {"v": 1}, delay=_MS, max_wait=_MS)
        await debounce(store, first)
        held = await store.acquire_when_due()
        assert held.id == first.id
        again = debounced(store, "doc-6", {"v": 2})
        [result] = await debounce(store, again)
        assert not result.deduplicated
        assert not result.debounced
        assert result.job_id == again.id
        running = await store.job(first.id)
        assert running.status is JobStatus.RUNNING
        assert running.input == {"v": 1}, "a merge changed a job that had started"
        assert not running.debouncing
        assert (await store.job(again.id)).input == {"v": 2}

    async def test_debounce_after_a_retry_is_pending_again_starts_a_new_chain(
        self, store: StateHarness
    ) -> None:
        first = debounced(store, "doc-7", {"v": 1}, delay=_MS, max_wait=_MS)
        await debounce(store, first)
        held = await store.acquire_when_due()
        error = AttemptError(type="RuntimeError", message="again")
        assert await store.adapter.fail(
            None, failures=[Failure(held.id, held.lease_token, error, HOUR)]
        ) == [True]
        retried = await store.job(first.id)
        assert retried.status is JobStatus.PENDING
        assert retried.started_at is not None
        again = debounced(store, "doc-7", {"v": 2})
        [result] = await debounce(store, again)
        assert not result.debounced
        assert result.job_id == again.id
        assert (await store.job(first.id)).input == {"v": 1}

    async def test_debounce_after_the_chain_was_cancelled_starts_a_new_chain(
        self, store: StateHarness
    ) -> None:
        first = debounced(store, "doc-8", {"v": 1})
        await debounce(store, first)
        async with store.adapter.transaction() as tx:
            await store.adapter.cancel_chains(tx, chain_ids=[first.id])
        again = debounced(store, "doc-8", {"v": 2})
        [result] = await debounce(store, again)
        assert not result.debounced
        assert result.job_id == again.id
        assert (await store.job(first.id)).status is JobStatus.CANCELLED

    async def test_debounce_keys_are_per_chain_type(self, store: StateHarness) -> None:
        one = debounced(store, "same", {"v": 1}, chain_type_name="conformance.chain_one")
        two = debounced(store, "same", {"v": 2}, chain_type_name="conformance.chain_two")
        other = debounced(store, "other", {"v": 3}, chain_type_name="conformance.chain_one")
        results = await debounce(store, one, two, other)
        assert [r.debounced for r in results] == [False, False, False]
        assert [r.job_id for r in results] == [one.id, two.id, other.id]

    async def test_debounce_within_one_batch_merges_in_order(self, store: StateHarness) -> None:
        a = debounced(store, "batch", {"v": 1})
        b = debounced(store, "another", {"v": 2})
        c = debounced(store, "batch", {"v": 3})
        d = debounced(store, "batch", {"v": 4}, keep="first")
        results = await debounce(store, a, b, c, d)
        assert [(r.deduplicated, r.debounced) for r in results] == [
            (False, False),
            (False, False),
            (True, True),
            (True, True),
        ]
        assert [r.job_id for r in results] == [a.id, b.id, a.id, a.id]
        # c replaced a's input; d kept it.
        assert (await store.job(a.id)).input == {"v": 3}
        assert not await store.exists(c.id)
        assert not await store.exists(d.id)
        # A later batch of the key merges into the job the first one left.
        [merged] = await debounce(store, debounced(store, "batch", {"v": 5}))
        assert merged.debounced
        assert merged.job_id == a.id
        assert (await store.job(a.id)).input == {"v": 5}

    async def test_debounce_within_one_batch_announces_the_start_its_deadline_allows(
        self, store: StateHarness
    ) -> None:
        """The first enqueue of the batch sets the deadline, ten minutes away; a later
        one's hour of delay is held to it, and so is the time the job is announced for
        (the store's clock and the caller's agree within a minute here)."""
        notify = RecordingNotify()
        soon = debounced(store, "capped", {"v": 1}, delay=HOUR / 6, max_wait=HOUR / 6)
        later = debounced(store, "capped", {"v": 2}, delay=HOUR, max_wait=2 * HOUR)
        await debounce(store, soon, later, notify=notify)
        job = await store.job(soon.id)
        assert job.scheduled_at - job.created_at == HOUR / 6
        [notice] = notify.published
        assert notice.at is not None
        assert abs(notice.at - job.scheduled_at.timestamp()) < 60, (
            f"announced for {notice.at}, due at {job.scheduled_at.timestamp()}"
        )

    async def test_concurrent_debounce_of_a_key_waits_for_the_first_commit_then_merges(
        self,
        state_adapter: StateAdapter,
        store: StateHarness,
        lock_waiters: LockWaiters | None,
    ) -> None:
        first = debounced(store, "race", {"v": 1})
        second = debounced(store, "race", {"v": 2})
        events: list[str] = []
        results: dict[str, InsertedJob] = {}
        second_done = anyio.Event()

        async def enqueue_second() -> None:
            async with state_adapter.transaction() as tx:
                [results["second"]] = await state_adapter.debounce_jobs(tx, jobs=[second])
                events.append("second merged")
                second_done.set()

        with anyio.fail_after(self.test_timeout):
            async with anyio.create_task_group() as tg, state_adapter.transaction() as tx:
                [results["first"]] = await state_adapter.debounce_jobs(tx, jobs=[first])
                tg.start_soon(enqueue_second)
                await _until_blocked(self, second_done, lock_waiters)
                assert not second_done.is_set(), (
                    "a concurrent debounce of the same key went through while the first "
                    "was uncommitted"
                )
                events.append("first committing")
        assert events == ["first committing", "second merged"]
        assert not results["first"].debounced
        assert results["second"].debounced
        assert results["second"].job_id == first.id
        assert not await store.exists(second.id)
        assert (await store.job(first.id)).input == {"v": 2}

    async def test_a_debounced_job_is_run_once_and_the_next_enqueue_starts_again(
        self, store: StateHarness
    ) -> None:
        first = debounced(store, "doc-9", {"v": 1}, delay=_MS, max_wait=_MS)
        await debounce(store, first)
        held = await store.acquire_when_due()
        await store.finish(held.id, "done")
        assert not (await store.job(first.id)).debouncing
        again = debounced(store, "doc-9", {"v": 2})
        [result] = await debounce(store, again)
        assert not result.debounced
        assert result.job_id == again.id


_MS = timedelta(milliseconds=1)


async def _until_blocked(
    suite: StateSuiteBase, done: anyio.Event, lock_waiters: LockWaiters | None
) -> None:
    """Return once the second writer is seen waiting (probe) or, without a probe, once
    it has failed to finish for ``blocking_grace`` seconds."""
    if lock_waiters is None:
        with anyio.move_on_after(suite.blocking_grace):
            await done.wait()
        return
    deadline = time.monotonic() + suite.expiry_timeout
    while not done.is_set() and await lock_waiters() < 1:
        assert time.monotonic() < deadline, "the second enqueue never started waiting"
        await anyio.sleep(suite.poll / 5)
