"""Every example runs, as a user would run it, against a fresh migrated database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

EXPECTED = {
    "quickstart.py": ["sending a welcome email to ada@example.com", "chain completed: Sent("],
    "django_enqueue.py": [
        "is pending",
        "outside atomic(): refused, the connection is in autocommit mode",
        "rolled back: 1 job(s) in the table",
    ],
    "fastapi_app.py": [
        "POST /signups -> 201",
        "welcome email to grace@example.com",
        "completed",
        "GET /expenses/{id} -> waiting for signal 'approval:",
        "' (timeout in 2d 23h)",
        "POST /approvals/{id} -> 202",
        "expense approved by grace",
        "GET /jobs/chains/{id} -> 200, shows 'completed': True",
    ],
    "flask_app.py": [
        "POST /signups -> 201",
        "POST /signups with a declined card -> 402",
        "welcome email to grace@example.com, sent from pgwork-sync-",
    ],
    "logging_middleware.py": [
        "[job=0",
        "attempt=1] charging invoice 42",
        "] took ",
        "[job=- attempt=-] outside any attempt",
    ],
    # How the jobs spread over the processes depends on which one starts first.
    "multi_process_workers.py": ["60 jobs completed by ", " worker processes:"],
    "opentelemetry_example.py": [
        '"name": "POST /orders"',
        '"name": "pgwork enqueue reserve_stock"',
        '"name": "pgwork process reserve_stock"',
        '"name": "check inventory"',
        '"name": "pgwork process ship_order"',
        '"name": "pgwork.jobs.processed"',
        '"name": "pgwork.worker.active_slots"',
    ],
    "prometheus_metrics.py": [
        'pgwork_jobs_processed_total{job_type="ping"',
        "pgwork_attempt_duration_seconds_bucket",
        'pgwork_jobs_enqueued_total{job_type="ping"',
    ],
}


def test_every_example_is_run_by_some_test() -> None:
    tests = "\n".join(p.read_text() for p in Path(__file__).parents[1].rglob("test_*.py"))
    examples = [p.stem for p in EXAMPLES.glob("*.py") if p.name != "__init__.py"]
    examples += [p.name for p in EXAMPLES.iterdir() if p.is_dir() and p.name != "__pycache__"]

    assert [name for name in examples if name not in tests] == []


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs(name: str, pgwork_dsn: str) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        cwd=ROOT,
        env={**os.environ, "PGWORK_DSN": pgwork_dsn},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    missing = [text for text in EXPECTED[name] if text not in done.stdout]
    assert missing == [], done.stdout[-3000:]
    assert "Traceback" not in done.stderr
