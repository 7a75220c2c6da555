"""``python -m bench`` keeps working: every workload, at a tiny size, without peers.

Numbers are not checked (speed is never a test assertion); only that each workload
ran and reported its rows in the markdown table.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

EXPECTED_ROWS = [
    "| enqueue, 1 job per transaction |",
    "| enqueue, batches of 100 |",
    "| enqueue, batches of 1,000 |",
    "| drain, 1 worker x 10 slots |",
    "| drain, 1 worker x 10 slots, atomic mode |",
    "| drain, 2 worker processes x 10 slots |",
    "| idle pickup latency p50 |",
    "| idle pickup latency p99 |",
    "| worker RSS at start |",
    "| 3-step chains, 1 worker x 10 slots |",
]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_runs_every_workload_at_a_tiny_size(pg_server_dsn: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.md"
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
