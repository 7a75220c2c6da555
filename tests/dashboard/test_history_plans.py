"""The job history at a million jobs: the rollup reads one bounded range of the ended
jobs' index per step, and the history page reads a range of buckets, never ``jobs``.

The jobs are a week of history (``pgwork.testing.sample_statements``: four queues,
eight types); the history is counted by the real rollup, and 90 days of older hourly
buckets are added for every queue and type, so the longest window reads as many
buckets as it ever can.
Statements are captured as the adapter sends them and run under ``EXPLAIN ANALYZE``
with the same parameters (tests/dashboard/test_work_plans.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from tests.dashboard.test_work_plans import _nodes, plans_of

from pgwork import Client, PostgresStateAdapter, create_client
from pgwork.adapters.history import DURATION_BINS_S
from pgwork.job_types import JobTypeRegistry
from pgwork.postgres._history import HISTORY_WIDTHS_S
from pgwork.postgres.sql import render
from pgwork.testing import sample_statements, temporary_database

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

JOBS = 1_000_000
BATCH = 10_000

# Daily buckets of every lane from a week to 90 days back (the load's week is counted
# by the rollup itself).
_OLDER_BUCKETS = f"""
INSERT INTO pgwork.job_history
SELECT 86400, q, t, date_trunc('day', now()) - d * interval '1 day', 1200, 24,
       1200, 240.0, 2.0, array_fill(100::bigint, ARRAY[{len(DURATION_BINS_S) + 1}]),
       1224, 2400.0, 9.0, array_fill(100::bigint, ARRAY[{len(DURATION_BINS_S) + 1}])
FROM generate_series(7, 90) AS d,
     (SELECT DISTINCT queue AS q, type_name AS t FROM pgwork.job_history) AS lanes
ON CONFLICT DO NOTHING
"""


@pytest.fixture(scope="module")
def million_dsn(pg_server_dsn: str, pgwork_template_database: str) -> Iterator[str]:
    with temporary_database(pg_server_dsn, template=pgwork_template_database) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in sample_statements(jobs=JOBS, schema="pgwork"):
                conn.execute(statement)
        yield dsn


@pytest.fixture
async def million(million_dsn: str) -> AsyncIterator[Client]:
    state = await PostgresStateAdapter.connect(million_dsn, max_size=2)
    client = create_client(state_adapter=state, registry=JobTypeRegistry(), observers=[])
    try:
        yield client
    finally:
        await client.close()


def rows_read(nodes: list[dict[str, Any]], relation: str) -> int:
    """Rows the plan's nodes over ``relation`` returned or threw away, over all loops."""
    total = 0
    for n in nodes:
        if n.get("Relation Name") == relation:
            removed = n.get("Rows Removed by Filter", 0) + n.get("Rows Removed by Index Recheck", 0)
            total += (n.get("Actual Rows", 0) + removed) * n.get("Actual Loops", 1)
    return total


async def _roll_up_step_plan(dsn: str) -> list[dict[str, Any]]:
    """The executed plan of one rollup step from the middle of the week, rolled back."""
    statements = render("pgwork").history
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT completed_at FROM pgwork.jobs WHERE status = 'completed'"
            " ORDER BY completed_at OFFSET %s LIMIT 1",
            (JOBS // 2,),
        )
        row = await cur.fetchone()
        assert row is not None
        params = {
            "since": row[0],
            "horizon": row[0] + timedelta(days=3),
            "limit": BATCH,
            "widths": HISTORY_WIDTHS_S,
        }
        cur = await conn.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + statements.roll_up, params)
        plan = await cur.fetchone()
        await conn.rollback()
    assert plan is not None
    return _nodes(plan[0][0]["Plan"])


@pytest.mark.timeout(1800)
async def test_the_rollup_and_the_history_reads_are_bounded_at_a_million_jobs(
    million: Client, million_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A rollup step reads its batch from jobs_ended_idx, whatever the table holds.
    step = await _roll_up_step_plan(million_dsn)
    on_jobs = [n for n in step if n.get("Relation Name") == "jobs"]
    assert on_jobs
    assert all(n["Node Type"] != "Seq Scan" for n in on_jobs), step
    assert {n["Index Name"] for n in step if "Index Name" in n} <= {
        "jobs_ended_idx",
        "job_history_pkey",
    }, step
    assert rows_read(step, "jobs") <= 3 * BATCH + 10

    steps = 0
    while not (await million.roll_up_history(limit=BATCH)).caught_up:
        steps += 1
        assert steps < 2 * JOBS // BATCH
    async with await psycopg.AsyncConnection.connect(million_dsn, autocommit=True) as conn:
        await conn.execute(_OLDER_BUCKETS)
        await conn.execute("VACUUM (ANALYZE) pgwork.job_history")
        week = await million.job_history(window=timedelta(days=7))
        cur = await conn.execute(
            "SELECT count(*) FROM pgwork.jobs"
            " WHERE status IN ('completed', 'failed') AND completed_at >= %s",
            (week.since,),
        )
        ended = (await cur.fetchone() or (0,))[0]
        cur = await conn.execute(
            "SELECT count(DISTINCT (queue, type_name)),"
            " count(DISTINCT (queue, type_name)) FILTER (WHERE type_name <> '')"
            " FROM pgwork.job_history"
        )
        keys, lanes = await cur.fetchone() or (0, 0)
    assert sum(p.figures.ended for p in week.points) == ended
    assert lanes >= 4 * 8  # the load's queues and types, and its continuations' types
    assert keys == lanes + 4 + 1  # and each queue's total, and the grand total

    # A chart reads one row per bucket of the window (the total's), the table per queue
    # and type the window's coarser buckets (of every key of the width: each queue and
    # type, and the totals the filter then drops): a few dozen rows each. Never a job.
    # The window reaches back to the start of the hour (or day) it begins in: a day's
    # window spans up to 25 hours, a week's up to 8 days.
    bounds = {
        timedelta(days=1): 25 * 12 + 1 + 26 * keys,
        timedelta(days=7): 8 * 24 + 1 + 9 * keys,
        timedelta(days=30): 32 + 32 * keys,
        timedelta(days=90): 92 + 92 * keys,
    }
    for window, bound in bounds.items():

        async def read(c: Client, window: timedelta = window) -> Any:
            return await c.job_history(window=window)

        for nodes in await plans_of(million, million_dsn, monkeypatch, read):
            assert all(n.get("Relation Name") != "jobs" for n in nodes), (window, nodes)
            on_history = [n for n in nodes if n.get("Relation Name") == "job_history"]
            assert on_history, (window, nodes)
            assert all(n["Node Type"] != "Seq Scan" for n in on_history), (window, nodes)
            assert rows_read(nodes, "job_history") <= bound, (
                window,
                rows_read(nodes, "job_history"),
            )
