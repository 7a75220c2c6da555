"""Tasks of an ATOMIC backend: what a plain ``def`` task writes through Django's ORM
commits with its job's completion, once, or not at all.

The backend ``atomic`` of the tests' settings has ``OPTIONS: {"ATOMIC": True}``; its
tasks (``taskapp.tasks``) write ``Effect`` rows. Most tests run its worker in this
process, on an event loop of its own in a thread, and read the rows on the test's own
Django connection; the kill test runs ``manage.py pgwork_worker`` and SIGKILLs it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from django.db import connection, connections
from django.test import override_settings
from psycopg.types.string import TextLoader
from tests.contrib.django.taskapp import tasks
from tests.contrib.django.taskapp.models import Effect
from tests.contrib.django.test_backend import manage, wait_finished

from pgwork import ConfigurationError, JobStatus, create_client, create_in_process_worker
from pgwork.contrib.django import AtomicTaskError, PgworkBackend
from pgwork.contrib.django._compat import InvalidTask, TaskResultStatus, task, task_backends
from pgwork.contrib.django._worker import build_worker, handler_for
from pgwork.postgres.notify import PostgresNotifyAdapter
from pgwork.postgres.state import PostgresStateAdapter
from pgwork.records import Job
from pgwork.worker import InProcessWorker

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def effects(django_dsn: str) -> str:
    """The test's database, with the ``Effect`` table (the DSN)."""
    with connection.schema_editor() as editor:
        editor.create_model(Effect)
    return django_dsn


def keys() -> list[str]:
    return sorted(Effect.objects.values_list("key", flat=True))


def job_row(job_id: str) -> tuple[Any, ...] | None:
    with connection.cursor() as cur:
        cur.execute("SELECT status, attempt FROM pgwork.jobs WHERE id = %s", [job_id])
        return cur.fetchone()


def jobs_of(type_name: str) -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pgwork.jobs WHERE type_name = %s", [type_name])
        row = cur.fetchone()
    return row[0] if row else 0


@contextmanager
def running(
    worker: Callable[[], Any] | None = None,
) -> Iterator[tuple[InProcessWorker, BlockingPortal]]:
    """A worker (default: the ``atomic`` backend's, as ``manage.py pgwork_worker``
    builds it) started in this process, on an event loop in a thread of its own; the
    test's thread stays free for Django's ORM. Stopped, then closed, on the way out."""
    build = worker or partial(build_worker, "atomic", poll_interval=0.2)
    with start_blocking_portal() as portal:
        built: InProcessWorker = portal.call(build)
        try:
            stop = portal.call(built.start)
            try:
                yield built, portal
            finally:
                portal.call(stop)
        finally:
            portal.call(built.client.close)


def settled(
    worker: InProcessWorker, portal: BlockingPortal, job_id: str, until: Callable[[Job[Any]], bool]
) -> Job[Any]:
    """Wait until the job satisfies ``until``, read through the worker's client."""
    deadline = time.monotonic() + 60
    while True:
        job: Job[Any] = portal.call(worker.client.get_job, UUID(job_id))
        if until(job):
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job.status}"
        time.sleep(0.05)


def finished(worker: InProcessWorker, portal: BlockingPortal, job_id: str) -> Job[Any]:
    return settled(worker, portal, job_id, lambda job: job.status.is_final)


def test_a_tasks_orm_write_commits_with_its_completion(effects: str) -> None:
    result = tasks.record.enqueue("ada")

    with running() as (worker, portal):
        job = finished(worker, portal, result.id)

    assert job.status is JobStatus.COMPLETED
    # The task saw its row in its transaction, through Django's adapters and cursor.
    assert job.output == {"seen": 1, "data": {"key": "ada"}, "bound": "ada"}
    assert job.attempt == 1
    assert keys() == ["ada"]


def test_a_failed_attempt_leaves_no_row_and_its_retry_one(effects: str) -> None:
    result = tasks.record_then_fail.enqueue("ada")
    noop = "tests.contrib.django.taskapp.enqueued.noop"

    with running() as (worker, portal):
        failed_once = settled(worker, portal, result.id, lambda job: len(job.attempt_history) == 1)
        # Neither the row nor the task it enqueued outlived the failed attempt.
        after_failure = (keys(), jobs_of(noop))
        with connection.cursor() as cur:  # its backoff has passed
            cur.execute("UPDATE pgwork.jobs SET scheduled_at = now() WHERE id = %s", [result.id])
        job = finished(worker, portal, result.id)

    assert failed_once.status is JobStatus.PENDING
    assert failed_once.attempt_history[0].error.type == "builtins.RuntimeError"
    assert after_failure == ([], 0)
    assert job.status is JobStatus.COMPLETED
    assert job.output == 2
    assert keys() == ["ada"]
    assert jobs_of(noop) == 1


def test_an_inner_atomic_block_that_raises_undoes_only_its_own_writes(effects: str) -> None:
    result = tasks.record_in_savepoints.enqueue("ada")

    with running() as (worker, portal):
        job = finished(worker, portal, result.id)

    assert job.status is JobStatus.COMPLETED
    assert job.output == ["ada-after", "ada-before"]
    assert keys() == ["ada-after", "ada-before"]


def test_close_old_connections_in_a_task_leaves_its_writes(effects: str) -> None:
    result = tasks.record_around_close_old_connections.enqueue("ada")

    with running() as (worker, portal):
        job = finished(worker, portal, result.id)

    assert job.status is JobStatus.COMPLETED
    assert job.output == 2
    assert keys() == ["ada-1", "ada-2"]


def test_closing_djangos_connection_in_a_task_undoes_its_writes(effects: str) -> None:
    result = tasks.record_then_close.enqueue("ada")

    with running() as (worker, portal):
        job = finished(worker, portal, result.id)

    assert job.status is JobStatus.COMPLETED
    assert job.output == "TransactionManagementError"  # no query after the close
    assert keys() == []


def test_set_rollback_undoes_the_tasks_writes_and_completes_its_job(effects: str) -> None:
    result = tasks.record_then_set_rollback.enqueue("ada")

    with running() as (worker, portal):
        job = finished(worker, portal, result.id)

    assert job.status is JobStatus.COMPLETED
    assert job.output == "rolled back"
    assert keys() == []


def test_an_orm_error_the_task_catches_undoes_its_writes_and_completes_its_job(
    effects: str,
) -> None:
    result = tasks.record_then_catch_an_integrity_error.enqueue("ada")

    with running() as (worker, portal):
        job = finished(worker, portal, result.id)

    assert job.status is JobStatus.COMPLETED
    assert job.output == "caught"
    assert keys() == []


def test_what_cannot_be_done_in_the_jobs_transaction_is_refused(effects: str) -> None:
    result = tasks.what_is_refused.enqueue()

    with running() as (worker, portal):
        job = finished(worker, portal, result.id)

    assert job.status is JobStatus.COMPLETED
    refused = job.output
    assert refused["durable"].startswith("RuntimeError: A durable atomic block cannot be nested")
    assert refused["on_commit"].startswith("TransactionManagementError: transaction.on_commit()")
    assert "Enqueue a task instead" in refused["on_commit"]
    for name in ("commit", "rollback", "set_autocommit"):
        assert refused[name] == (
            "TransactionManagementError: This is forbidden when an 'atomic' block is active."
        )
    assert keys() == ["after the refusals"]  # refusals leave the transaction usable


def test_the_thread_gets_its_own_connection_back_and_the_task_s_is_dead(
    effects: str, tmp_path: Path
) -> None:
    """After a task that returned, raised, or was cancelled: the thread's own Django
    connection is back, and the one the task had opens nothing when used again."""
    backend = task_backends["atomic"]
    seen: list[tuple[str, str, bool, str]] = []

    def observed(task: Any) -> Callable[[Any], Any]:
        handler = handler_for(backend, task)

        def run(attempt: Any) -> Any:
            own = connections["default"]
            outcome = "returned"
            try:
                return handler(attempt)
            except Exception as exc:
                outcome = type(exc).__name__
                raise
            finally:
                kept = ""
                while tasks.KEPT:
                    try:
                        tasks.KEPT.pop().cursor()
                    except Exception as exc:
                        kept = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
                seen.append((task.name, outcome, connections["default"] is own, kept))

        return run

    async def worker() -> InProcessWorker:
        state = await PostgresStateAdapter.connect(effects, schema=backend.schema)
        client = create_client(
            state_adapter=state,
            notify_adapter=PostgresNotifyAdapter(effects, schema=backend.schema),
            registry=backend.registry,
        )
        chosen = (tasks.keep_connection, tasks.record_then_fail, tasks.record_then_wait)
        return create_in_process_worker(
            client=client,
            processors={backend.job_type(t): observed(t) for t in chosen},
            max_slots=1,
            poll_interval=0.2,
        )

    async def cancel(job_id: str) -> None:
        async with await psycopg.AsyncConnection.connect(effects) as conn:
            await built.client.cancel(conn, [UUID(job_id)])
            await conn.commit()

    kept = tasks.keep_connection.enqueue()
    failing = tasks.record_then_fail.enqueue("ada")
    with running(worker) as (built, portal):
        finished(built, portal, kept.id)
        settled(built, portal, failing.id, lambda job: len(job.attempt_history) == 1)
        waiting = tasks.record_then_wait.enqueue("grace", str(tmp_path))
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("started-*")):
            assert time.monotonic() < deadline, "the task never started"
            time.sleep(0.05)
        portal.call(cancel, waiting.id)
        # The task goes on until it returns; its end (the job's commit) is refused.
        (tmp_path / "release").touch()
        cancelled = finished(built, portal, waiting.id)
        while len(seen) < 3:
            assert time.monotonic() < deadline, seen
            time.sleep(0.05)

    assert sorted(seen) == [
        (
            "keep_connection",
            "returned",
            True,
            "django.db.utils.InterfaceError: this connection was the job's transaction "
            "of a task that has ended: use django.db.connections inside the task, not "
            "kept from it",
        ),
        ("record_then_fail", "RuntimeError", True, ""),
        ("record_then_wait", "AttemptCancelledError", True, ""),
    ]
    assert cancelled.status is JobStatus.CANCELLED
    assert keys() == []


def test_the_workers_session_is_as_it_was_after_a_task_in_another_time_zone(
    effects: str,
) -> None:
    with override_settings(USE_TZ=False, TIME_ZONE="Asia/Tokyo"):
        result = tasks.session_time_zone.enqueue()
        with running() as (worker, portal):
            job = finished(worker, portal, result.id)
            zone, pid = job.output

            async def session_of_the_task() -> tuple[str, Any, Any]:
                # Every connection of the worker's pool at once: one is the task's.
                pool = worker.client.state.pool  # type: ignore[attr-defined]
                async with AsyncExitStack() as held:
                    for _ in range(pool.max_size):
                        conn = await held.enter_async_context(pool.connection())
                        if conn.info.backend_pid == pid:
                            row = await (await conn.execute("SHOW TimeZone")).fetchone()
                            jsonb = conn.adapters.types["jsonb"].oid
                            loader = conn.adapters.get_loader(jsonb, psycopg.pq.Format.TEXT)
                            return row[0], conn.cursor_factory, loader
                raise AssertionError(f"no connection of the worker's pool is {pid}")

            after, cursor_factory, jsonb_loader = portal.call(session_of_the_task)

    assert job.status is JobStatus.COMPLETED
    assert zone == "Asia/Tokyo"  # Django's zone, in the task
    assert after == "UTC"  # the worker's own, for its later jobs
    assert cursor_factory is psycopg.AsyncCursor
    assert jsonb_loader is not TextLoader


def test_a_sigkilled_worker_leaves_no_row_and_the_task_runs_again_once(
    effects: str, tmp_path: Path
) -> None:
    result = tasks.record_then_wait.enqueue("ada", str(tmp_path))
    worker = manage(effects, "pgwork_worker", "--backend", "atomic", "--poll-interval", "0.2")
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("started-*")):
            assert worker.poll() is None, worker.communicate()[0]
            assert time.monotonic() < deadline, "the task never started"
            time.sleep(0.05)
    finally:
        worker.kill()
        worker.communicate(timeout=30)

    after_kill = (keys(), job_row(result.id))
    (tmp_path / "release").touch()
    with connection.cursor() as cur:  # the dead worker's lease has run out
        cur.execute(
            "UPDATE pgwork.jobs SET leased_until = now() - interval '1 second' WHERE id = %s",
            [result.id],
        )
    again = manage(effects, "pgwork_worker", "--backend", "atomic", "--poll-interval", "0.2")
    try:
        wait_finished(result, timeout=60)
    finally:
        again.kill()
        again.communicate(timeout=30)

    assert after_kill == ([], ("running", 1))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "released"
    assert len(list(tmp_path.glob("started-*"))) == 2
    assert keys() == ["ada"]


async def an_async_function() -> None:
    return None


def test_an_async_task_is_refused_on_an_atomic_backend() -> None:
    with pytest.raises(AtomicTaskError, match="plain `def`") as refused:
        task(backend="atomic")(an_async_function)

    assert isinstance(refused.value, InvalidTask)  # what Django expects of a refusal
    assert isinstance(refused.value, ConfigurationError)
    assert not task_backends["atomic"].supports_async_task
    assert task_backends["default"].supports_async_task


def test_the_atomic_option_must_be_a_bool() -> None:
    with pytest.raises(ConfigurationError, match="ATOMIC must be True or False"):
        PgworkBackend("other", {"OPTIONS": {"ATOMIC": "yes"}})


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("isolation_level", psycopg.IsolationLevel.SERIALIZABLE, "READ COMMITTED"),
        ("assume_role", "reporting", "logs in with"),
    ],
)
def test_a_database_option_the_jobs_transaction_cannot_honour_is_refused(
    django_dsn: str, option: str, value: Any, message: str
) -> None:
    options = connection.settings_dict["OPTIONS"]
    options[option] = value
    try:
        with (
            pytest.raises(ConfigurationError, match=message),
            start_blocking_portal() as portal,
        ):
            portal.call(build_worker, "atomic")
    finally:
        del options[option]
