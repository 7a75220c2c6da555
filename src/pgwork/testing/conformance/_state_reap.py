"""Lost leases: reaping expired ones, fencing stale holders, atomic attempts.

Leases here really expire: the suite acquires with ``short_lease`` and polls ``reap``
until the store's own clock says so (bounded by ``expiry_timeout``). To know a lease
has expired without reading any clock, a test takes a *sentinel* job with the same
short lease right after the job under test: once the sentinel is reaped, the earlier
lease has run out too.

Role exercised: ``WorkerStore`` (``reap``, atomic attempts).
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import anyio
import pytest

from pgwork.adapters.state import (
    AcquiredJob,
    AtomicAttempts,
    ChainBlockers,
    Completion,
    Failure,
    Lease,
    StateAdapter,
)
from pgwork.records import AttemptError, ChainStatus, JobStatus
from pgwork.testing.conformance._harness import ALPHA, BETA, StateHarness, StateSuiteBase, requires
from pgwork.testing.conformance._rollback import rolled_back

BOOM = AttemptError(type="RuntimeError", message="late")


class ReapConformance(StateSuiteBase):
    async def test_reap_takes_only_expired_leases(self, store: StateHarness) -> None:
        await store.seed(store.new_job(), store.new_job())
        short = await store.acquire_one(lease=self.short_lease)
        long = await store.acquire_one(lease=self.lease)
        reaped = await store.reap_when_expired(timeout=self.expiry_timeout)
        assert [r.job_id for r in reaped] == [short.id]
        job = await store.job(long.id)
        assert job.status is JobStatus.RUNNING
        assert job.leased_until == long.leased_until

    async def test_reap_never_takes_the_excluded_workers_own_jobs(
        self, store: StateHarness
    ) -> None:
        await store.seed(store.new_job(), store.new_job())
        own = await store.acquire_one(worker="worker-a", lease=self.short_lease)
        sentinel = await store.acquire_one(worker="worker-b", lease=self.short_lease)
        reaped = await store.reap_when_expired(
            exclude_worker="worker-a", timeout=self.expiry_timeout
        )
        assert [r.job_id for r in reaped] == [sentinel.id]
        assert (await store.job(own.id)).status is JobStatus.RUNNING
        # Its lease has run out all the same: anyone else may take it back.
        others = await store.adapter.reap(type_names=[ALPHA], exclude_worker="worker-b", limit=10)
        assert [r.job_id for r in others] == [own.id]

    async def test_reap_takes_the_reapers_own_expired_leases_it_says_it_no_longer_holds(
        self, store: StateHarness
    ) -> None:
        await store.seed(store.new_job(), store.new_job(), store.new_job())
        kept, abandoned = await store.acquire(worker="worker-a", lease=self.short_lease, limit=2)
        sentinel = await store.acquire_one(worker="worker-b", lease=self.short_lease)
        reaped = await store.reap_when_expired(
            exclude_worker="worker-a", timeout=self.expiry_timeout
        )
        assert [r.job_id for r in reaped] == [sentinel.id]

        own = await store.adapter.reap(
            type_names=[ALPHA], exclude_worker="worker-a", limit=10, held=[kept.lease_token]
        )
        assert [(r.job_id, r.leased_by) for r in own] == [(abandoned.id, "worker-a")]
        assert (await store.job(kept.id)).status is JobStatus.RUNNING
        rest = await store.adapter.reap(
            type_names=[ALPHA], exclude_worker="worker-a", limit=10, held=[]
        )
        assert [r.job_id for r in rest] == [kept.id]

    async def test_reap_counts_the_attempt_and_returns_the_job_to_its_queue(
        self, store: StateHarness
    ) -> None:
        new = store.new_job(max_attempts=3)
        await store.seed(new)
        lost = await store.acquire_one(worker="worker-a", lease=self.short_lease)
        [reaped] = await store.reap_when_expired(timeout=self.expiry_timeout)
        assert (reaped.job_id, reaped.type_name, reaped.leased_by) == (new.id, ALPHA, "worker-a")
        assert reaped.attempt == 1
        assert reaped.status is JobStatus.PENDING
        job = await store.job(new.id)
        assert job.status is JobStatus.PENDING
        assert job.attempt == 1
        assert job.leased_by is None
        assert job.leased_until is None
        assert job.last_attempt_error is not None
        assert job.last_attempt_at is not None
        assert (await store.chain(new.chain_id)).status is ChainStatus.ACTIVE
        again = await store.acquire_one(worker="worker-b")
        assert again.id == new.id
        assert again.attempt == 2
        assert again.lease_token != lost.lease_token
        assert again.last_attempt_error == job.last_attempt_error

    async def test_reap_at_max_attempts_fails_the_job_and_its_chain(
        self, store: StateHarness
    ) -> None:
        new = store.new_job(max_attempts=1)
        await store.seed(new)
        await store.acquire_one(lease=self.short_lease)
        [reaped] = await store.reap_when_expired(timeout=self.expiry_timeout)
        assert reaped.status is JobStatus.FAILED
        assert reaped.attempt == 1
        job = await store.job(new.id)
        assert job.status is JobStatus.FAILED
        assert job.completed_at is not None
        assert job.last_attempt_error is not None
        chain = await store.chain(new.chain_id)
        assert chain.status is ChainStatus.FAILED
        assert chain.completed_at is not None
        assert await store.acquire() == []

    async def test_reaping_a_later_job_at_max_attempts_fails_the_chain(
        self, store: StateHarness
    ) -> None:
        new = store.new_job()
        await store.seed(new)
        first = await store.acquire_one()
        follow = store.continuation(first, max_attempts=1)
        await store.adapter.complete(
            None, completions=[Completion(first.id, first.lease_token, "1", follow)]
        )
        await store.acquire_one(BETA, lease=self.short_lease)
        [reaped] = await store.reap_when_expired(timeout=self.expiry_timeout)
        assert reaped.job_id == follow.id
        assert reaped.status is JobStatus.FAILED
        assert (await store.chain(new.chain_id)).status is ChainStatus.FAILED

    async def test_reap_takes_at_most_limit_jobs(self, store: StateHarness) -> None:
        await store.seed(*(store.new_job() for _ in range(3)))
        assert len(await store.acquire(lease=self.short_lease, limit=3)) == 3
        first = await store.reap_when_expired(limit=2, timeout=self.expiry_timeout)
        assert len(first) == 2
        rest = await store.adapter.reap(type_names=[ALPHA], exclude_worker="reaper", limit=2)
        assert len(rest) == 1
        assert {r.job_id for r in first}.isdisjoint({r.job_id for r in rest})

    async def test_reap_ignores_types_not_named(self, store: StateHarness) -> None:
        await store.seed(store.new_job(ALPHA), store.new_job(BETA))
        taken = await store.acquire(ALPHA, BETA, lease=self.short_lease, limit=2)
        assert len(taken) == 2
        reaped = await store.reap_when_expired(type_names=[ALPHA], timeout=self.expiry_timeout)
        assert [r.type_name for r in reaped] == [ALPHA]
        beta = next(j for j in taken if j.type_name == BETA)
        assert (await store.job(beta.id)).status is JobStatus.RUNNING
        assert await store.adapter.reap(type_names=[], exclude_worker="reaper", limit=10) == []

    @requires(AtomicAttempts)
    async def test_stale_holder_can_neither_renew_nor_complete_nor_fail(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        await store.seed(store.new_job())
        stale = await store.acquire_one(worker="worker-a", lease=self.short_lease)
        await store.reap_when_expired(exclude_worker="worker-b", timeout=self.expiry_timeout)
        fresh = await store.acquire_one(worker="worker-b")
        assert fresh.id == stale.id
        assert fresh.attempt == 2
        assert fresh.lease_token != stale.lease_token

        [renewed] = await state_adapter.renew(leases=[stale.lease], duration={stale.id: self.lease})
        assert not renewed.renewed
        assert renewed.status is JobStatus.RUNNING
        [completed] = await state_adapter.complete(
            None, completions=[Completion(stale.id, stale.lease_token, '"stale"')]
        )
        assert not completed.accepted
        assert await state_adapter.fail(
            None, failures=[Failure(stale.id, stale.lease_token, BOOM, None)]
        ) == [False]
        assert not await state_adapter.reschedule(
            None, lease=stale.lease, run_at=None, run_after=None, count_attempt=False
        )
        assert await state_adapter.release(leases=[stale.lease]) == 0
        async with state_adapter.transaction() as tx:
            assert not await state_adapter.begin_atomic(
                tx, lease=stale.lease, deadline=timedelta(seconds=30)
            )

        job = await store.job(fresh.id)
        assert job.status is JobStatus.RUNNING
        assert job.leased_by == "worker-b"
        assert job.attempt == 2
        assert job.leased_until == fresh.leased_until
        assert job.output is None
        assert job.last_attempt_error != BOOM
        [done] = await state_adapter.complete(
            None, completions=[Completion(fresh.id, fresh.lease_token, '"fresh"')]
        )
        assert done.accepted
        assert (await store.job(fresh.id)).output == "fresh"


@requires(AtomicAttempts)
class AtomicConformance(StateSuiteBase):
    async def test_begin_atomic_accepts_only_the_current_lease(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        await store.seed(store.new_job())
        held = await store.acquire_one()
        deadline = timedelta(seconds=30)
        async with state_adapter.transaction() as tx:
            forged = Lease(held.id, uuid.uuid4())
            assert not await state_adapter.begin_atomic(tx, lease=forged, deadline=deadline)
        async with state_adapter.transaction() as tx:
            assert await state_adapter.begin_atomic(tx, lease=held.lease, deadline=deadline)
            [result] = await state_adapter.complete(
                tx, completions=[Completion(held.id, held.lease_token, '"atomic"')]
            )
            assert result.accepted
        async with state_adapter.transaction() as tx:
            assert not await state_adapter.begin_atomic(tx, lease=held.lease, deadline=deadline)
        assert (await store.job(held.id)).output == "atomic"

    async def test_atomic_transaction_refuses_a_lease_that_lapsed_before_it_began(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        """Not reaped yet, but another worker may reap it at any moment: a handler that
        began on it could run beside the job's next attempt."""
        await store.seed(store.new_job())
        held = await store.acquire_one(lease=timedelta(seconds=0.3))
        leased_until = (await store.job(held.id)).leased_until
        assert leased_until is not None
        await store.wait_for_store_clock(leased_until)
        deadline = timedelta(seconds=30)
        async with state_adapter.atomic_transaction(lease=held.lease, deadline=deadline) as tx:
            assert tx is None
        async with state_adapter.transaction() as tx:
            assert not await state_adapter.begin_atomic(tx, lease=held.lease, deadline=deadline)

    async def test_atomic_transaction_commits_what_the_lease_holder_wrote_and_only_that(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        await store.seed(store.new_job(), store.new_job())
        first, second = await store.acquire(limit=2)
        deadline = timedelta(seconds=30)
        forged = Lease(first.id, uuid.uuid4())
        async with state_adapter.atomic_transaction(lease=forged, deadline=deadline) as tx:
            assert tx is None

        async def fail_after_writing() -> None:
            async with state_adapter.atomic_transaction(
                lease=second.lease, deadline=deadline
            ) as tx:
                assert tx is not None
                await state_adapter.complete(
                    tx, completions=[Completion(second.id, second.lease_token, '"lost"')]
                )
                raise RuntimeError("handler failed")

        with pytest.raises(RuntimeError, match="handler failed"):
            await fail_after_writing()
        assert (await store.job(second.id)).status is JobStatus.RUNNING
        async with state_adapter.atomic_transaction(lease=first.lease, deadline=deadline) as tx:
            assert tx is not None
            [result] = await state_adapter.complete(
                tx, completions=[Completion(first.id, first.lease_token, '"atomic"')]
            )
            assert result.accepted
        assert (await store.job(first.id)).output == "atomic"
        async with state_adapter.atomic_transaction(lease=first.lease, deadline=deadline) as tx:
            assert tx is None  # completed: the lease is spent

    @requires(ChainBlockers)
    async def test_complete_atomic_commits_the_transaction_with_its_completion(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        job, side = store.new_job(queue="work"), store.new_job(queue="work")
        await store.seed(job, side)
        dependant = store.new_job(BETA, queue="merge", blockers=[job.id])
        awaited = store.new_job(queue="work")
        await store.seed(dependant, awaited)
        await state_adapter.mark_chain_awaited(chain_id=awaited.id)
        held = {h.id: h for h in await store.acquire(limit=3, queues=["work"])}
        deadline = timedelta(seconds=30)
        async with state_adapter.atomic_transaction(
            lease=held[job.id].lease, deadline=deadline
        ) as tx:
            assert tx is not None
            # Stands for the handler's own writes: they commit with the completion.
            await state_adapter.complete(tx, completions=[_done(held[side.id], '"side"')])
            result = await state_adapter.complete_atomic(tx, completion=_done(held[job.id]))
        assert result.accepted
        assert result.chain_completed
        assert result.ready_queues == ("merge",)
        assert not result.chain_awaited
        assert (await store.job(job.id)).output == "atomic"
        assert (await store.job(side.id)).output == "side"
        assert (await store.job(dependant.id)).status is JobStatus.PENDING
        async with state_adapter.atomic_transaction(
            lease=held[awaited.id].lease, deadline=deadline
        ) as tx:
            assert tx is not None
            result = await state_adapter.complete_atomic(tx, completion=_done(held[awaited.id]))
        assert result.accepted
        assert result.chain_awaited

    async def test_refused_complete_atomic_commits_nothing_written_in_the_transaction(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        await store.seed(store.new_job(), store.new_job())
        job, side = await store.acquire(limit=2)
        async with state_adapter.atomic_transaction(lease=job.lease, deadline=self.lease) as tx:
            assert tx is not None
            await state_adapter.complete(tx, completions=[_done(side, '"side"')])
            # The handler ends its own job in the transaction: the lock cannot stop
            # that, and the completion behind it no longer holds a lease.
            await state_adapter.complete(tx, completions=[_done(job, '"early"')])
            result = await state_adapter.complete_atomic(tx, completion=_done(job))
        assert not result.accepted
        for held in (job, side):
            stored = await store.job(held.id)
            assert stored.status is JobStatus.RUNNING
            assert stored.output is None
        # Nothing is left locked: the job can still be completed by its holder.
        [done] = await state_adapter.complete(None, completions=[_done(job, '"later"')])
        assert done.accepted

    async def test_complete_atomic_refuses_a_continuation(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        await store.seed(store.new_job())
        job = await store.acquire_one()
        completion = Completion(job.id, job.lease_token, '"x"', store.continuation(job))
        async with rolled_back(
            state_adapter.atomic_transaction(lease=job.lease, deadline=self.lease)
        ) as tx:
            assert tx is not None
            with pytest.raises(ValueError, match="continuation"):
                await state_adapter.complete_atomic(tx, completion=completion)
        assert (await store.job(job.id)).status is JobStatus.RUNNING

    async def test_an_atomic_attempt_holds_no_row_lock_so_its_expired_lease_is_reaped(
        self, state_adapter: StateAdapter, store: StateHarness
    ) -> None:
        """An atomic attempt's lease is kept by renewals, as a staged one's, not by a
        row lock: one nobody renews is reaped while its transaction is open, and its
        completion is then refused (nothing of the transaction commits)."""
        await store.seed(store.new_job())
        atomic = await store.acquire_one(worker="worker-a", lease=self.short_lease)
        with anyio.fail_after(self.test_timeout):
            async with state_adapter.atomic_transaction(
                lease=atomic.lease, deadline=timedelta(seconds=30)
            ) as tx:
                assert tx is not None
                reaped = await store.reap_when_expired(timeout=self.expiry_timeout)
                assert [r.job_id for r in reaped] == [atomic.id]
                late = await state_adapter.complete_atomic(
                    tx, completion=Completion(atomic.id, atomic.lease_token, '"late"')
                )
                assert not late.accepted
        job = await store.job(atomic.id)
        assert job.status is JobStatus.PENDING
        assert job.output is None


def _done(held: AcquiredJob, output: str = '"atomic"') -> Completion:
    return Completion(held.id, held.lease_token, output)
