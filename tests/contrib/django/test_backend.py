"""Django's task API on pgwork: ``task.enqueue`` writes a job in the caller's Django
transaction; ``get_result`` reads it back as Django's ``TaskResult``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone
from tests.contrib.django.taskapp import tasks
from tests.contrib.django.taskapp.enqueued import noop, send_email

from pgwork import JobStatus, PayloadValidationError
from pgwork.contrib.django import PgworkBackend
from pgwork.contrib.django._compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task,
    task_backends,
)

ROOT = Path(__file__).resolve().parents[3]


class Rollback(Exception):
    pass


def job_row(job_id: str) -> tuple[Any, ...] | None:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT type_name, status, queue, priority, scheduled_at, input "
            "FROM pgwork.jobs WHERE id = %s",
            [job_id],
        )
        return cur.fetchone()


def test_the_backend_declares_what_it_supports() -> None:
    backend = task_backends["default"]

    assert isinstance(backend, PgworkBackend)
    assert backend.supports_defer
    assert backend.supports_async_task
    assert backend.supports_get_result
    assert backend.supports_priority


def test_a_rolled_back_enqueue_leaves_no_job(django_dsn: str) -> None:
    seen = []

    def view() -> None:
        with transaction.atomic():
            result = send_email.enqueue("ada@example.com")
            seen.append((result.id, job_row(result.id) is not None))
            raise Rollback

    with pytest.raises(Rollback):
        view()
    [(job_id, visible_inside)] = seen

    assert visible_inside
    assert job_row(job_id) is None


def test_a_committed_enqueue_is_a_job_with_the_tasks_options(django_dsn: str) -> None:
    later = timezone.now() + timedelta(hours=1)
    with transaction.atomic():
        result = send_email.using(run_after=later).enqueue("ada@example.com", subject="hi")

    row = job_row(result.id)
    assert row is not None
    type_name, status, queue, priority, scheduled_at, payload = row
    assert type_name == "tests.contrib.django.taskapp.enqueued.send_email"
    assert status == "pending"
    assert queue == "emails"
    assert priority == -10  # Django runs higher priorities first, pgwork lower ones
    assert scheduled_at == later
    assert json.loads(payload) == {"args": ["ada@example.com"], "kwargs": {"subject": "hi"}}
    assert result.status == TaskResultStatus.READY
    assert result.args == ["ada@example.com"]
    assert result.kwargs == {"subject": "hi"}


def test_an_enqueue_outside_atomic_commits_on_its_own(django_dsn: str) -> None:
    result = noop.enqueue()

    assert connection.get_autocommit()
    connection.close()  # a new connection sees only what was committed
    assert job_row(result.id) is not None


def test_arguments_that_are_not_json_are_refused_before_any_sql(django_dsn: str) -> None:
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("CREATE TABLE signups (email text)")
            cur.execute("INSERT INTO signups VALUES ('ada@example.com')")
        with pytest.raises(PayloadValidationError, match="send_email"):
            send_email.enqueue(timezone.now())
        with pytest.raises(PayloadValidationError):
            send_email.enqueue("ada@example.com", subject={1, 2})
        # The transaction goes on: nothing failed in it.
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM signups")
            assert cur.fetchone() == (1,)

    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM signups")
        assert cur.fetchone() == (1,)
        cur.execute("SELECT count(*) FROM pgwork.jobs")
        assert cur.fetchone() == (0,)


def test_get_result_sees_a_job_of_the_open_transaction(django_dsn: str) -> None:
    with transaction.atomic():
        result = send_email.enqueue("ada@example.com")
        found = send_email.get_result(result.id)

    assert found.id == result.id
    assert found.status == TaskResultStatus.READY
    assert found.task.func is send_email.func
    assert found.task.queue_name == "emails"
    assert found.task.priority == 10
    assert found.args == ["ada@example.com"]
    assert found.enqueued_at is not None
    assert not found.is_finished
    with pytest.raises(ValueError, match="not finished"):
        found.return_value  # noqa: B018


def test_get_result_of_an_unknown_id_raises_task_result_does_not_exist(
    django_dsn: str,
) -> None:
    backend = task_backends["default"]

    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result("00000000-0000-0000-0000-000000000000")
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result("not-a-job-id")


def test_invalid_tasks_are_refused_as_django_says(django_dsn: str) -> None:
    with pytest.raises(InvalidTask, match="priority"):
        send_email.using(priority=101)
    with pytest.raises(InvalidTask, match="aware"):
        send_email.using(run_after=timezone.now().replace(tzinfo=None))
    with pytest.raises(InvalidTask, match="Queue"):
        send_email.using(queue_name="nowhere")
    with pytest.raises(InvalidTask, match="module level"):

        @task
        def local() -> None: ...


def test_a_pgwork_option_that_does_not_exist_is_refused() -> None:
    from pgwork import ConfigurationError

    with pytest.raises(ConfigurationError, match="MAX_ATEMPTS"):
        PgworkBackend("other", {"OPTIONS": {"MAX_ATEMPTS": 3}})


def manage(dsn: str, *args: str, **popen: Any) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PGWORK_DJANGO_TEST_DSN": dsn,
        "DJANGO_SETTINGS_MODULE": "tests.contrib.django.settings",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def wait_finished(result: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not result.is_finished:
        assert time.monotonic() < deadline, f"{result.id} still {result.status}"
        time.sleep(0.05)
        result.refresh()


def test_manage_py_pgwork_migrate_provisions_the_schema(empty_database_dsn: str) -> None:
    done = manage(empty_database_dsn, "pgwork_migrate")
    out, _ = done.communicate(timeout=60)
    again = manage(empty_database_dsn, "pgwork_migrate")
    out_again, _ = again.communicate(timeout=60)

    assert done.returncode == 0, out
    assert "migrated schema 'pgwork'" in out
    assert again.returncode == 0, out_again
    assert "is already at" in out_again


def test_manage_py_pgwork_worker_runs_async_and_sync_tasks(django_dsn: str) -> None:
    with transaction.atomic():
        added = tasks.add.enqueue(2, 3)
        failed = tasks.explode.enqueue("boom")
        context = tasks.which_attempt.enqueue()
        multiplied = tasks.multiply.enqueue(6, 7)
        queried = tasks.through_django.enqueue(41)
    worker = manage(django_dsn, "pgwork_worker", "--poll-interval", "0.2")
    try:
        for result in (added, failed, context, multiplied, queried):
            wait_finished(result)
    finally:
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=30)

    assert worker.returncode == 0, out
    assert added.status == TaskResultStatus.SUCCESSFUL
    assert added.return_value == 5
    assert added.started_at is not None
    assert added.finished_at is not None
    assert added.attempts == 1
    assert failed.status == TaskResultStatus.FAILED
    assert [error.exception_class for error in failed.errors] == [ValueError]
    assert "boom" in failed.errors[0].traceback
    assert context.return_value == {"attempt": 1, "id": context.id}
    assert multiplied.return_value == 42
    assert queried.return_value == [42]
    with connection.cursor() as cur:
        cur.execute("SELECT status FROM pgwork.jobs WHERE id = %s", [added.id])
        assert cur.fetchone() == (JobStatus.COMPLETED.value,)
