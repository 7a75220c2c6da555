"""A job's attempt history: every failed attempt kept, in order, capped, never lost.

Role exercised: ``WorkerStore`` (``fail``, ``reap``, ``complete``) and ``ReadStore``
(``get_jobs``).
"""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

from pgwork.adapters.state import Completion, Failure
from pgwork.records import (
    ATTEMPT_HISTORY_LIMIT,
    HISTORY_TRACEBACK_LIMIT,
    AttemptError,
    JobStatus,
)
from pgwork.testing.conformance._harness import StateHarness, StateSuiteBase


def _error(n: int) -> AttemptError:
    return AttemptError(type="ValueError", message=f"boom {n}", traceback=f"Traceback {n}")


async def _fail_attempts(
    store: StateHarness, job_id: UUID, count: int, *, last_for_good: bool = False
) -> None:
    """Run ``count`` attempts of ``job_id``, each failing with ``_error(attempt)`` and
    due again at once (the last one for good when ``last_for_good``)."""
    for n in range(1, count + 1):
        held = await store.acquire_one(worker=f"worker-{n}")
        assert (held.id, held.attempt) == (job_id, n)
        retry = None if last_for_good and n == count else timedelta(0)
        failure = Failure(held.id, held.lease_token, _error(n), retry, timedelta(seconds=n))
        assert await store.adapter.fail(None, failures=[failure]) == [True]


class AttemptHistoryConformance(StateSuiteBase):
    async def test_each_failed_attempt_is_kept_in_order_with_its_error(
        self, store: StateHarness
    ) -> None:
        new = store.new_job(max_attempts=3)
        await store.seed(new)
        assert (await store.job(new.id)).attempt_history == ()
        await _fail_attempts(store, new.id, 3, last_for_good=True)

        job = await store.job(new.id)
        assert job.status is JobStatus.FAILED
        history = job.attempt_history
        assert [a.attempt for a in history] == [1, 2, 3]
        assert [a.error for a in history] == [_error(1), _error(2), _error(3)]
        assert [a.worker for a in history] == ["worker-1", "worker-2", "worker-3"]
        assert [a.ran_for for a in history] == [timedelta(seconds=n) for n in (1, 2, 3)]
        assert history[0].at <= history[1].at <= history[2].at
        assert job.last_attempt_at is not None
        assert abs(history[2].at - job.last_attempt_at) < timedelta(milliseconds=1)
        assert job.last_attempt_error == _error(3)

    async def test_the_history_keeps_the_newest_entries_up_to_its_limit(
        self, store: StateHarness
    ) -> None:
        attempts = ATTEMPT_HISTORY_LIMIT + 3
        new = store.new_job(max_attempts=attempts + 1)
        await store.seed(new)
        await _fail_attempts(store, new.id, attempts)

        history = (await store.job(new.id)).attempt_history
        assert [a.attempt for a in history] == list(range(4, attempts + 1))
        assert history[-1].error == _error(attempts)

    async def test_a_job_that_completes_after_failures_keeps_them(
        self, store: StateHarness
    ) -> None:
        new = store.new_job(max_attempts=3)
        await store.seed(new)
        await _fail_attempts(store, new.id, 2)
        held = await store.acquire_one()
        assert held.attempt == 3
        [done] = await store.adapter.complete(
            None, completions=[Completion(held.id, held.lease_token, '"ok"')]
        )
        assert done.accepted

        job = await store.job(new.id)
        assert job.status is JobStatus.COMPLETED
        assert [(a.attempt, a.error) for a in job.attempt_history] == [
            (1, _error(1)),
            (2, _error(2)),
        ]

    async def test_an_entry_keeps_the_end_of_a_long_traceback(self, store: StateHarness) -> None:
        await store.seed(store.new_job())
        held = await store.acquire_one()
        traceback = "start " + "x" * (3 * HISTORY_TRACEBACK_LIMIT) + " raised here"
        error = AttemptError(type="KeyError", message="'id'", traceback=traceback)
        await store.adapter.fail(None, failures=[Failure(held.id, held.lease_token, error, None)])

        job = await store.job(held.id)
        assert job.last_attempt_error == error  # the last error is stored whole
        [entry] = job.attempt_history
        assert entry.ran_for is None  # the failure did not say
        kept = entry.error.traceback
        assert kept is not None
        assert kept.endswith(" raised here")
        assert len(kept) == HISTORY_TRACEBACK_LIMIT + 1  # and the mark of the cut
        assert (entry.error.type, entry.error.message) == ("KeyError", "'id'")

    async def test_a_refused_failure_adds_no_entry(self, store: StateHarness) -> None:
        await store.seed(store.new_job())
        held = await store.acquire_one()
        forged = Failure(held.id, UUID(int=1), _error(1), None)
        assert await store.adapter.fail(None, failures=[forged]) == [False]
        assert (await store.job(held.id)).attempt_history == ()

    async def test_an_attempt_taken_back_by_the_reaper_is_kept(self, store: StateHarness) -> None:
        new = store.new_job(max_attempts=3)
        await store.seed(new)
        await store.acquire_one(worker="worker-a", lease=self.short_lease)
        await store.reap_when_expired(timeout=self.expiry_timeout)

        [entry] = (await store.job(new.id)).attempt_history
        assert (entry.attempt, entry.worker, entry.ran_for) == (1, "worker-a", None)
        assert entry.error.type == "LeaseExpired"
        assert "worker-a" in entry.error.message
