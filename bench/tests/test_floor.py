"""The raw-SQL floor's enqueue (``bench/peers/run_raw.py``), run as ``python -m bench
--peers`` runs it: a process of its own printing JSON lines, on a fresh database.

Its two tables are two yardsticks: the floor's own minimal table, and pgwork's table
with the rows ``start_chains`` writes (``--rows pgwork``, the column "raw SQL,
pgwork's rows"). The latter must insert into pgwork's table and leave the floor's
table uncreated, or it would measure the wrong rows.
"""

from __future__ import annotations

import json
import subprocess
import sys

import psycopg
import pytest

from bench.tests._runs import REPO

RUNNER = REPO / "bench" / "peers" / "run_raw.py"


def _runner(dsn: str, workload: str, *args: str) -> list[str]:
    return [sys.executable, str(RUNNER), "--dsn", dsn, "--workload", workload, *args]


def _enqueue(dsn: str, *extra: str) -> dict[str, float]:
    """Enqueue 250 jobs in batches of 100 (the last one 50); the runner's result."""
    done = subprocess.run(
        _runner(dsn, "enqueue", "--jobs", "250", "--batch", "100", *extra),
        cwd=RUNNER.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    [result] = [event["result"] for event in events if "result" in event]
    return result


def _count(dsn: str, table: str) -> int | None:
    """Rows in ``table`` (None: no such table)."""
    with psycopg.connect(dsn) as conn:
        if conn.execute("SELECT to_regclass(%s)", [table]).fetchone() == (None,):
            return None
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
        assert row is not None
        return int(row[0])


def test_the_floor_enqueues_into_its_own_table(empty_database_dsn: str) -> None:
    assert _enqueue(empty_database_dsn)["seconds"] > 0
    assert _count(empty_database_dsn, "raw_jobs") == 250


def test_the_floor_enqueues_pgwork_rows_into_pgwork_table(pgwork_dsn: str) -> None:
    assert _enqueue(pgwork_dsn, "--rows", "pgwork")["seconds"] > 0
    assert _count(pgwork_dsn, "pgwork.jobs") == 250
    assert _count(pgwork_dsn, "raw_jobs") is None


@pytest.mark.parametrize("workload", ["drain", "latency"])
def test_pgwork_rows_are_for_the_enqueue_only(pgwork_dsn: str, workload: str) -> None:
    done = subprocess.run(
        _runner(pgwork_dsn, workload, "--jobs", "10", "--rows", "pgwork"),
        cwd=RUNNER.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "enqueue" in done.stderr or "latency" in done.stderr
