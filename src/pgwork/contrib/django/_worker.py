"""The worker of a ``PgworkBackend``: each task of the project as a pgwork handler.

The tasks are found where Django projects keep them: the ``tasks`` module of every
installed app is imported, and each ``Task`` in it whose backend is this one gets a
handler. The handler calls the task's function with the job's arguments (and a
``TaskContext`` first when the task takes one), between Django's ``task_started`` and
``task_finished`` (``_execution``); its return value is the job's output.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from django.apps import apps
from django.db import close_old_connections

from pgwork.client import create_client
from pgwork.contrib.django._atomic import check_atomic_database
from pgwork.contrib.django._backend import PgworkBackend, TaskCall
from pgwork.contrib.django._compat import Task, task_backends
from pgwork.contrib.django._execution import run_attempt, run_attempt_async
from pgwork.errors import ConfigurationError
from pgwork.job_types import JobType
from pgwork.postgres.notify import PostgresNotifyAdapter
from pgwork.postgres.state import PostgresStateAdapter
from pgwork.worker import Attempt, InProcessWorker, SyncAttempt, create_in_process_worker

__all__ = ["build_worker", "discover_tasks", "handler_for"]


def backend_named(alias: str) -> PgworkBackend:
    backend = task_backends[alias]
    if not isinstance(backend, PgworkBackend):
        raise ConfigurationError(
            f"TASKS[{alias!r}] is a {type(backend).__name__}, not pgwork's "
            "(BACKEND: 'pgwork.contrib.django.PgworkBackend')"
        )
    return backend


def discover_tasks(backend: PgworkBackend) -> list[Task]:
    """The tasks of ``backend`` in the ``tasks`` modules of the installed apps, in the
    order of INSTALLED_APPS, then of their definitions."""
    found: dict[str, Task] = {}
    for app in apps.get_app_configs():
        name = f"{app.name}.tasks"
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # the tasks module exists and imports a missing one
                raise
            continue
        for value in vars(module).values():
            if isinstance(value, Task) and value.backend == backend.alias:
                found.setdefault(value.module_path, value)
    return list(found.values())


def handler_for(backend: PgworkBackend, task: Task) -> Callable[..., Any]:
    """The handler that runs ``task`` for a job: the task's function called with the
    job's arguments, between Django's signals (``_execution``). An ``async def`` task
    is awaited on the worker's event loop, a plain ``def`` one runs on the worker's
    threads (a sync handler)."""
    if inspect.iscoroutinefunction(task.func):

        async def run_async_task(attempt: Attempt[TaskCall, Any]) -> Any:
            return await run_attempt_async(backend, task, attempt)

        return run_async_task

    def run_task(attempt: SyncAttempt[TaskCall, Any]) -> Any:
        # On one of the worker's threads, each with its own Django connections: those
        # past their age or broken are closed before and after, as a request's are.
        close_old_connections()
        try:
            return run_attempt(backend, task, attempt)
        finally:
            close_old_connections()

    return run_task


async def build_worker(
    alias: str = "default",
    *,
    dsn: str | None = None,
    max_slots: int = 10,
    queues: Sequence[str] | None = None,
    poll_interval: float = 2.0,
) -> InProcessWorker:
    """A worker for the tasks of the backend ``alias`` (``manage.py pgwork_worker``).

    ``queues``: default, the backend's QUEUES. ``dsn``: default, the backend's."""
    backend = backend_named(alias)
    tasks = discover_tasks(backend)
    if not tasks:
        raise ConfigurationError(
            f"no task uses the task backend {alias!r}: define them with @task in a "
            "`tasks` module of an installed app"
        )
    if backend.atomic:
        check_atomic_database(backend)
    processors: dict[JobType[Any, Any] | str, Any] = {
        backend.job_type(task): handler_for(backend, task) for task in tasks
    }
    dsn = dsn or backend.dsn
    state = await PostgresStateAdapter.connect(dsn, schema=backend.schema)
    client = create_client(
        state_adapter=state,
        notify_adapter=PostgresNotifyAdapter(dsn, schema=backend.schema),
        registry=backend.registry,
    )
    try:
        return create_in_process_worker(
            client=client,
            processors=processors,
            max_slots=max_slots,
            queues=list(queues) if queues else sorted(backend.queues),
            poll_interval=poll_interval,
        )
    except BaseException:
        await client.close()
        raise
