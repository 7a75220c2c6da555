"""``PgworkBackend``: Django's task API (``task.enqueue``, ``get_result``) over pgwork's jobs.

A task's enqueue writes one pgwork job on Django's own psycopg connection, inside the
transaction Django has open there: the job commits with the view's rows or not at all
(no ``on_commit``, no second connection). Outside ``transaction.atomic()`` the enqueue
is a transaction of its own, as every statement is in Django's autocommit mode.

How a task maps onto a job:

* job type: the task's module path (``myapp.tasks.send_welcome``), one per task;
* input: ``{"args": [...], "kwargs": {...}}``, JSON only (as Django asks of a task's
  arguments, normalised as Django does: tuples become lists, bytes text): anything
  else is refused before any SQL (``TaskArgumentsError``, a ``TypeError`` as Django's
  own backends raise), the transaction left as it was;
* ``queue_name`` -> the job's queue; ``run_after`` -> its schedule;
* ``priority`` (-100..100, higher first) -> pgwork's priority negated (lower first);
* the result id is the job's id; its output is the task's return value.

``task_enqueued`` is sent once the job is written, in the same transaction: a receiver
that raises undoes the enqueue it was told of (unless the caller catches it inside its
own ``atomic()`` block). ``task_started`` and ``task_finished`` are the worker's
(``_execution``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import pydantic
from django.apps import apps
from django.core import checks
from django.db import connections, transaction
from django.utils.module_loading import import_string
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool
from typing_extensions import TypedDict

from pgwork.client import Client, create_client
from pgwork.contrib.django._atomic import check_atomic_task
from pgwork.contrib.django._compat import (
    BaseTaskBackend,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from pgwork.errors import ConfigurationError, JobNotFoundError, PayloadValidationError
from pgwork.job_types import JobType, JobTypeRegistry
from pgwork.postgres.notify import PostgresNotifyAdapter
from pgwork.postgres.schema import DEFAULT_SCHEMA
from pgwork.postgres.state import PostgresStateAdapter
from pgwork.records import Job, JobStatus

__all__ = ["PgworkBackend", "TaskArgumentsError", "TaskCall", "database_dsn"]

# The backend's OPTIONS, with what each is for (docs/sync.md, "Django").
OPTIONS = {
    "DATABASE": "the Django database alias whose connection the jobs are written on",
    "SCHEMA": "pgwork's schema in that database",
    "DSN": "where the worker connects (default: built from the database's settings)",
    "MAX_ATTEMPTS": "how many times a failing task runs before its result is FAILED",
    "ATOMIC": "the ORM's writes in a task commit with its job's completion",
}

# Django's TaskResult status of each job status: a job waiting for another attempt is
# ready "to be executed again"; a cancelled one was "unable to start".
STATUSES = {
    JobStatus.BLOCKED: TaskResultStatus.READY,
    JobStatus.PENDING: TaskResultStatus.READY,
    JobStatus.RUNNING: TaskResultStatus.RUNNING,
    JobStatus.COMPLETED: TaskResultStatus.SUCCESSFUL,
    JobStatus.FAILED: TaskResultStatus.FAILED,
    JobStatus.CANCELLED: TaskResultStatus.FAILED,
}


# Return values as Django asks of them: JSON, nothing pydantic would turn into it.
JSON_VALUE: Any = pydantic.JsonValue


class TaskCall(TypedDict):
    """A task job's input: the arguments of the call, JSON values only."""

    args: list[pydantic.JsonValue]
    kwargs: dict[str, pydantic.JsonValue]


class TaskArgumentsError(PayloadValidationError, TypeError):
    """A task was enqueued with an argument JSON cannot hold (a datetime, a set, a model
    instance): a ``TypeError``, as Django's own backends raise, and pgwork's
    ``PayloadValidationError``. Raised before any SQL."""

    def __init__(self, type_name: str, reason: Exception) -> None:
        super().__init__(
            type_name,
            "input",
            f"{reason}; a task's arguments are JSON values (str, int, float, bool, None, "
            "lists and dicts of them): pass an id, or an ISO date string, instead",
        )


def task_call(type_name: str, args: Any, kwargs: Any) -> TaskCall:
    """The input of a task's job: ``args`` and ``kwargs`` normalised as Django's
    ``TaskResult`` normalises them (tuples to lists, bytes to text)."""
    try:
        return TaskCall(args=normalize_json(list(args)), kwargs=normalize_json(dict(kwargs)))
    except (TypeError, ValueError) as exc:  # ValueError: bytes that are not UTF-8
        raise TaskArgumentsError(type_name, exc) from None


class PgworkBackend(BaseTaskBackend):  # type: ignore[misc]
    """Django tasks as pgwork jobs: ``TASKS = {"default": {"BACKEND":
    "pgwork.contrib.django.PgworkBackend", "QUEUES": [...], "OPTIONS": {...}}}``.

    OPTIONS: ``DATABASE`` (default ``"default"``), ``SCHEMA`` (``"pgwork"``), ``DSN``
    (the worker's; default: built from that database's settings), ``MAX_ATTEMPTS`` (5),
    ``ATOMIC`` (False: True runs every task in its job's transaction, ``_atomic``).
    ``manage.py pgwork_migrate`` creates the schema, ``manage.py pgwork_worker`` runs
    the tasks."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        super().__init__(alias, params)
        options = dict(params.get("OPTIONS", {}))
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ConfigurationError(
                f"TASKS[{alias!r}] OPTIONS has {', '.join(map(repr, unknown))}, which "
                f"PgworkBackend does not know; it takes {', '.join(OPTIONS)}"
            )
        self.database: str = options.get("DATABASE", "default")
        self.schema: str = options.get("SCHEMA", DEFAULT_SCHEMA)
        self.max_attempts: int = options.get("MAX_ATTEMPTS", 5)
        self._dsn: str | None = options.get("DSN")
        self.atomic: bool = options.get("ATOMIC", False)
        if not isinstance(self.atomic, bool):
            raise ConfigurationError(
                f"TASKS[{alias!r}] OPTIONS ATOMIC must be True or False, got {self.atomic!r}"
            )
        # Django's async ORM runs on threads of its own, outside the job's transaction.
        self.supports_async_task = not self.atomic
        self.registry = JobTypeRegistry()
        self._types: dict[str, JobType[TaskCall, Any]] = {}
        self._lock = threading.Lock()
        self._client: Client | None = None

    @property
    def dsn(self) -> str:
        """Where a worker of this backend connects: OPTIONS ``DSN``, else the DSN of
        Django's ``DATABASE`` alias."""
        return self._dsn if self._dsn is not None else database_dsn(self.database)

    @property
    def client(self) -> Client:
        """The client that writes and reads this backend's jobs on Django's connection.
        Built without an event loop, its pool never opened: every call it makes here
        runs on the connection Django hands it."""
        with self._lock:
            if self._client is None:
                dsn = self.dsn
                self._client = create_client(
                    state_adapter=PostgresStateAdapter(
                        AsyncConnectionPool(dsn, open=False), schema=self.schema
                    ),
                    notify_adapter=PostgresNotifyAdapter(dsn, schema=self.schema),
                    registry=self.registry,
                    observers=[],
                )
            return self._client

    def job_type(self, task: Task) -> JobType[TaskCall, Any]:
        """The job type of ``task``: named after its module path, declared once."""
        name = task.module_path
        with self._lock:
            found = self._types.get(name)
            if found is None:
                found = self.registry.job_type(
                    name,
                    input=TaskCall,
                    output=JSON_VALUE,
                    max_attempts=self.max_attempts,
                    mode="atomic" if self.atomic else "staged",
                )
                self._types[name] = found
            return found

    def validate_task(self, task: Task) -> None:
        if self.atomic:
            check_atomic_task(self.alias, task)
        super().validate_task(task)

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Write the task's job (see the module) and send ``task_enqueued`` in the same
        transaction. The result is the job read back, so it is what ``get_result``
        says of it (``enqueued_at`` on the database's clock): one statement more."""
        self.validate_task(task)
        job_type = self.job_type(task)
        call = task_call(job_type.name, args, kwargs)
        connection = connections[self.database]
        with _in_transaction(self.database):
            connection.ensure_connection()
            started = self.client.start_chain_sync(
                connection.connection,
                job_type,
                call,
                queue=task.queue_name,
                priority=-task.priority,
                schedule=task.run_after,
            )
            job = self.client.get_job_sync(connection.connection, started.job_id)
            result = self.result_of(job, task=task)
            task_enqueued.send(type(self), task_result=result)
        return result

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Django's check framework (``manage.py check``): a database that is missing or
        not PostgreSQL is an error; without the app its commands are missing."""
        found = list(super().check(**kwargs))
        where = f"TASKS[{self.alias!r}]"
        if self.database not in connections.settings:
            found.append(
                checks.Error(
                    f"{where} writes its tasks to the database {self.database!r}, which "
                    "DATABASES does not have",
                    hint="Set the backend's OPTIONS DATABASE to an alias of DATABASES.",
                    id="pgwork.E001",
                )
            )
        elif (vendor := connections[self.database].vendor) != "postgresql":
            found.append(
                checks.Error(
                    f"{where} writes its tasks to DATABASES[{self.database!r}], a {vendor} "
                    "database; pgwork's tasks live in PostgreSQL",
                    hint="Set the backend's OPTIONS DATABASE to a PostgreSQL database.",
                    id="pgwork.E002",
                )
            )
        if not apps.is_installed("pgwork.contrib.django"):
            found.append(
                checks.Warning(
                    f"{where} is pgwork's, but its app is not installed: manage.py "
                    "pgwork_migrate and pgwork_worker are missing",
                    hint="Add 'pgwork.contrib.django' to INSTALLED_APPS.",
                    id="pgwork.W001",
                )
            )
        return found

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result as its job stands now, read on Django's connection (so a
        task enqueued in the transaction still open is found).
        TaskResultDoesNotExist for an id that names no job of a task."""
        try:
            job_id = UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        connection = connections[self.database]
        connection.ensure_connection()
        try:
            job = self.client.get_job_sync(connection.connection, job_id)
        except JobNotFoundError:
            raise TaskResultDoesNotExist(result_id) from None
        return self.result_of(job)

    def result_of(self, job: Job[Any], *, task: Task | None = None) -> TaskResult:
        """The Django ``TaskResult`` of ``job`` (a job this backend enqueued). ``task``:
        the task as enqueued; default: the one the job's type names, with the job's
        options."""
        call = job.input if isinstance(job.input, dict) else {}
        if task is None:
            named = _task_named(job.type_name)
            if named is None:
                raise TaskResultDoesNotExist(
                    f"job {job.id} is of type {job.type_name!r}, which names no task"
                )
            task = named.using(
                priority=-job.priority,
                queue_name=job.queue,
                backend=self.alias,
                run_after=job.scheduled_at if job.scheduled_at > job.created_at else None,
            )
        errors = [
            TaskError(
                exception_class_path=failed.error.type,
                traceback=failed.error.traceback or failed.error.message,
            )
            for failed in job.attempt_history
        ]
        # One entry per attempt (Django counts attempts by them): the failed ones name
        # their worker; the one running names its holder; a finished one is not named
        # on the job, so it stands as "".
        worker_ids = [failed.worker or "" for failed in job.attempt_history]
        worker_ids += [job.leased_by or ""] * (job.attempt - len(worker_ids))
        result = TaskResult(
            task=task,
            id=str(job.id),
            status=STATUSES[job.status],
            enqueued_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.completed_at if job.status.is_final else None,
            last_attempted_at=job.last_attempt_at or job.started_at,
            args=call.get("args", []),
            kwargs=call.get("kwargs", {}),
            backend=self.alias,
            errors=errors,
            worker_ids=worker_ids,
        )
        if job.status is JobStatus.COMPLETED:
            object.__setattr__(result, "_return_value", job.output)
        return result


def _task_named(name: str) -> Task | None:
    """The task whose module path is ``name``: the module's attribute the ``@task``
    decorator left in place of the function."""
    try:
        found = import_string(name)
    except ImportError:
        return None
    return found if isinstance(found, Task) else None


@contextmanager
def _in_transaction(alias: str) -> Iterator[None]:
    """Join the transaction Django has open on ``alias``, or open one for the enqueue
    alone (Django's autocommit mode) and commit it. Never a nested ``atomic()``: one
    without a savepoint would mark the caller's transaction for rollback when the
    enqueue is refused, one with a savepoint costs two statements per enqueue."""
    if connections[alias].in_atomic_block:
        yield
    else:
        with transaction.atomic(using=alias):
            yield


def database_dsn(alias: str) -> str:
    """A libpq DSN for Django's database ``alias``, from the parameters Django itself
    connects with (its psycopg ``get_connection_params``)."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        raise ConfigurationError(
            f"DATABASES[{alias!r}] is a {connection.vendor} database; pgwork's tasks "
            "live in PostgreSQL: point the backend's OPTIONS DATABASE at one"
        )
    params = connection.get_connection_params()
    return make_conninfo(
        "",
        **{
            key: value
            for key, value in params.items()
            if isinstance(value, str | int)
            and not isinstance(value, bool)
            # psycopg's options, not libpq's: the worker sets its own.
            and key not in ("prepare_threshold", "cursor_factory", "context")
        },
    )
