"""What Django's own task tests check of a backend once its tasks run, checked of
pgwork's worker: the finished ``TaskResult`` (status, times, attempts, return value,
errors), ``TaskContext``, JSON round trips, retries, ``run_after`` and priority, and the
signals ``task_started`` and ``task_finished``.

The worker is the one ``manage.py pgwork_worker`` runs (``build_worker``), here in a
thread of the test's process (``_harness.running_worker``). The enqueue side is in
``test_django_conformance.py``.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import anyio
import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections
from django.utils import timezone
from tests.contrib.django._harness import received, running_worker, wait_finished, wait_until
from tests.contrib.django.conformanceapp import tasks

from pgwork import PayloadError
from pgwork.contrib.django import PgworkBackend
from pgwork.contrib.django._compat import (
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from pgwork.contrib.django._worker import build_worker

# Django logs each task through receivers of its own signals, on its tasks logger.
TASKS_LOGGER = "django.tasks" if TaskResult.__module__.startswith("django.") else "django_tasks"


def assert_ran_once(result: TaskResult) -> None:
    """The times and counts of a task that ran one attempt to its end."""
    assert result.is_finished
    assert result.started_at is not None
    assert result.last_attempted_at is not None
    assert result.finished_at is not None
    assert result.enqueued_at is not None
    assert result.started_at >= result.enqueued_at
    assert result.finished_at >= result.started_at
    assert result.attempts == 1
    assert len(result.worker_ids) == 1


def make_due(result: TaskResult) -> None:
    """Make the task's job due now (a deferred task, or a retry waiting its backoff)."""
    with connection.cursor() as cur:
        cur.execute("UPDATE pgwork.jobs SET scheduled_at = now() WHERE id = %s", [result.id])


def test_a_task_that_returns_succeeds_with_its_value(django_dsn: str) -> None:
    results = [
        tasks.do_nothing.enqueue(1, two=3),
        tasks.do_nothing_async.enqueue(),
        tasks.answer.enqueue(),
    ]

    with running_worker():
        for result in results:
            wait_finished(result)

    for result in results:
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.errors == []
        assert_ran_once(result)
    assert [result.return_value for result in results] == [None, None, 42]


def test_a_task_that_raises_fails_with_its_exception_and_traceback(django_dsn: str) -> None:
    results = [
        tasks.raise_value_error.enqueue("boom"),
        tasks.raise_value_error_async.enqueue("async boom"),
        tasks.raise_nested.enqueue(),
    ]

    with running_worker() as worker:
        for result in results:
            wait_finished(result)

    for result in results:
        assert result.status == TaskResultStatus.FAILED
        with pytest.raises(ValueError, match="Task failed"):
            result.return_value  # noqa: B018
        assert_ran_once(result)
        assert result.worker_ids == [worker.worker_id]
        [error] = result.errors
        assert error.exception_class is ValueError
    plain, in_async, nested = (result.errors[0].traceback for result in results)
    assert plain.endswith("ValueError: boom\n")
    assert in_async.endswith("ValueError: async boom\n")
    assert 'raise ValueError(ValueError("the inner error"))' in nested


def test_a_task_that_exits_fails_and_the_worker_goes_on(django_dsn: str) -> None:
    exits = [tasks.exit_process.enqueue(3), tasks.exit_process_async.enqueue(4)]

    with running_worker() as worker:
        for result in exits:
            wait_finished(result)
        after = tasks.answer.enqueue()
        wait_finished(after)

    for result, code in zip(exits, (3, 4), strict=True):
        assert result.status == TaskResultStatus.FAILED
        [error] = result.errors
        assert error.exception_class is SystemExit
        assert error.traceback.endswith(f"SystemExit: {code}\n")
        assert result.worker_ids == [worker.worker_id]
    assert after.return_value == 42


def test_a_return_value_json_cannot_hold_fails_the_task_with_type_error(
    django_dsn: str,
) -> None:
    result = tasks.return_unstorable.enqueue()

    with running_worker():
        wait_finished(result)

    assert result.status == TaskResultStatus.FAILED
    assert result._return_value is None
    [error] = result.errors
    assert error.exception_class is TypeError
    assert "Unsupported type" in error.traceback


def test_a_value_pgwork_cannot_store_fails_the_task_before_task_finished(
    django_dsn: str,
) -> None:
    with received(task_finished) as finished:
        result = tasks.return_not_a_number.enqueue()
        with running_worker():
            wait_finished(result)

    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert issubclass(error.exception_class, PayloadError)
    assert [r.status for _, r in finished] == [TaskResultStatus.FAILED]


def test_arguments_and_return_values_round_trip_through_json(django_dsn: str) -> None:
    result = tasks.echo.enqueue((1, 2), b"bytes", "h\u00e9llo \u2713", None, {"k": (1,)}, n=2.5)

    with running_worker():
        wait_finished(result)

    assert result.return_value == {
        "args": [[1, 2], "bytes", "h\u00e9llo \u2713", None, {"k": [1]}],
        "kwargs": {"n": 2.5},
        "types": ["list", "str", "str", "NoneType", "dict"],
    }


def test_a_task_taking_context_sees_its_own_running_result(django_dsn: str) -> None:
    own = tasks.own_id.enqueue()
    attempt = tasks.which_attempt.enqueue()

    with running_worker() as worker:
        wait_finished(own)
        wait_finished(attempt)

    assert own.return_value == own.id
    assert attempt.return_value == {
        "attempt": 1,
        "status": "RUNNING",
        "worker_ids": [worker.worker_id],
        "started": True,
    }


def test_a_retried_task_counts_its_attempts_and_keeps_each_error(django_dsn: str) -> None:
    with received(task_started) as started, received(task_finished) as finished:
        result = tasks.fail_once.enqueue()
        with running_worker("retrying") as worker:
            wait_until(result, lambda r: bool(r.errors))
            between = (result.status, result.attempts, result.is_finished)
            make_due(result)
            wait_finished(result)

    assert between == (TaskResultStatus.READY, 1, False)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.attempts == 2
    assert result.worker_ids[0] == worker.worker_id
    [error] = result.errors
    assert error.exception_class is RuntimeError
    assert error.traceback.endswith("RuntimeError: attempt 1 fails\n")
    # The second attempt's context knew of the first one's error.
    assert result.return_value == {"attempt": 2, "errors": ["builtins.RuntimeError"], "workers": 2}
    assert [(r.status, r.attempts) for _, r in started] == [
        (TaskResultStatus.RUNNING, 1),
        (TaskResultStatus.RUNNING, 2),
    ]
    # Finished once: an attempt that will be retried has not finished the task.
    assert [(r.status, r.attempts) for _, r in finished] == [(TaskResultStatus.SUCCESSFUL, 2)]


def test_a_deferred_task_waits_for_its_run_after(django_dsn: str) -> None:
    deferred = tasks.answer.using(run_after=timezone.now() + timedelta(hours=1)).enqueue()
    now = tasks.answer.enqueue()

    with running_worker():
        wait_finished(now)
        deferred.refresh()
        waiting = deferred.status
        make_due(deferred)
        wait_finished(deferred)

    assert waiting == TaskResultStatus.READY
    assert deferred.return_value == 42


def test_higher_priority_tasks_run_first(django_dsn: str) -> None:
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE runs (n serial PRIMARY KEY, label text)")
    results = [
        tasks.note_run.using(priority=priority).enqueue(str(priority))
        for priority in (-5, 0, 50, 10)
    ]

    with running_worker(max_slots=1):
        for result in results:
            wait_finished(result)

    with connection.cursor() as cur:
        cur.execute("SELECT label FROM runs ORDER BY n")
        assert [label for (label,) in cur.fetchall()] == ["50", "10", "0", "-5"]


def test_the_worker_sends_task_started_then_task_finished(django_dsn: str) -> None:
    with received(task_started) as started, received(task_finished) as finished:
        ok = tasks.answer.enqueue()
        ok_async = tasks.do_nothing_async.enqueue()
        failed = tasks.raise_value_error.enqueue("boom")
        with running_worker() as worker:
            for result in (ok, ok_async, failed):
                wait_finished(result)

    assert {sender for sender, _ in started + finished} == {PgworkBackend}
    by_id = {r.id: r for _, r in started}
    assert sorted(by_id) == sorted([ok.id, ok_async.id, failed.id])
    for result in by_id.values():
        assert result.status == TaskResultStatus.RUNNING
        assert result.started_at is not None
        assert result.worker_ids == [worker.worker_id]
    ended = {r.id: r for _, r in finished}
    assert len(finished) == 3
    assert ended[ok.id].status == TaskResultStatus.SUCCESSFUL
    assert ended[ok.id].return_value == 42
    assert ended[ok.id].finished_at is not None
    assert ended[ok_async.id].status == TaskResultStatus.SUCCESSFUL
    assert ended[failed.id].status == TaskResultStatus.FAILED
    assert ended[failed.id].errors[0].exception_class is ValueError
    assert ended[failed.id].errors[0].traceback.endswith("ValueError: boom\n")


def test_django_logs_each_task_through_its_signals(
    django_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=TASKS_LOGGER)
    ok = tasks.answer.enqueue()
    failed = tasks.raise_value_error.enqueue("boom")

    with running_worker():
        wait_finished(ok)
        wait_finished(failed)

    def lines(result: TaskResult) -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == TASKS_LOGGER and result.id in r.getMessage()
        ]

    assert [line.split()[-1] for line in lines(ok)] == [
        "backend=default",
        "state=RUNNING",
        "state=SUCCESSFUL",
    ]
    assert "enqueued" in lines(ok)[0]
    assert [line.split()[-1] for line in lines(failed)][1:] == ["state=RUNNING", "state=FAILED"]


def test_a_receiver_that_raises_on_the_worker_leaves_the_task_alone(
    django_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(sender: Any, task_result: TaskResult, **kwargs: Any) -> None:
        raise RuntimeError(f"receiver broke on {task_result.status}")

    task_started.connect(broken, weak=False, dispatch_uid="broken")
    task_finished.connect(broken, weak=False, dispatch_uid="broken")
    try:
        result = tasks.answer.enqueue()
        with running_worker():
            wait_finished(result)
    finally:
        task_started.disconnect(dispatch_uid="broken")
        task_finished.disconnect(dispatch_uid="broken")

    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42
    logged = [r for r in caplog.records if r.levelno == logging.ERROR and r.exc_info]
    assert {str(r.exc_info[1]) for r in logged if r.exc_info} >= {
        "receiver broke on RUNNING",
        "receiver broke on SUCCESSFUL",
    }


@pytest.mark.anyio
async def test_the_async_api_enqueues_reads_and_refreshes(django_dsn: str) -> None:
    backend = task_backends["default"]
    try:
        with received(task_enqueued) as enqueued:
            result = await tasks.answer.aenqueue()
        other = await tasks.do_nothing_async.aenqueue()

        assert enqueued == [(PgworkBackend, result)]
        assert result.status == TaskResultStatus.READY
        assert await backend.aget_result(result.id) == result
        assert await tasks.answer.aget_result(result.id) == result
        with pytest.raises(TaskResultMismatch):
            await tasks.answer.aget_result(other.id)
        with pytest.raises(TaskResultDoesNotExist):
            await backend.aget_result("123")

        worker = await build_worker(poll_interval=0.1)
        try:
            async with worker:
                with anyio.fail_after(30):
                    while not result.is_finished or not other.is_finished:
                        await anyio.sleep(0.05)
                        await result.arefresh()
                        await other.arefresh()
        finally:
            await worker.client.close()

        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == 42
        assert other.return_value is None
    finally:
        # aenqueue and aget_result ran on asgiref's thread: its connection goes too.
        await sync_to_async(connections.close_all)()
