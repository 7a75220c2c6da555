"""A child's end costs the same with ten siblings as with two thousand.

Among 20,000 other jobs (each waited for by an ended job, an edge each), two steps
wait, one for 10 children and one for 2,000. One child of each ends (a
completion in a transaction, which settles its step in the same one), and the rows that
transaction read from ``jobs`` and ``job_blockers`` are counted
(``pg_stat_xact_user_tables``: rows read by sequential scans and fetched by index
scans, the transaction's own counts): the same for both. The control build settles an
end by counting the step's edges from scratch (the verdict over every edge that the
counters replace): the big step's end then reads thousands of rows more, so a fan-out
of n children would read about n² rows in all.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from pgwork.adapters.state import Completion, NewJob
from pgwork.postgres._chains import ChainOps
from pgwork.postgres._transactions import PgTransaction
from pgwork.postgres.state import PostgresStateAdapter
from pgwork.testing.conformance._harness import ALPHA, StateHarness

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

_READ = """
SELECT COALESCE(sum(seq_tup_read + COALESCE(idx_tup_fetch, 0)), 0)::bigint
FROM pg_stat_xact_user_tables
WHERE schemaname = 'pgwork' AND relname IN ('jobs', 'job_blockers')
"""


# Jobs that ended long ago, each having waited for the next: the tables hold more than
# the fan-outs, as a live database does, so that reading a step's every edge is not
# the same as reading the whole table.
_OTHERS = """
INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, status, max_attempts,
                         chain_status)
SELECT id, 'other', id, 'other', 'completed', 1, 'completed'
FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, 20000)) AS g;
INSERT INTO pgwork.job_blockers (job_id, blocker_chain_id, position, counted)
SELECT id, waited_for, 0, 'met'
FROM (SELECT id, lead(id) OVER (ORDER BY id) AS waited_for
      FROM pgwork.jobs WHERE type_name = 'other') AS o
WHERE waited_for IS NOT NULL;
"""


async def _fan_out(store: StateHarness, size: int) -> tuple[list[NewJob], NewJob]:
    """A parent completed with ``size`` children and a step blocked on all of them."""
    await store.seed(store.new_job(queue="parents"))
    parent = await store.acquire_one(ALPHA, queues=["parents"])
    children = [store.new_job(queue="kids") for _ in range(size)]
    step = replace(store.continuation(parent), blockers=tuple(c.id for c in children))
    [result] = await store.adapter.complete(
        None,
        completions=[Completion(parent.id, parent.lease_token, "1", step, tuple(children))],
    )
    assert result.accepted
    return children, step


async def _rows_read_by_an_end(adapter: PostgresStateAdapter, child: NewJob) -> int:
    async with adapter.transaction() as tx:
        assert isinstance(tx, PgTransaction)
        conn = tx.connection
        before = (await (await conn.execute(_READ)).fetchone())[0]  # type: ignore[index]
        [result] = await adapter.complete(tx, completions=[Completion(child.id, None, "2")])
        assert result.accepted
        after = (await (await conn.execute(_READ)).fetchone())[0]  # type: ignore[index]
    return int(after - before)


async def _recount(self: Any, conn: Any, chain_ids: Any, job_ids: Any) -> Any:
    """The control: settle an end by counting the dependants' edges from scratch."""
    return await self._count(conn, job_ids, [None] * len(job_ids))


@pytest.mark.parametrize("build", ["counted", "control-recount"])
async def test_a_childs_end_reads_as_many_rows_whatever_its_siblings(
    pgwork_dsn: str, build: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if build == "control-recount":
        monkeypatch.setattr(ChainOps, "_settle_ended", _recount)
    adapter = await PostgresStateAdapter.connect(pgwork_dsn)
    try:
        store = StateHarness(adapter, lease=timedelta(seconds=60), poll=0.05)
        small, small_step = await _fan_out(store, 10)
        big, big_step = await _fan_out(store, 2000)
        async with adapter.transaction() as tx:
            assert isinstance(tx, PgTransaction)
            await tx.connection.execute(_OTHERS)
        async with adapter.transaction() as tx:
            assert isinstance(tx, PgTransaction)
            await tx.connection.execute("ANALYZE pgwork.jobs")
            await tx.connection.execute("ANALYZE pgwork.job_blockers")
        # Warm up (plans, caches) with one end of each, then measure the next.
        for children in (small, big):
            await _rows_read_by_an_end(adapter, children[0])
        read_small = await _rows_read_by_an_end(adapter, small[1])
        read_big = await _rows_read_by_an_end(adapter, big[1])
        for step in (small_step, big_step):
            assert (await store.job(step.id)).status.value == "blocked"
    finally:
        await adapter.close()
    if build == "counted":
        assert read_big == read_small, (read_small, read_big)
        assert read_small < 60, read_small  # a few rows by key, whatever the tables hold
    else:
        assert read_big > read_small + 2000, (read_small, read_big)
