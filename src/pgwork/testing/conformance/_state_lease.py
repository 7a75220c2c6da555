"""Holding a lease: renewing it, handing the job back, rescheduling it.

Role exercised: ``WorkerStore`` (``renew``, ``renew_in_line``, ``release``,
``reschedule``).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from pgwork.adapters.state import Completion, InLineRenewal, Lease
from pgwork.records import JobStatus
from pgwork.testing.conformance._harness import StateHarness, StateSuiteBase, requires
from pgwork.testing.conformance._rollback import rolled_back

CLOCK_SLACK = timedelta(seconds=1)


class LeaseConformance(StateSuiteBase):
    async def test_renew_extends_a_lease_held_with_its_token(self, store: StateHarness) -> None:
        await store.seed(store.new_job())
        held = await store.acquire_one(lease=timedelta(seconds=30))
        [result] = await store.adapter.renew(
            leases=[held.lease], duration={held.id: timedelta(seconds=600)}
        )
        assert result.job_id == held.id
        assert result.renewed
        assert result.leased_until is not None
        assert abs(result.leased_until - held.leased_until - timedelta(seconds=570)) < CLOCK_SLACK
        job = await store.job(held.id)
        assert job.leased_until == result.leased_until
        assert job.status is JobStatus.RUNNING

    async def test_renew_with_a_wrong_token_changes_nothing_and_reports_status(
        self, store: StateHarness
    ) -> None:
        await store.seed(store.new_job(), store.new_job())
        held = await store.acquire_one()
        done = await store.acquire_one()
        await store.adapter.complete(None, completions=[Completion(done.id, done.lease_token, "1")])
        missing = uuid.uuid4()
        forged = Lease(held.id, uuid.uuid4())
        results = await store.adapter.renew(
            leases=[forged, done.lease, Lease(missing, uuid.uuid4())],
            duration={held.id: self.lease, done.id: self.lease, missing: self.lease},
        )
        by_id = {r.job_id: r for r in results}
        assert set(by_id) == {held.id, done.id, missing}
        assert not by_id[held.id].renewed
        assert by_id[held.id].status is JobStatus.RUNNING
        assert not by_id[done.id].renewed
        assert by_id[done.id].status is JobStatus.COMPLETED
        assert not by_id[missing].renewed
        assert by_id[missing].status is None
        assert all(r.leased_until is None for r in results)
        assert (await store.job(held.id)).leased_until == held.leased_until

    async def test_renew_defers_a_lease_whose_row_another_transaction_holds(
        self, store: StateHarness
    ) -> None:
        """Renewal never waits on a row a caller holds (here an uncommitted cancel): that
        lease is reported deferred (neither renewed nor lost) and the others are
        renewed; once the caller lets go, it is renewed again."""
        await store.seed(store.new_job(), store.new_job())
        held = await store.acquire_one(lease=timedelta(seconds=30))
        free = await store.acquire_one(lease=timedelta(seconds=30))
        duration = {held.id: timedelta(seconds=600), free.id: timedelta(seconds=600)}
        async with rolled_back(store.adapter.transaction()) as tx:
            await store.adapter.cancel_chains(tx, chain_ids=[held.id])
            results = await store.adapter.renew(leases=[held.lease, free.lease], duration=duration)
            by_id = {r.job_id: r for r in results}
            assert not by_id[held.id].renewed
            assert by_id[held.id].deferred
            assert by_id[free.id].renewed
            assert not by_id[free.id].deferred
        [again] = await store.adapter.renew(leases=[held.lease], duration=duration)
        assert again.renewed
        assert not again.deferred

    @requires(InLineRenewal)
    async def test_renew_in_line_renews_once_the_other_transaction_lets_go(
        self, store: StateHarness
    ) -> None:
        """A lease whose row a caller holds is renewed in line: not while the caller
        holds the row (deferred when the wait runs out), and from the moment the row
        is got once the caller rolled back."""
        await store.seed(store.new_job())
        held = await store.acquire_one(lease=timedelta(seconds=30))
        long = timedelta(seconds=600)
        async with rolled_back(store.adapter.transaction()) as tx:
            await store.adapter.cancel_chains(tx, chain_ids=[held.id])
            waited = await store.adapter.renew_in_line(
                lease=held.lease, duration=long, wait=timedelta(milliseconds=50)
            )
            assert (waited.renewed, waited.deferred) == (False, True)
            assert (await store.job(held.id)).leased_until == held.leased_until
        result = await store.adapter.renew_in_line(
            lease=held.lease, duration=long, wait=timedelta(seconds=5)
        )
        assert (result.renewed, result.deferred) == (True, False)
        assert result.leased_until is not None
        assert abs(result.leased_until - held.leased_until - timedelta(seconds=570)) < CLOCK_SLACK
        assert (await store.job(held.id)).leased_until == result.leased_until

    @requires(InLineRenewal)
    async def test_renew_in_line_reports_a_lease_the_other_transaction_ended(
        self, store: StateHarness
    ) -> None:
        await store.seed(store.new_job())
        held = await store.acquire_one()
        async with store.adapter.transaction() as tx:
            await store.adapter.cancel_chains(tx, chain_ids=[held.id])
        result = await store.adapter.renew_in_line(
            lease=held.lease, duration=self.lease, wait=timedelta(seconds=5)
        )
        assert (result.renewed, result.deferred) == (False, False)
        assert result.status is JobStatus.CANCELLED

    async def test_a_workers_completion_is_deferred_while_another_transaction_holds_its_row(
        self, store: StateHarness
    ) -> None:
        """A worker's own batch of completions (no transaction given) skips a row a caller
        holds: that completion is deferred, not refused and not waited on, and the rest
        of the batch is written."""
        await store.seed(store.new_job(), store.new_job())
        held = await store.acquire_one()
        free = await store.acquire_one()
        completions = [
            Completion(held.id, held.lease_token, '"held"'),
            Completion(free.id, free.lease_token, '"free"'),
        ]
        async with rolled_back(store.adapter.transaction()) as tx:
            await store.adapter.cancel_chains(tx, chain_ids=[held.id])
            first, second = await store.adapter.complete(None, completions=completions)
            assert (first.accepted, first.deferred) == (False, True)
            assert (second.accepted, second.deferred) == (True, False)
        [later] = await store.adapter.complete(None, completions=completions[:1])
        assert later.accepted
        assert (await store.job(held.id)).output == "held"

    async def test_renew_of_nothing_returns_nothing(self, store: StateHarness) -> None:
        assert await store.adapter.renew(leases=[], duration={}) == []

    async def test_release_hands_the_attempt_back_and_job_is_acquirable_at_once(
        self, store: StateHarness
    ) -> None:
        new = store.new_job()
        await store.seed(new)
        held = await store.acquire_one(worker="worker-a")
        assert await store.adapter.release(leases=[held.lease]) == 1
        job = await store.job(new.id)
        assert job.status is JobStatus.PENDING
        assert job.attempt == 0
        assert job.leased_by is None
        assert job.leased_until is None
        again = await store.acquire_one(worker="worker-b")
        assert again.id == new.id
        assert again.attempt == 1
        assert again.lease_token != held.lease_token

    async def test_release_with_a_wrong_token_changes_nothing(self, store: StateHarness) -> None:
        await store.seed(store.new_job())
        held = await store.acquire_one()
        assert await store.adapter.release(leases=[Lease(held.id, uuid.uuid4())]) == 0
        assert await store.adapter.release(leases=[]) == 0
        job = await store.job(held.id)
        assert job.status is JobStatus.RUNNING
        assert job.attempt == 1

    async def test_reschedule_without_counting_hands_the_attempt_back(
        self, store: StateHarness
    ) -> None:
        await store.seed(store.new_job())
        held = await store.acquire_one()
        assert await store.adapter.reschedule(
            None, lease=held.lease, run_at=None, run_after=timedelta(hours=1), count_attempt=False
        )
        job = await store.job(held.id)
        assert job.status is JobStatus.PENDING
        assert job.attempt == 0
        assert job.leased_by is None
        assert job.leased_until is None
        assert job.scheduled_at > held.scheduled_at + timedelta(minutes=59)
        assert await store.acquire() == []

    async def test_reschedule_counting_the_attempt_keeps_it_and_honours_run_at(
        self, store: StateHarness
    ) -> None:
        await store.seed(store.new_job())
        held = await store.acquire_one()
        run_at = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)
        assert await store.adapter.reschedule(
            None, lease=held.lease, run_at=run_at, run_after=None, count_attempt=True
        )
        job = await store.job(held.id)
        assert job.status is JobStatus.PENDING
        assert job.attempt == 1
        assert job.scheduled_at == run_at

    async def test_rescheduled_job_runs_again_once_due(self, store: StateHarness) -> None:
        await store.seed(store.new_job())
        held = await store.acquire_one()
        assert await store.adapter.reschedule(
            None,
            lease=held.lease,
            run_at=None,
            run_after=timedelta(seconds=0.3),
            count_attempt=True,
        )
        again = await store.acquire_when_due(timeout=self.expiry_timeout)
        assert again.id == held.id
        assert again.attempt == 2

    async def test_reschedule_with_a_wrong_token_changes_nothing(self, store: StateHarness) -> None:
        await store.seed(store.new_job())
        held = await store.acquire_one()
        assert not await store.adapter.reschedule(
            None,
            lease=Lease(held.id, uuid.uuid4()),
            run_at=None,
            run_after=timedelta(hours=1),
            count_attempt=False,
        )
        job = await store.job(held.id)
        assert job.status is JobStatus.RUNNING
        assert job.attempt == 1
        assert job.leased_until == held.leased_until
