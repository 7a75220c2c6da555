"""``python -m bench.dashboard`` keeps working, idle and beside a draining worker, at a
tiny size (times are not checked)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from bench.tests._runs import REPO


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_dashboard_loads_jobs_and_times_every_page(pg_server_dsn: str) -> None:
    done = _bench(pg_server_dsn, "--jobs", "3000", "--repeat", "2")

    assert done.returncode == 0, done.stdout + done.stderr
    assert "| overview `/` |" in done.stdout
    assert "| failed, next page |" in done.stdout
    assert "slowest p95" in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_dashboard_times_pages_while_a_worker_drains(pg_server_dsn: str) -> None:
    done = _bench(
        pg_server_dsn, "--jobs", "3000", "--drain", "20000", "--repeat", "2", "--only", "workers"
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"a worker with 100 slots drained [\d,]+ jobs", done.stdout)
    assert "| workers `/workers` |" in done.stdout
    assert "| overview `/` |" not in done.stdout


def _bench(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.dashboard", "--dsn", dsn, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
