"""examples/django_project, run the way its ``manage.py`` says: ``pgwork_migrate`` and
``migrate``, then ``runserver`` and ``pgwork_worker``, each a process of its own, and
the view driven over HTTP.

Django's settings are global to a process (the suite's own Django tests configure
theirs), so the project runs in its own processes, as it does in production; the tests
look at the database on a connection of their own, which sees committed rows only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgwork.testing.databases import temporary_database

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "examples" / "django_project"


def manage(dsn: str, *args: str, **popen: Any) -> subprocess.Popen[str]:
    """``python manage.py ARGS`` in the project's directory, on database ``dsn``."""
    env = {
        **os.environ,
        "PGWORK_DSN": dsn,
        # The suite's own Django tests set their settings module in this environment.
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "PYTHONPATH": str(ROOT / "src"),
    }
    popen.setdefault("stdout", subprocess.PIPE)
    return subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=PROJECT,
        env=env,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def run(dsn: str, *args: str) -> str:
    done = manage(dsn, *args)
    out, _ = done.communicate(timeout=90)
    assert done.returncode == 0, out
    return out


@pytest.fixture(scope="module")
def database(pg_server_dsn: str) -> Iterator[str]:
    """An empty database, then migrated by the project's own commands."""
    with temporary_database(pg_server_dsn) as dsn:
        yield dsn


@pytest.fixture(scope="module")
def migrations(database: str) -> dict[str, str]:
    """What ``manage.py pgwork_migrate`` and ``manage.py migrate`` printed."""
    return {command: run(database, command) for command in ("pgwork_migrate", "migrate")}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def request(url: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of a GET, or of a POST of ``body`` as JSON."""
    data = None if body is None else json.dumps(body).encode()
    sent = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(sent, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


@pytest.fixture(scope="module")
def server(
    database: str, migrations: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """``manage.py runserver`` on a free port: its base URL once it answers."""
    port = free_port()
    log = tmp_path_factory.mktemp("runserver") / "out.txt"
    with log.open("w") as out:
        served = manage(database, "runserver", "--noreload", f"127.0.0.1:{port}", stdout=out)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert served.poll() is None, log.read_text()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        served.terminate()
        served.wait(timeout=30)


def query(dsn: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(statement, params).fetchall()


def counts(dsn: str) -> tuple[int, int]:
    """(signups, jobs), committed."""
    [row] = query(
        dsn, "SELECT (SELECT count(*) FROM signups_signup), (SELECT count(*) FROM pgwork.jobs)"
    )
    return int(row[0]), int(row[1])


def stop(worker: subprocess.Popen[str]) -> str:
    worker.send_signal(signal.SIGTERM)
    out, _ = worker.communicate(timeout=60)
    return out


@pytest.mark.timeout(120)
def test_manage_py_creates_pgwork_schema_and_the_projects_tables(
    database: str, migrations: dict[str, str]
) -> None:
    assert "migrated schema 'pgwork'" in migrations["pgwork_migrate"]
    assert "Applying signups.0001_initial... OK" in migrations["migrate"]
    assert counts(database) == (0, 0)


@pytest.mark.timeout(120)
def test_a_signup_commits_with_its_task_and_the_worker_runs_it(database: str, server: str) -> None:
    status, created = request(f"{server}/signups/", {"email": "ada@example.com"})
    assert status == 201, created
    [(job_status, job_input)] = query(
        database, "SELECT status, input FROM pgwork.jobs WHERE id = %s", created["task"]
    )
    assert (job_status, job_input) == ("pending", {"args": [created["signup"]], "kwargs": {}})

    worker = manage(database, "pgwork_worker", "--poll-interval", "0.2")
    try:
        deadline = time.monotonic() + 60
        status, welcome = request(f"{server}/welcomes/{created['task']}/")
        while welcome["status"] in ("READY", "RUNNING"):
            assert time.monotonic() < deadline, welcome
            time.sleep(0.1)
            status, welcome = request(f"{server}/welcomes/{created['task']}/")
    finally:
        out = stop(worker)

    assert status == 200
    assert welcome == {"status": "SUCCESSFUL", "return_value": "welcomed ada@example.com"}
    [(welcomed_at,)] = query(
        database, "SELECT welcomed_at FROM signups_signup WHERE id = %s", created["signup"]
    )
    assert welcomed_at is not None  # the task's own write, through the ORM
    assert "To: ada@example.com" in out  # the console email backend, in the worker
    assert worker.returncode == 0, out


@pytest.mark.timeout(120)
def test_a_request_that_raises_after_enqueueing_leaves_no_signup_and_no_task(
    database: str, server: str
) -> None:
    before = counts(database)

    status, body = request(f"{server}/signups/", {"email": "eve@example.com", "card": "declined"})

    assert status == 402, body
    assert counts(database) == before
    assert query(database, "SELECT id FROM signups_signup WHERE email = 'eve@example.com'") == []


@pytest.mark.timeout(120)
def test_the_worker_stops_cleanly_on_sigterm(database: str, migrations: dict[str, str]) -> None:
    worker = manage(database, "pgwork_worker", "--poll-interval", "0.2")
    try:
        deadline = time.monotonic() + 60
        while not query(database, "SELECT 1 FROM pgwork.workers WHERE pid = %s", worker.pid):
            assert worker.poll() is None, worker.communicate()[0]
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        out = stop(worker)

    assert worker.returncode == 0, out
    assert "Traceback" not in out
    assert query(database, "SELECT status FROM pgwork.workers WHERE pid = %s", worker.pid) == [
        ("stopped",)
    ]
