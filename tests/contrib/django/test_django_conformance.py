"""What Django's own task tests check of a backend, checked of pgwork's: the enqueue and
its ``TaskResult``, ``get_result``, the task's validation, the backend's ``check()``.

Django runs these checks (``tests/tasks`` in Django, ``tests/`` in the django-tasks
backport, the database backend's tests) on its dummy, immediate and database backends;
here they run on the real backend, on a migrated database of their own. What happens
on the worker is in ``test_django_conformance_worker.py``; what does not apply to a
queue that runs its tasks later is listed in docs/sync.md ("What Django's tests check").
"""

from __future__ import annotations

import contextlib
import dataclasses
from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest
from django.core import checks
from django.db import connection, connections, transaction
from django.test import override_settings
from django.utils import timezone
from django.utils.module_loading import import_string
from tests.contrib.django._harness import received
from tests.contrib.django.conformanceapp import tasks

from pgwork import PayloadValidationError
from pgwork.contrib.django import PgworkBackend
from pgwork.contrib.django._compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    task,
    task_backends,
    task_enqueued,
)
from pgwork.job_types import JobType

DJANGO_BOUNDS = "priority must be a whole number between -100 and 100"


def count_jobs() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pgwork.jobs")
        row = cur.fetchone()
    return int(row[0]) if row else 0


# --- the enqueue ------------------------------------------------------------------------


@pytest.mark.parametrize("task_", [tasks.do_nothing, tasks.do_nothing_async])
def test_an_enqueued_task_is_ready_and_not_yet_run(django_dsn: str, task_: Any) -> None:
    result = task_.enqueue(1, two=3)

    assert result.status == TaskResultStatus.READY
    assert not result.is_finished
    assert result.enqueued_at is not None
    assert result.started_at is None
    assert result.last_attempted_at is None
    assert result.finished_at is None
    assert result.task == task_
    assert result.args == [1]
    assert result.kwargs == {"two": 3}
    assert result.backend == "default"
    assert result.errors == []
    assert result.worker_ids == []
    assert result.attempts == 0
    with pytest.raises(ValueError, match="not finished"):
        result.return_value  # noqa: B018


def test_the_enqueue_returns_what_get_result_reads_back(django_dsn: str) -> None:
    result = tasks.do_nothing.enqueue("a", b=[1, 2])
    as_enqueued = dataclasses.asdict(result)

    assert task_backends["default"].get_result(result.id) == result
    assert tasks.do_nothing.get_result(result.id) == result
    result.refresh()
    assert dataclasses.asdict(result) == as_enqueued


def test_task_enqueued_is_sent_once_per_enqueue_with_its_result(django_dsn: str) -> None:
    with received(task_enqueued) as seen:
        result = tasks.answer.enqueue()
        later = tasks.answer.using(run_after=timezone.now() + timedelta(hours=1)).enqueue()

    assert seen == [(PgworkBackend, result), (PgworkBackend, later)]


def test_a_task_enqueued_receiver_that_raises_undoes_its_enqueue(django_dsn: str) -> None:
    class Refused(Exception):
        pass

    def refuse(sender: Any, task_result: Any, **kwargs: Any) -> None:
        raise Refused(task_result.id)

    task_enqueued.connect(refuse, weak=False, dispatch_uid="refuse")
    try:
        with pytest.raises(Refused):
            tasks.answer.enqueue()
        with pytest.raises(Refused), transaction.atomic():
            tasks.answer.enqueue()
    finally:
        task_enqueued.disconnect(dispatch_uid="refuse")

    assert count_jobs() == 0


def test_arguments_are_normalised_to_json_as_django_does(django_dsn: str) -> None:
    result = tasks.echo.enqueue((1, 2), b"bytes", {"nested": (3, None)}, flag=True, n=1.5)

    expected_args = [[1, 2], "bytes", {"nested": [3, None]}]
    assert result.args == expected_args
    assert result.kwargs == {"flag": True, "n": 1.5}
    read = task_backends["default"].get_result(result.id)
    assert read.args == expected_args
    assert read.kwargs == {"flag": True, "n": 1.5}


@pytest.mark.parametrize("value", [datetime(2030, 1, 1), object(), {1, 2}])
def test_an_argument_json_cannot_hold_raises_type_error_before_any_sql(
    django_dsn: str, value: Any
) -> None:
    with transaction.atomic():
        with pytest.raises(TypeError, match="Unsupported type") as raised:
            tasks.echo.enqueue(value)
        with pytest.raises(TypeError, match="Unsupported type"):
            tasks.echo.enqueue(ok=[value])
        # Still pgwork's own error, naming the task's job type.
        assert isinstance(raised.value, PayloadValidationError)
        assert "tasks.echo" in str(raised.value)
        assert count_jobs() == 0  # the transaction is still usable

    assert count_jobs() == 0


def test_the_enqueue_validates_the_task_on_the_backend_it_runs_on(django_dsn: str) -> None:
    elsewhere = tasks.answer.using(queue_name="emails")
    moved = {"default": {"BACKEND": "pgwork.contrib.django.PgworkBackend", "QUEUES": ["default"]}}

    with (
        override_settings(TASKS=moved),
        pytest.raises(InvalidTask, match="Queue 'emails' is not valid for backend"),
    ):
        elsewhere.enqueue()

    assert count_jobs() == 0


# --- get_result -------------------------------------------------------------------------


@pytest.mark.parametrize("result_id", [str(uuid4()), "123", 123, ""])
def test_get_result_of_an_id_that_names_no_result_raises_does_not_exist(
    django_dsn: str, result_id: Any
) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(result_id)


def test_get_result_through_another_task_raises_mismatch(django_dsn: str) -> None:
    result = tasks.do_nothing.enqueue()

    with pytest.raises(TaskResultMismatch, match="do_nothing"):
        tasks.answer.get_result(result.id)


def test_a_job_whose_type_names_no_task_is_no_task_result(django_dsn: str) -> None:
    backend = task_backends["default"]
    # A pgwork job whose type names a function of the standard library, not a task:
    # reading it back must not take that function for one.
    not_a_task: JobType[Any, Any] = backend.registry.job_type(
        "subprocess.check_output", input=dict, output=dict
    )
    connection.ensure_connection()
    with transaction.atomic():
        started = backend.client.start_chain_sync(
            connection.connection, not_a_task, {"args": [["true"]], "kwargs": {}}
        )

    with pytest.raises(TaskResultDoesNotExist, match="names no task"):
        backend.get_result(str(started.job_id))


def test_the_result_names_the_task_by_its_module_path(django_dsn: str) -> None:
    result = tasks.answer.using(priority=7, queue_name="emails").enqueue()
    read = task_backends["default"].get_result(result.id)

    assert import_string(tasks.answer.module_path) is tasks.answer
    assert read.task.module_path == tasks.answer.module_path
    assert read.task.func is tasks.answer.func
    assert read.task.name == "answer"
    assert (read.task.priority, read.task.queue_name, read.task.backend) == (7, "emails", "default")
    with connection.cursor() as cur:
        cur.execute("SELECT type_name FROM pgwork.jobs WHERE id = %s", [result.id])
        assert cur.fetchone() == (tasks.answer.module_path,)


# --- validation of a task ---------------------------------------------------------------


def test_priority_is_a_whole_number_within_djangos_bounds(django_dsn: str) -> None:
    for wrong in (-101, 101, 3.1):
        with pytest.raises(InvalidTask, match=DJANGO_BOUNDS):
            tasks.answer.using(priority=wrong)

    lowest = tasks.answer.using(priority=-100).enqueue()
    highest = tasks.answer.using(priority=100).enqueue()
    tasks.answer.using(priority=0)

    backend = task_backends["default"]
    assert backend.get_result(lowest.id).task.priority == -100
    assert backend.get_result(highest.id).task.priority == 100


def test_run_after_is_an_aware_datetime() -> None:
    with pytest.raises(InvalidTask, match="aware datetime"):
        tasks.answer.using(run_after=datetime.now())

    assert tasks.answer.using(run_after=timezone.now()).run_after is not None


def test_the_queue_is_one_of_the_backends_queues_or_any_without_queues() -> None:
    with pytest.raises(InvalidTask, match="Queue 'nowhere' is not valid for backend"):
        tasks.answer.using(queue_name="nowhere")

    anywhere = {"default": {"BACKEND": "pgwork.contrib.django.PgworkBackend", "QUEUES": []}}
    with override_settings(TASKS=anywhere):
        assert tasks.answer.using(queue_name="nowhere").queue_name == "nowhere"


def test_a_task_is_a_function_defined_at_module_level() -> None:
    def local() -> None: ...

    for function in (local, any, lambda: None):
        with pytest.raises(InvalidTask, match="module level"):
            task(function)


def test_a_task_taking_context_takes_it_first() -> None:
    with pytest.raises(InvalidTask, match="first argument of 'context'"):
        task(takes_context=True)(tasks.answer.func)


def test_the_backend_supports_defer_async_tasks_results_and_priority() -> None:
    backend = task_backends["default"]

    assert (
        backend.supports_defer,
        backend.supports_async_task,
        backend.supports_get_result,
        backend.supports_priority,
    ) == (True, True, True, True)
    # So none of these is refused.
    backend.validate_task(tasks.do_nothing_async)
    backend.validate_task(tasks.answer.using(run_after=timezone.now(), priority=5))


def test_the_backend_keeps_its_alias_queues_and_options() -> None:
    backend = task_backends["default"]

    assert backend.alias == "default"
    assert backend.queues == {"default", "emails"}
    assert backend.options == {"MAX_ATTEMPTS": 1}


# --- the check framework ----------------------------------------------------------------


def backend_checks(**options: Any) -> list[checks.CheckMessage]:
    backend = PgworkBackend("other", {"OPTIONS": options})
    return list(backend.check())


def test_check_finds_nothing_wrong_with_a_working_backend() -> None:
    assert list(task_backends["default"].check()) == []
    assert [m for m in checks.run_checks() if m.id and m.id.startswith("pgwork.")] == []


def test_check_reports_a_database_alias_django_does_not_have() -> None:
    [message] = backend_checks(DATABASE="missing")

    assert message.id == "pgwork.E001"
    assert message.level == checks.ERROR
    assert "'missing'" in message.msg
    assert "DATABASES" in str(message.hint)


def test_check_reports_a_database_that_is_not_postgresql(monkeypatch: pytest.MonkeyPatch) -> None:
    lite = connections.configure_settings(
        {"default": {}, "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
    )["lite"]
    monkeypatch.setitem(connections.settings, "lite", lite)
    try:
        [message] = backend_checks(DATABASE="lite")
    finally:
        with contextlib.suppress(AttributeError):  # not made unless the check asked for it
            del connections["lite"]

    assert message.id == "pgwork.E002"
    assert "sqlite" in message.msg


def test_check_reports_the_app_missing_from_installed_apps() -> None:
    from django.apps import apps

    installed = [app.name for app in apps.get_app_configs() if app.name != "pgwork.contrib.django"]
    with override_settings(INSTALLED_APPS=installed):
        [message] = backend_checks()

    assert message.id == "pgwork.W001"
    assert message.level == checks.WARNING
    assert "pgwork.contrib.django" in str(message.hint)
