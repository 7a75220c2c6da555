"""``python -m bench.dashboard`` keeps working, at a tiny size (times are not checked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_dashboard_loads_jobs_and_times_every_page(pg_server_dsn: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.dashboard",
            "--dsn",
            pg_server_dsn,
            "--jobs",
            "3000",
            "--repeat",
            "2",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert "| overview `/` |" in done.stdout
    assert "| failed, next page |" in done.stdout
    assert "slowest p95" in done.stdout
