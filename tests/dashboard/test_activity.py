"""The overview's "last hour": every job that ended in it counted, however many.

Jobs are written straight into the table with ``generate_series`` (ids UUIDv7 of their
creation, one second before they ended), more than the 20,000 newest jobs an earlier
sample read, so a count drawn from a sample shows empty minutes where jobs ended.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest

from pgwork import Client
from pgwork.dashboard._format import chart
from pgwork.dashboard._pages import BUCKET, WINDOW
from pgwork.testing import uuid7_sql

pytestmark = pytest.mark.anyio

COMPLETED, FAILED = 30_000, 600
# Ended over the last 58 minutes, one every ~0.1 s, two queues: every 2-minute bar of
# the chart but the oldest holds some.
SPREAD_S = 58 * 60

_ENDED = f"""
INSERT INTO pgwork.jobs (
    id, type_name, chain_id, chain_type_name, status, queue, created_at, scheduled_at,
    started_at, completed_at, attempt, max_attempts, chain_status, chain_completed_at
)
SELECT u, 'dash.echo', u, 'dash.echo', s::pgwork.job_status, q, e - interval '1 s',
       e - interval '1 s', e - interval '1 s', e, 1, 1, s::pgwork.chain_status, e
FROM (
    SELECT {uuid7_sql("e - interval '1 s'")} AS u, e, s, q
    FROM (
        SELECT now() - (g * %(spread)s / %(total)s) * interval '1 second' AS e,
               CASE WHEN g %% 50 = 1 THEN 'failed' ELSE 'completed' END AS s,
               CASE WHEN g %% 3 = 0 THEN 'mail' ELSE 'default' END AS q
        FROM generate_series(0, %(total)s - 1) AS g
    ) AS ends
) AS rows
"""


async def _insert_ended(dsn: str, total: int) -> dict[tuple[str, str], int]:
    """``total`` jobs ended in the last hour; how many per (queue, status)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(_ENDED, {"spread": SPREAD_S, "total": total})
        await conn.execute("VACUUM (ANALYZE) pgwork.jobs")
        rows = await (
            await conn.execute(
                "SELECT queue, status::text, count(*) FROM pgwork.jobs GROUP BY 1, 2"
            )
        ).fetchall()
    return {(q, s): int(n) for q, s, n in rows}


def _cell(html: str, queue: str, column: str) -> str:
    row = re.search(rf'<tr data-queue="{queue}">(.*?)</tr>', html, re.S)
    assert row
    found = re.search(rf'data-col="{column}">(.*?)</td>', row.group(1), re.S)
    assert found
    return re.sub(r"<[^>]+>", "", found.group(1)).strip()


async def test_last_hour_counts_every_job_that_ended_past_twenty_thousand(
    client: Client, pgwork_dsn: str, http: httpx.AsyncClient
) -> None:
    counts = await _insert_ended(pgwork_dsn, COMPLETED + FAILED)
    completed = sum(n for (_, s), n in counts.items() if s == "completed")
    failed = sum(n for (_, s), n in counts.items() if s == "failed")
    assert completed > 20_000

    html = (await http.get("/")).text

    for queue in ("default", "mail"):
        assert _cell(html, queue, "completed-1h") == str(counts[(queue, "completed")])
        assert _cell(html, queue, "failed-1h") == str(counts[(queue, "failed")])
    assert f"{completed} completed, {failed} failed." in html
    assert "Counted over every job that ended." in html
    bars = re.findall(r"<title>(\d\d:\d\d) UTC: (\d+) completed, (\d+) failed</title>", html)
    assert len(bars) == WINDOW // BUCKET
    # No false outage: between the oldest (partly before the spread) and the newest, no
    # bar is empty. The newest is left out: it is empty when a bar's boundary passed
    # between the insert and the page.
    assert all(int(done) > 0 for _, done, _ in bars[1:-1]), bars
    assert sum(int(done) for _, done, _ in bars) == completed


async def test_a_capped_count_says_how_far_back_it_reached(client: Client, pgwork_dsn: str) -> None:
    await _insert_ended(pgwork_dsn, 3000)

    exact = await client.recent_activity(window=WINDOW, bucket=BUCKET)
    capped = await client.recent_activity(window=WINDOW, bucket=BUCKET, sample_size=1000)

    assert exact.complete
    assert exact.sampled == 3000
    assert exact.counted_from is None
    assert not capped.complete
    assert capped.sampled == 1000
    assert capped.counted_from is not None
    assert all(b.start + BUCKET > capped.counted_from for b in capped.buckets)
    drawn = chart(
        capped.buckets,
        now=capped.now,
        window=WINDOW,
        bucket=BUCKET,
        counted_from=capped.counted_from,
    )
    uncounted = [bar for bar in drawn.bars if not bar.counted]
    assert uncounted
    assert uncounted == list(drawn.bars[: len(uncounted)])
    assert all(bar.done_height == 0 and "not counted" in bar.label for bar in uncounted)
    assert drawn.completed == sum(b.completed for b in capped.buckets)


def test_bars_before_where_a_capped_count_stopped_are_marked_not_counted() -> None:
    now = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    stopped = now - timedelta(minutes=10, seconds=30)

    drawn = chart((), now=now, window=WINDOW, bucket=BUCKET, counted_from=stopped)

    counted = [bar.counted for bar in drawn.bars]
    assert counted == [False] * 24 + [True] * 6
    assert "counted from 11:50:00 UTC" in drawn.bars[24].label
