"""``python -m bench`` keeps working: every workload, at a tiny size, without peers; and
the idle workload's counters count what they claim to.

Numbers are not checked (speed is never a test assertion); only that each workload
ran and reported its rows in the markdown table, and that the idle readings see
exactly the transactions made in the benchmark's database and none of their own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from bench._env import fresh_database
from bench._idle import cpu_seconds, read_counters
from bench.tests._runs import REPO

EXPECTED_ROWS = [
    "| enqueue, 1 job per transaction |",
    "| enqueue, batches of 100 |",
    "| enqueue, batches of 1,000 |",
    "| drain, 1 worker x 10 slots |",
    "| drain, 1 worker x 10 slots, atomic mode |",
    "| drain, 2 worker processes x 10 slots |",
    "| drain, best setting |",
    # What the run cost beside its speed (bench/_cost.py): the best-setting drains run in
    # a worker process of their own, so they are metered even without peers.
    "| drain, best setting: CPU per job, library + server |",
    "| drain, best setting: transaction ids taken, per job |",
    "| drain, best setting: WAL per job |",
    "| drain, best setting, atomic groups of 32 |",
    "| idle pickup latency p50 |",
    "| idle pickup latency p99 |",
    "| idle pickup latency p50, 30 s poll |",
    "| idle pickup latency p99, 30 s poll |",
    "| worker RSS at start |",
    "| 3-step chains, 1 worker x 10 slots |",
    "| idle, 1 worker: commits per minute |",
    "| idle, 1 worker: CPU per worker process |",
    "| idle, 10 workers: commits per minute |",
    "| idle, 10 workers: CPU per worker process |",
]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_runs_every_workload_at_a_tiny_size(pg_server_dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.md"
    results = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--dsn",
            pg_server_dsn,
            "--size",
            "0.005",
            "--quiet",
            "--out",
            str(out),
            "--json",
            str(results),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = out.read_text()
    assert table == done.stdout.rstrip("\n") + "\n"
    for row in EXPECTED_ROWS:
        assert row in table, f"{row!r} missing from:\n{table}"
    assert "drain at a 5k-job backlog" in table
    assert "Did not run" not in table
    assert "PostgreSQL:" in table
    assert "wal_level=" in table
    assert "pgwork's event loop=uvloop (--loop auto)" in table
    assert '"synchronous_commit"' in results.read_text()


TOUCH = "SELECT count(*) FROM pg_class"
FLUSHED = "SELECT count(*) FROM pg_class, pg_stat_force_next_flush()"


def _server_version(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.info.server_version


@pytest.mark.anyio
async def test_idle_readings_count_the_benchmark_databases_commits_and_none_of_their_own(
    pg_server_dsn: str,
) -> None:
    if _server_version(pg_server_dsn) < 150000:
        pytest.skip("pg_stat_force_next_flush() needs PostgreSQL 15")
    deltas = []
    with fresh_database(pg_server_dsn) as dsn:
        dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
        async with (
            await psycopg.AsyncConnection.connect(pg_server_dsn, autocommit=True) as admin,
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
        ):
            # The count is exact only while nothing else commits in the database, and
            # autovacuum may visit a new database at any moment (its worker's commits
            # count there too; CI once saw 27). So up to three tries, one of which must
            # be exact: a reading that counted its own queries, or missed some, would
            # be off every time.
            for _ in range(3):
                # A backend flushes its counters when it ends a transaction that touched
                # a relation, at most once a second unless forced: force it, so that the
                # test need not wait. The connection's start-up is flushed with this one.
                await conn.execute(FLUSHED)
                first = await read_counters(admin, dbname, [])
                # Control: the readings themselves, over the admin connection, count 0.
                second = await read_counters(admin, dbname, [])
                assert second.commits == first.commits
                for _ in range(24):
                    # Not prepared: psycopg's PREPARE (after five runs) is a transaction.
                    await conn.execute(TOUCH, prepare=False)
                await conn.execute(FLUSHED)
                third = await read_counters(admin, dbname, [])
                deltas.append(third.commits - second.commits)
                if deltas[-1] == 25:
                    break
    assert deltas[-1] == 25, f"commits counted in each try: {deltas}"


def test_cpu_seconds_follow_the_processes_own_clock() -> None:
    pid = os.getpid()
    before, clock = cpu_seconds(pid), time.process_time()
    while time.process_time() - clock < 0.3:
        pass
    after, spent = cpu_seconds(pid), time.process_time() - clock
    assert before is not None
    assert after is not None
    assert abs((after - before) - spent) < 0.05
    # A process running another program is not read as one (the server's backends are
    # told apart from stray pids this way).
    assert cpu_seconds(pid, command="postgres") is None
