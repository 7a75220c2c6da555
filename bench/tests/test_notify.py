"""``python -m bench.notify`` keeps working, and its stampede count counts.

A small run over PostgreSQL's NOTIFY and Redis: three idle worker processes and four
jobs. Over NOTIFY every worker acquires for every job; over Redis one does. Counts are
asserted, never speeds.
"""

from __future__ import annotations

import re

import pytest
from tests.adapters._brokers import redis_url

from bench.tests._runs import run_bench


def _per_job(output: str, transport: str) -> float:
    rows = re.findall(rf"^\| {transport} \| ([0-9.]+) \|", output, re.MULTILINE)
    assert rows, output
    return float(rows[-1])


@pytest.mark.timeout(300)
def test_bench_notify_counts_one_acquire_per_job_with_hints(pg_server_dsn: str) -> None:
    redis_url()  # skips, saying why, without a Redis
    output = run_bench(
        "bench.notify",
        pg_server_dsn,
        "--only=stampede,enqueue",
        "--transports=postgres,redis",
        "--workers=3",
        "--jobs=4",
        "--gap=0.3",
        "--poll=120",
        "--producers=2",
        "--enqueue-jobs=40",
        "--repeat=1",
    )
    assert _per_job(output, "postgres") >= 2, "every idle worker acquires over NOTIFY"
    assert _per_job(output, "redis") <= 1.5, "one worker acquires per job over Redis"
    assert "| 2 |" in output, "the enqueue table has its row"
