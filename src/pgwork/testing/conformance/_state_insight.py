"""The operator's read side: chain listings by dedup key, recent activity,
and the links between chains."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pgwork.adapters.state import ChainBlockers, ChainFilter, DedupSpec, OperatorViews
from pgwork.records import ChainStatus, JobStatus
from pgwork.testing.conformance._harness import (
    BETA,
    CHAIN_TYPE,
    StateHarness,
    StateSuiteBase,
    requires,
)
from pgwork.testing.conformance._state_queries import OTHER_CHAIN

HOUR = timedelta(hours=1)
MINUTE = timedelta(minutes=1)


class InsightConformance(StateSuiteBase):
    async def test_list_chains_filters_by_dedup_key(self, store: StateHarness) -> None:
        keyed = store.new_job(dedup=DedupSpec("user-7"))
        other_key = store.new_job(dedup=DedupSpec("user-8"))
        other_type = store.new_job(dedup=DedupSpec("user-7"), chain_type_name=OTHER_CHAIN)
        plain = store.new_job()
        await store.seed(keyed, other_key, other_type, plain)

        async def ids(**where: Any) -> set[Any]:
            chains = await store.adapter.list_chains(
                None, where=ChainFilter(**where), after=None, limit=10
            )
            return {c.id for c in chains}

        assert await ids(dedup_key="user-7") == {keyed.id, other_type.id}
        assert await ids(dedup_key="user-7", type_name=CHAIN_TYPE) == {keyed.id}
        assert await ids(dedup_key="user-7", status=ChainStatus.COMPLETED) == set()
        assert await ids(dedup_key="nobody") == set()
        assert await ids() == {keyed.id, other_key.id, other_type.id, plain.id}

    @requires(OperatorViews)
    async def test_recent_activity_counts_completions_and_failures_per_queue(
        self, store: StateHarness
    ) -> None:
        done = [store.new_job(queue="default") for _ in range(3)]
        failing = store.new_job(queue="mail")
        waiting = store.new_job(queue="default")
        await store.seed(*done, failing, waiting)
        for job in done:
            await store.finish(job.id)
        await store.fail_for_good(failing)

        activity = await store.adapter.recent_activity(
            None, window=HOUR, bucket=MINUTE, sample_size=100
        )

        completed: dict[str, int] = {}
        failed: dict[str, int] = {}
        for b in activity.buckets:
            completed[b.queue] = completed.get(b.queue, 0) + b.completed
            failed[b.queue] = failed.get(b.queue, 0) + b.failed
            assert activity.now - HOUR - MINUTE <= b.start <= activity.now
        assert completed == {"default": 3, "mail": 0}
        assert failed == {"default": 0, "mail": 1}
        assert activity.sampled == 4  # the jobs that ended, not the one still waiting
        assert activity.complete
        assert activity.counted_from is None
        assert activity.estimated_jobs >= 0

    @requires(OperatorViews)
    async def test_recent_activity_reads_no_more_than_its_sample(self, store: StateHarness) -> None:
        older, newer = store.new_job(), store.new_job()
        await store.seed(older)
        await store.seed(newer)
        await store.finish(older.id)
        await store.finish(newer.id)

        activity = await store.adapter.recent_activity(
            None, window=HOUR, bucket=MINUTE, sample_size=1
        )

        assert activity.sampled == 1
        assert not activity.complete
        assert sum(b.completed for b in activity.buckets) == 1
        [newest] = activity.buckets
        assert activity.counted_from is not None
        assert newest.start <= activity.counted_from <= activity.now

    @requires(ChainBlockers, OperatorViews)
    async def test_chain_links_give_blockers_and_dependants_with_their_status(
        self, store: StateHarness
    ) -> None:
        first, second = store.new_job(), store.new_job()
        await store.seed(first, second)
        await store.finish(first.id)
        waiting = store.new_job(BETA, queue="merge", blockers=[first.id, second.id])
        unrelated = store.new_job()
        await store.seed(waiting, unrelated)

        links = await store.adapter.chain_links(None, chain_id=waiting.id, limit=10)
        assert [(b.blocker_chain_id, b.status) for b in links.blockers] == [
            (first.id, ChainStatus.COMPLETED),
            (second.id, ChainStatus.ACTIVE),
        ]
        assert {b.job_id for b in links.blockers} == {waiting.id}
        assert links.dependants == ()

        held_up = await store.adapter.chain_links(None, chain_id=second.id, limit=10)
        assert held_up.blockers == ()
        [dependant] = held_up.dependants
        assert (dependant.chain_id, dependant.job_id) == (waiting.id, waiting.id)
        assert dependant.status is ChainStatus.ACTIVE
        assert dependant.job_status is JobStatus.BLOCKED

        assert await store.adapter.chain_links(None, chain_id=unrelated.id, limit=10) == (
            await store.adapter.chain_links(None, chain_id=unrelated.id, limit=1)
        )
        capped = await store.adapter.chain_links(None, chain_id=waiting.id, limit=1)
        assert len(capped.blockers) == 1
