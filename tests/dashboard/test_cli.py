"""``pgwork dashboard``: what it refuses, and a served dashboard behind a token."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def test_refuses_a_short_password_beyond_this_machine() -> None:
    done = run("--dsn", "postgresql://nowhere/x", "--host", "0.0.0.0", "--auth", "ops:a")

    assert done.returncode == 2
    assert "at least 12" in done.stderr


def test_reads_the_password_from_a_file_so_ps_never_shows_it(
    pgwork_dsn: str, tmp_path: Path
) -> None:
    secret = "file-passphrase-0123"
    auth_file = tmp_path / "dashboard-auth"
    auth_file.write_text(f"ops:{secret}\n")
    with served(pgwork_dsn, "--auth-file", str(auth_file)) as url:
        shown_in_ps = [
            cmdline.read_bytes()
            for cmdline in Path("/proc").glob("[0-9]*/cmdline")
            if _readable(cmdline) and secret.encode() in cmdline.read_bytes()
        ]
        allowed = httpx.get(f"{url}/", auth=("ops", secret), timeout=10)
        refused = httpx.get(f"{url}/", auth=("ops", "wrong"), timeout=10)

    assert shown_in_ps == []
    assert allowed.status_code == 200
    assert refused.status_code == 401


def _readable(path: Path) -> bool:
    try:
        path.read_bytes()
    except OSError:
        return False
    return True


def test_the_served_dashboard_answers_only_its_own_names(pgwork_dsn: str) -> None:
    """The rebinding request: any Host header used to read every failed job and take
    a CSRF token that paused a queue."""
    with served(pgwork_dsn, "--allowed-host", "dash.test") as url:
        port = url.rsplit(":", 1)[1]
        rebound = httpx.get(
            f"{url}/failed", headers={"host": f"rebind.attacker.example:{port}"}, timeout=10
        )
        posted = httpx.post(
            f"{url}/actions/pause",
            data={"queue": "mail"},
            headers={"host": f"rebind.attacker.example:{port}"},
            timeout=10,
        )
        named = httpx.get(f"{url}/failed", headers={"host": f"dash.test:{port}"}, timeout=10)
        local = httpx.get(f"http://localhost:{port}/failed", timeout=10)

    assert rebound.status_code == posted.status_code == 421
    assert "csrf" not in rebound.text
    assert named.status_code == local.status_code == 200


def test_failed_logins_lock_the_client_out_and_are_logged(pgwork_dsn: str) -> None:
    password = "right-passphrase-42"
    output: list[str] = []
    with served(pgwork_dsn, env={"PGWORK_DASHBOARD_AUTH": f"ops:{password}"}, output=output) as url:
        wrong = [
            httpx.get(f"{url}/", auth=("ops", f"guess-{i}"), timeout=10).status_code
            for i in range(10)
        ]
        locked = httpx.get(f"{url}/", auth=("ops", password), timeout=10)

    assert wrong == [401] * 10
    assert locked.status_code == 429
    assert int(locked.headers["retry-after"]) > 0
    log = output[0]
    assert log.count("pgwork dashboard.auth_failed user=ops client=127.0.0.1") == 11
    assert password not in log


SCHEDULES_MODULE = """
from pydantic import BaseModel

from pgwork import JobTypeRegistry
from pgwork.schedules import CronSchedule


class Note(BaseModel):
    text: str


registry = JobTypeRegistry()
report = registry.job_type("nightly.report", input=Note)
SCHEDULES = [CronSchedule("nightly-report", "30 2 * * *", report, Note(text="hi"))]
"""


def test_serves_the_schedules_a_module_names(pgwork_dsn: str, tmp_path: Path) -> None:
    (tmp_path / "cli_schedules_app.py").write_text(SCHEDULES_MODULE)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    with served(
        pgwork_dsn, "--schedules", "cli_schedules_app:SCHEDULES", env={"PYTHONPATH": path}
    ) as url:
        page = httpx.get(f"{url}/schedules", timeout=10)

    assert page.status_code == 200
    assert 'data-schedule="nightly-report"' in page.text
    assert "30 2 * * *" in page.text


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("os:sep", "not a list of CronSchedule"),
        ("json:loads", "loads"),
        ("no_such_module_here:X", "cannot import"),
        ("nocolon", "is not MODULE:ATTR"),
    ],
)
def test_refuses_schedules_that_are_not_schedules(target: str, message: str) -> None:
    done = run("--dsn", "postgresql://nowhere/x", "--schedules", target)

    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
