"""The job history: every job that completed or failed counted once, per queue and
type, whether a rollup or retention reaches it first.

Role exercised: ``ControlStore.roll_up_history`` and ``ReadStore.job_history``. A store
may count a job only some time after it ended (while an end could still commit earlier
than the present), so the cases roll up until the count is complete, within a bound.
"""

from __future__ import annotations

import time
from datetime import timedelta

import anyio

from pgwork.adapters.history import (
    FINE_RESOLUTION,
    HISTORY_KEEP,
    HOURLY_RESOLUTION,
    JobHistory,
)
from pgwork.adapters.state import Maintenance, OperatorViews
from pgwork.retention import Retention
from pgwork.testing.conformance._harness import ALPHA, StateHarness, StateSuiteBase, requires

HOUR = timedelta(hours=1)


async def _read(store: StateHarness, queue: str | None = None) -> JobHistory:
    return await store.adapter.job_history(
        None,
        window=HOUR,
        resolution=FINE_RESOLUTION,
        step=FINE_RESOLUTION,
        group_resolution=HOURLY_RESOLUTION,
        queue=queue,
        type_name=None,
    )


def _ended(history: JobHistory) -> tuple[int, int]:
    return (
        sum(p.figures.completed for p in history.points),
        sum(p.figures.failed for p in history.points),
    )


@requires(Maintenance, OperatorViews)
class JobHistoryConformance(StateSuiteBase):
    async def _roll_up_until(self, store: StateHarness, ended: tuple[int, int]) -> int:
        """Roll up until the last hour's history holds ``ended`` (completed, failed);
        how many jobs the rollups said they counted."""
        counted = 0
        deadline = time.monotonic() + self.expiry_timeout
        while True:
            step = await store.adapter.roll_up_history(limit=1000, keep=HISTORY_KEEP, max_lag=HOUR)
            counted += step.jobs
            if _ended(await _read(store)) == ended:
                return counted
            assert time.monotonic() < deadline, "the history never counted every end"
            await anyio.sleep(store.poll)

    async def test_the_history_counts_each_ended_job_once_per_queue_and_type(
        self, store: StateHarness
    ) -> None:
        done = [store.new_job(queue="default") for _ in range(3)]
        failing = store.new_job(queue="mail")
        waiting = store.new_job(queue="default")
        await store.seed(*done, failing, waiting)
        for job in done:
            await store.finish(job.id)
        await store.fail_for_good(failing)

        assert await self._roll_up_until(store, (3, 1)) == 4
        step = await store.adapter.roll_up_history(limit=1000, keep=HISTORY_KEEP, max_lag=HOUR)
        assert step.jobs == 0

        history = await _read(store)
        groups = {(g.queue, g.type_name): g.figures for g in history.groups}
        assert set(groups) == {("default", ALPHA), ("mail", ALPHA)}
        default, mail = groups[("default", ALPHA)], groups[("mail", ALPHA)]
        assert (default.completed, default.failed, mail.completed, mail.failed) == (3, 0, 0, 1)
        assert _ended(await _read(store, queue="mail")) == (0, 1)
        assert history.rolled_up_to is not None

    async def test_jobs_retention_deletes_before_a_rollup_are_counted_once(
        self, store: StateHarness
    ) -> None:
        ended = [store.new_job(queue="default", chain_type_name="conformance.short")]
        await store.seed(*ended)
        await store.finish(ended[0].id)
        chain = await store.chain(ended[0].chain_id)
        assert chain.completed_at is not None
        period = timedelta(seconds=0.2)
        retention = {"conformance.short": Retention.uniform(period)}
        await store.wait_for_store_clock(chain.completed_at + period, timeout=self.expiry_timeout)

        assert await store.adapter.delete_expired_chains(retention=retention, limit=10) == 1
        assert not await store.exists(ended[0].id)

        await self._roll_up_until(store, (1, 0))
        assert _ended(await _read(store)) == (1, 0)
