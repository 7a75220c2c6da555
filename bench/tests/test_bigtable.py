"""``python -m bench.bigtable`` keeps working and its big table is what it says: the
steady state of pgwork's default retention, which pgwork's own retention sweep agrees
with, and a churn that leaves dead tuples only where it says. Speeds are never
asserted; only that every section reports sane figures."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import anyio
import psycopg
import pytest

from bench._bigtable_load import TYPES, Timeline, churn, load
from bench._bigtable_probe import settle_stats, table_stats
from bench.dashboard import page_paths
from bench.tests._runs import run_bench
from pgwork import PostgresStateAdapter, Retention

FINISHED = 5000


def _scalar(dsn: str, query: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def test_the_timeline_holds_about_the_jobs_asked_for() -> None:
    timeline = Timeline.plan(10_000_000, 0.2)

    # A day of completed chains, a week of failed and cancelled ones, and their jobs.
    expected = timeline.rate * (
        0.97 * (timeline.completed_s + timeline.due_s) * 1.4
        + 0.03 * (timeline.ended_early_s + timeline.due_s) * 1.2
    )
    assert expected == pytest.approx(10_000_000, rel=1e-3)
    assert timeline.churned < timeline.kept < timeline.total
    assert timeline.chunks()[0] == (0, 100_000, True)
    assert all(not only for first, _, only in timeline.chunks() if first >= timeline.churned)


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_pgwork_retention_deletes_only_the_chains_loaded_past_due(pgwork_dsn: str) -> None:
    timeline = Timeline.plan(FINISHED, 0.0)
    loaded = load(pgwork_dsn, timeline)
    due = _scalar(
        pgwork_dsn,
        "SELECT count(*) FROM pgwork.jobs WHERE id = chain_id AND ("
        " chain_status = 'completed' AND chain_completed_at < now() - interval '1 day'"
        " OR chain_status <> 'active' AND chain_completed_at < now() - interval '7 days')",
    )
    state = await PostgresStateAdapter.connect(pgwork_dsn, max_size=1)
    try:
        longer = Retention(
            completed=timedelta(days=1, hours=2), failed=timedelta(days=8), cancelled=None
        )
        kept = await state.delete_expired_chains(
            retention={name: longer for _, name in TYPES}, limit=100_000
        )
        deleted = await state.delete_expired_chains(
            retention={name: Retention() for _, name in TYPES}, limit=100_000
        )
    finally:
        await state.close()

    assert abs(loaded.jobs - loaded.live - FINISHED) < FINISHED * 0.05
    assert kept == 0  # control: nothing is older than a retention an hour longer
    assert deleted == due > 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fraction", [0.2, 0.0], ids=["churn", "control-no-churn"])
def test_churn_deletes_the_expired_chains_and_leaves_dead_tuples(
    pgwork_dsn: str, fraction: float
) -> None:
    timeline = Timeline.plan(FINISHED, fraction)
    loaded = load(pgwork_dsn, timeline)
    anyio.run(settle_stats)
    before = table_stats(pgwork_dsn)

    done = churn(pgwork_dsn, timeline, fraction)
    anyio.run(settle_stats)
    dead = table_stats(pgwork_dsn).dead - before.dead
    left = _scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs")
    stale = _scalar(
        pgwork_dsn,
        "SELECT count(*) FROM pgwork.jobs WHERE chain_status = 'completed' AND"
        f" chain_completed_at < now() - interval '1 day' - {timeline.due_s + 60} * interval '1 s'",
    )
    running = _scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs WHERE status = 'running'")

    assert left == loaded.jobs - done.deleted
    assert abs(left - loaded.live - FINISHED) < FINISHED * 0.05
    assert (stale, running) == (0, 0)
    if fraction:
        assert done.deleted == pytest.approx(fraction * FINISHED, rel=0.15)
        assert done.updated == pytest.approx(fraction * left, rel=0.25)
        assert dead > done.updated
    else:
        assert (done.deleted, done.updated, dead) == (0, 0, 0)


def _page_labels() -> list[str]:
    picks = ("newest_email", "key", "chain", "blocked", "failed", "shared_prefix")
    return list(page_paths(dict.fromkeys(picks, "x"), {"chains": "", "failed": ""}, "t", "q"))


STATEMENTS = {
    "leases.reap": {1, 0},  # one expired lease taken back; none where none expired
    "leases.renew": {100},
    "workers.heartbeat": {1},
    "leases.acquire": {10, 0},
    "queries.lock_expired_chains": None,  # however many came due
    "queries.delete_expired_chains": {1},
}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_bench_reports_every_section_at_a_tiny_size(pg_server_dsn: str, tmp_path: Path) -> None:
    report = tmp_path / "bigtable.json"
    out = run_bench(
        "bench.bigtable",
        pg_server_dsn,
        "--finished",
        "20000",
        "--ready",
        "2000",
        "--repeat",
        "1",
        "--runs",
        "3",
        "--json",
        str(report),
        timeout=580,
    )
    data = json.loads(report.read_text())

    for heading in ("### 1. ", "### 2. ", "### 3. ", "### 4. ", "### 5. "):
        assert heading in out, out
    assert "- command: `python -m bench.bigtable --dsn" in out
    assert "(commit " in out

    live = data["final_stats"]["live"]
    assert 18_000 < live < 25_000
    stages = ["after load", "after churn", "after VACUUM", "at the end"]
    assert list(data["sizes"]) == stages
    for stage in stages:
        sizes = data["sizes"][stage]
        assert sizes["jobs"][0] == "table"
        assert sizes["jobs"][1] > sizes["jobs_pkey"][1] > 0
        assert sum(1 for kind, _ in sizes.values() if kind == "index of jobs") >= 10

    drains = {d["table"]: d for d in data["drains"]}
    assert set(drains) == {"big", "empty"}
    assert all(d["rate"] > 0 and d["jobs"] == 2000 for d in drains.values())
    assert drains["big"]["changes"]["updated"] >= 2 * 2000
    assert data["acquire"]["ratio"] > 0

    by_statement: dict[str, set[int]] = {}
    for s in data["statements"]:
        assert s["median_ms"] > 0
        assert s["hit"] + s["read"] > 0
        by_statement.setdefault(s["statement"], set()).add(s["rows"])
    assert set(by_statement) == set(STATEMENTS)
    for name, rows in STATEMENTS.items():
        assert rows is None or by_statement[name] == rows, (name, by_statement[name])
    assert min(by_statement["queries.lock_expired_chains"]) > 0

    pages = {p["label"]: p["median_ms"] for p in data["pages"]}
    assert set(pages) == set(_page_labels())
    assert all(ms > 0 for ms in pages.values())
    listed = [p["label"] for p in data["jobs_list"]]
    assert "`pgwork jobs list`: its query" in listed
    assert "`pgwork jobs list`: the whole command" in listed

    churned = data["vacuums"]["after the churn"]
    assert churned["dead_before"] > 0
    assert churned["dead_after"] < churned["dead_before"]
    assert churned["index_scans"] >= 1
    assert data["vacuums"]["after a drain"]["dead_items"] > 0
    assert data["vacuums"]["with nothing to clean"]["dead_before"] == 0
    assert "fillfactor=" in data["reloptions"]["jobs"]
