"""Running a ``bench`` module the way a user does (``python -m bench...`` from the
repository root), for the tests that keep it working."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

REPO = Path(__file__).resolve().parents[2]


def needs_walinspect(dsn: str) -> None:
    """Skip unless the server can install ``pg_walinspect`` (the WAL read back)."""
    with psycopg.connect(dsn) as conn:
        available = conn.execute(
            "SELECT 1 FROM pg_available_extensions WHERE name = 'pg_walinspect'"
        ).fetchone()
    if available is None:
        pytest.skip("pg_walinspect is not installed on this server")


def run_bench(module: str, dsn: str, *args: str, timeout: float = 280) -> str:
    """``python -m <module> --dsn <dsn> <args>`` from the repository root; its
    standard output, once it exited 0."""
    done = subprocess.run(
        [sys.executable, "-m", module, "--dsn", dsn, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout
