"""Deleting whole chains on request (refused while other chains may still wait for
them, unless cascading) and by retention (ended chains past their type's period).

Retention waits for real: the suite ends chains, then polls the store's clock until
``short_retention`` has passed since the last of them ended.

Role exercised: ``ControlStore`` (``delete_chains``, ``delete_expired_chains``).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import ClassVar

import anyio

from pgwork.adapters.state import ChainBlockers, ChainDeletion, ChainDependant, Maintenance, NewJob
from pgwork.records import ChainStatus
from pgwork.retention import Retention
from pgwork.testing.conformance._harness import BETA, StateHarness, StateSuiteBase, requires
from pgwork.testing.conformance._rollback import rolled_back

SHORT = "conformance.short-lived"
LONG = "conformance.long-lived"


class DeletionConformance(StateSuiteBase):
    async def test_delete_chains_removes_every_job_of_each_chain_in_the_callers_transaction(
        self, store: StateHarness
    ) -> None:
        doomed, kept = store.new_job(), store.new_job(queue="kept")
        await store.seed(doomed, kept)
        follow = store.continuation(await store.job(doomed.id))
        await store.finish(doomed.id, continuation=follow)

        async with rolled_back(store.adapter.transaction()) as tx:
            await store.adapter.delete_chains(tx, chain_ids=[doomed.id], cascade=False)
        assert await store.exists(follow.id)
        async with store.adapter.transaction() as tx:
            deletion = await store.adapter.delete_chains(
                tx, chain_ids=[doomed.id, doomed.id], cascade=False
            )
            assert await store.exists(follow.id)
        assert deletion == ChainDeletion(deleted_chains=1, deleted_jobs=2)
        assert not await store.exists(doomed.id)
        assert not await store.exists(follow.id)
        assert await store.adapter.get_chains(None, chain_ids=[doomed.id]) == []
        assert await store.exists(kept.id)
        async with store.adapter.transaction() as tx:
            nothing = await store.adapter.delete_chains(tx, chain_ids=[], cascade=False)
        assert nothing == ChainDeletion(deleted_chains=0, deleted_jobs=0)

    async def test_delete_chains_with_unknown_ids_names_them_and_deletes_nothing(
        self, store: StateHarness
    ) -> None:
        real = store.new_job()
        await store.seed(real)
        follow = store.continuation(await store.job(real.id))
        await store.finish(real.id, continuation=follow)
        ghost = uuid.uuid4()
        async with store.adapter.transaction() as tx:
            # A job id that is not its chain's first names no chain.
            deletion = await store.adapter.delete_chains(
                tx, chain_ids=[real.id, ghost, follow.id], cascade=True
            )
        assert (deletion.deleted_chains, deletion.deleted_jobs) == (0, 0)
        assert set(deletion.missing) == {ghost, follow.id}
        assert await store.exists(real.id)
        assert await store.exists(follow.id)

    @requires(ChainBlockers)
    async def test_a_chain_others_wait_for_is_deleted_only_by_cascading(
        self, store: StateHarness
    ) -> None:
        source = store.new_job()
        await store.seed(source)
        middle = store.new_job(BETA, queue="middle", blockers=[source.id])
        await store.seed(middle)
        last = store.new_job(BETA, queue="last", blockers=[middle.id])
        await store.seed(last)

        async with store.adapter.transaction() as tx:
            refused = await store.adapter.delete_chains(tx, chain_ids=[source.id], cascade=False)
        assert (refused.deleted_chains, refused.deleted_jobs, refused.missing) == (0, 0, ())
        assert refused.dependants == (ChainDependant(source.id, middle.id, middle.id),)
        assert await store.exists(source.id)
        assert await store.exists(middle.id)

        async with store.adapter.transaction() as tx:
            cascaded = await store.adapter.delete_chains(tx, chain_ids=[source.id], cascade=True)
        assert (cascaded.deleted_chains, cascaded.deleted_jobs) == (3, 3)
        assert set(cascaded.dependants) == {
            ChainDependant(source.id, middle.id, middle.id),
            ChainDependant(middle.id, last.id, last.id),
        }
        for job in (source, middle, last):
            assert not await store.exists(job.id)

    @requires(ChainBlockers)
    async def test_only_dependants_that_may_still_run_hold_their_blocker_back(
        self, store: StateHarness
    ) -> None:
        served, retryable = store.new_job(queue="s"), store.new_job(queue="r")
        await store.seed(served, retryable)
        finished = store.new_job(BETA, queue="finished", blockers=[served.id])
        failed = store.new_job(BETA, queue="failed", blockers=[retryable.id])
        await store.seed(finished, failed)
        await store.finish(served.id)
        await store.finish(finished.id)
        await store.finish(retryable.id)
        await store.fail_for_good(failed)

        async with store.adapter.transaction() as tx:
            freed = await store.adapter.delete_chains(tx, chain_ids=[served.id], cascade=False)
            held = await store.adapter.delete_chains(tx, chain_ids=[retryable.id], cascade=False)
        assert freed == ChainDeletion(deleted_chains=1, deleted_jobs=1)
        assert held.deleted_chains == 0
        assert held.dependants == (ChainDependant(retryable.id, failed.id, failed.id),)
        assert await store.exists(finished.id)
        assert await store.exists(retryable.id)


@requires(Maintenance)
class RetentionConformance(StateSuiteBase):
    short_retention: ClassVar[timedelta] = timedelta(seconds=0.2)
    """Retention period the suite waits out (on the store's clock) before sweeping."""

    @requires(ChainBlockers)
    async def test_retention_deletes_only_ended_chains_of_listed_types_past_their_period(
        self, store: StateHarness
    ) -> None:
        completed, failed, cancelled, active, held_back, waited_for = (
            store.new_job(queue=q, chain_type_name=SHORT, max_attempts=1)
            for q in ("completed", "failed", "cancelled", "active", "held", "waited")
        )
        young = store.new_job(queue="young", chain_type_name=LONG)
        unlisted = store.new_job(queue="unlisted")
        await store.seed(completed, failed, cancelled, active, held_back, waited_for)
        await store.seed(young, unlisted)
        follow = store.continuation(await store.job(completed.id))
        await store.finish(completed.id, continuation=follow)
        # A blocked job waits for an ended chain and a running one: the ended one stays.
        await store.seed(store.new_job(BETA, queue="x", blockers=[held_back.id, waited_for.id]))
        await store.finish(follow.id)
        await store.fail_for_good(failed)
        async with store.adapter.transaction() as tx:
            await store.adapter.cancel_chains(tx, chain_ids=[cancelled.id])
        for job in (held_back, young, unlisted):
            await store.finish(job.id)
        await self._until_expired(store, completed, failed, cancelled, held_back)

        retention = {
            SHORT: Retention.uniform(self.short_retention),
            LONG: Retention.uniform(timedelta(hours=1)),
        }
        assert await store.adapter.delete_expired_chains(retention=retention, limit=100) == 3
        for gone in (completed.id, follow.id, failed.id, cancelled.id):
            assert not await store.exists(gone)
        for kept in (active, held_back, waited_for, young, unlisted):
            assert await store.exists(kept.id)
        assert await store.adapter.delete_expired_chains(retention=retention, limit=100) == 0
        assert await store.adapter.delete_expired_chains(retention={}, limit=100) == 0
        everything = dict.fromkeys(
            (SHORT, LONG, "conformance.chain"), Retention.uniform(timedelta(microseconds=1))
        )
        assert await store.adapter.delete_expired_chains(retention=everything, limit=0) == 0
        kept_for_ever = dict.fromkeys((SHORT, LONG, "conformance.chain"), Retention.forever())
        assert await store.adapter.delete_expired_chains(retention=kept_for_ever, limit=100) == 0
        assert await store.exists(unlisted.id)

    async def test_retention_periods_are_per_way_of_ending(self, store: StateHarness) -> None:
        completed, failed, cancelled = (
            store.new_job(queue=q, chain_type_name=SHORT, max_attempts=1)
            for q in ("completed", "failed", "cancelled")
        )
        await store.seed(completed, failed, cancelled)
        await store.finish(completed.id)
        await store.fail_for_good(failed)
        async with store.adapter.transaction() as tx:
            await store.adapter.cancel_chains(tx, chain_ids=[cancelled.id])
        await self._until_expired(store, completed, failed, cancelled)

        policy = Retention(
            completed=None, failed=timedelta(hours=1), cancelled=self.short_retention
        )
        retention = {SHORT: policy}
        assert await store.adapter.delete_expired_chains(retention=retention, limit=100) == 1
        assert not await store.exists(cancelled.id)
        assert await store.exists(completed.id)
        assert await store.exists(failed.id)
        retention = {SHORT: Retention(completed=self.short_retention, failed=None, cancelled=None)}
        assert await store.adapter.delete_expired_chains(retention=retention, limit=100) == 1
        assert not await store.exists(completed.id)
        assert await store.exists(failed.id)

    async def test_retention_deletes_at_most_limit_chains_per_call(
        self, store: StateHarness
    ) -> None:
        ended = [store.new_job(chain_type_name=SHORT) for _ in range(3)]
        await store.seed(*ended)
        for job in ended:
            await store.finish(job.id)
        await self._until_expired(store, *ended)
        retention = {SHORT: Retention.uniform(self.short_retention)}
        counts = [await store.adapter.delete_expired_chains(retention=retention, limit=2)]
        counts.append(await store.adapter.delete_expired_chains(retention=retention, limit=2))
        counts.append(await store.adapter.delete_expired_chains(retention=retention, limit=2))
        assert counts == [2, 1, 0]

    async def test_concurrent_retention_sweeps_delete_each_chain_once(
        self, store: StateHarness
    ) -> None:
        ended = [store.new_job(chain_type_name=SHORT) for _ in range(8)]
        await store.seed(*ended)
        for job in ended:
            await store.finish(job.id)
        await self._until_expired(store, *ended)
        retention = {SHORT: Retention.uniform(self.short_retention)}
        counts: list[int] = []

        async def sweep() -> None:
            counts.append(await store.adapter.delete_expired_chains(retention=retention, limit=3))

        with anyio.fail_after(self.test_timeout):
            while sum(counts) < len(ended):
                before = sum(counts)
                async with anyio.create_task_group() as tg:
                    for _ in range(4):
                        tg.start_soon(sweep)
                assert sum(counts) > before, "concurrent sweeps made no progress"
        assert sum(counts) == len(ended)
        assert all(count <= 3 for count in counts)
        for job in ended:
            assert not await store.exists(job.id)

    async def _until_expired(self, store: StateHarness, *jobs: NewJob) -> None:
        """Wait on the store's clock until every one of these chains ended longer ago
        than ``short_retention``."""
        ended_at = []
        for job in jobs:
            chain = await store.chain(job.chain_id)
            assert chain.status is not ChainStatus.ACTIVE
            assert chain.completed_at is not None
            ended_at.append(chain.completed_at)
        await store.wait_for_store_clock(
            max(ended_at) + self.short_retention, timeout=self.expiry_timeout
        )
