"""``pgwork dashboard``: what it refuses, and a served dashboard behind a token."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from tests.dashboard._server import served

TOKEN = "tok-0123456789abcdef"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from pgwork.cli import main; main()", "dashboard", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.10", "::"])
def test_refuses_a_non_loopback_address_without_authentication(host: str) -> None:
    done = run("--dsn", "postgresql://nowhere/x", "--host", host)

    assert done.returncode == 2
    assert "without authentication" in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--auth", "nopassword"], "USER:PASSWORD"),
        (["--token", "short"], "at least 16"),
        (["--auth", "a:b", "--token", TOKEN], "not both"),
    ],
)
def test_refuses_malformed_credentials(args: list[str], message: str) -> None:
    done = run("--dsn", "postgresql://nowhere/x", *args)

    assert done.returncode == 2
    assert message in done.stderr


def test_serves_the_dashboard_behind_a_token_from_the_environment(pgwork_dsn: str) -> None:
    with served(pgwork_dsn, env={"PGWORK_DASHBOARD_TOKEN": TOKEN}) as url:
        refused = httpx.get(f"{url}/", timeout=10)
        allowed = httpx.get(f"{url}/", headers={"authorization": f"Bearer {TOKEN}"}, timeout=10)

    assert refused.status_code == 401
    assert allowed.status_code == 200
    assert "Overview" in allowed.text
