"""The app's tasks that ``manage.py pgwork_worker`` finds and runs."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import uuid4

from django.db import (
    IntegrityError,
    close_old_connections,
    connection,
    connections,
    transaction,
)
from tests.contrib.django.taskapp.enqueued import noop
from tests.contrib.django.taskapp.models import Effect

from pgwork.contrib.django._compat import TaskContext, task


@task
async def add(a: int, b: int) -> int:
    return a + b


@task
async def explode(message: str) -> None:
    raise ValueError(message)


@task(takes_context=True)
async def which_attempt(context: TaskContext) -> dict[str, Any]:
    return {"attempt": context.attempt, "id": context.task_result.id}


@task
def multiply(a: int, b: int) -> int:
    """A plain ``def`` task: it runs on one of the worker's threads."""
    return a * b


@task
def through_django(value: int) -> list[Any]:
    """A plain ``def`` task that queries through Django's own connection, on the thread
    that runs it."""
    with connection.cursor() as cur:
        cur.execute("SELECT %s::int + 1", [value])
        row = cur.fetchone()
    return [row[0] if row else None]


# --- the "atomic" backend: each task writes in its job's transaction ------------------


@task(backend="atomic")
def record(key: str) -> dict[str, Any]:
    """Writes one row through the ORM, and reads back what Django reads as its own
    connection would: a JSON field, a parameter bound by Django's cursor (client-side,
    which a parameter of a SET needs; ended with the job's transaction)."""
    Effect.objects.create(key=key, data={"key": key})
    with connection.cursor() as cur:
        cur.execute("SET LOCAL application_name = %s", [key])
        cur.execute("SELECT current_setting('application_name')")
        row = cur.fetchone()
    return {
        "seen": Effect.objects.select_for_update().filter(key=key).count(),
        "data": Effect.objects.get(key=key).data,
        "bound": row[0] if row else None,
    }


@task(backend="atomic", takes_context=True)
def record_then_fail(context: TaskContext, key: str) -> int:
    """Writes a row and enqueues a task, then fails on its first attempt."""
    Effect.objects.create(key=key)
    noop.enqueue()
    if context.attempt == 1:
        raise RuntimeError("the first attempt fails after its writes")
    return context.attempt


@task(backend="atomic")
def record_in_savepoints(key: str) -> list[str]:
    """An inner ``atomic()`` block that raises, caught: the outer writes go on."""
    Effect.objects.create(key=f"{key}-before")
    try:
        with transaction.atomic():
            Effect.objects.create(key=f"{key}-inner")
            raise ValueError("undo the inner block")
    except ValueError:
        pass
    Effect.objects.create(key=f"{key}-after")
    return sorted(Effect.objects.values_list("key", flat=True))


@task(backend="atomic")
def record_then_wait(key: str, folder: str) -> str:
    """Writes a row, says so with a file in ``folder``, then waits there for a file
    named ``release`` (a test kills the worker meanwhile)."""
    Effect.objects.create(key=key)
    (Path(folder) / f"started-{uuid4()}").touch()
    for _ in range(1200):
        if (Path(folder) / "release").exists():
            return "released"
        time.sleep(0.05)
    return "never released"


@task(backend="atomic")
def record_around_close_old_connections(key: str) -> int:
    """Django's ``close_old_connections`` mid-task, as long-running code calls it."""
    Effect.objects.create(key=f"{key}-1")
    close_old_connections()
    Effect.objects.create(key=f"{key}-2")
    return Effect.objects.count()


@task(backend="atomic")
def record_then_set_rollback(key: str) -> str:
    """Asks for the rollback of its writes, and returns."""
    Effect.objects.create(key=key)
    transaction.set_rollback(True)
    return "rolled back"


@task(backend="atomic")
def record_then_catch_an_integrity_error(key: str) -> str:
    """Catches the error of a save that Django marks its atomic block for rollback by."""
    first = Effect.objects.create(key=key)
    try:
        Effect.objects.create(id=first.id, key=f"{key}-again")
    except IntegrityError:
        return "caught"
    return "saved twice"


@task(backend="atomic")
def what_is_refused() -> dict[str, str]:
    """What Django raises in a task for what cannot be done in the job's transaction."""
    refused: dict[str, str] = {}
    attempts: dict[str, Callable[[], Any]] = {
        "durable": lambda: transaction.atomic(durable=True).__enter__(),
        "on_commit": lambda: transaction.on_commit(lambda: None),
        "commit": transaction.commit,
        "rollback": transaction.rollback,
        "set_autocommit": lambda: transaction.set_autocommit(True),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
        except Exception as exc:
            refused[name] = f"{type(exc).__name__}: {exc}"
    Effect.objects.create(key="after the refusals")
    return refused


@task(backend="atomic")
def session_time_zone() -> list[Any]:
    """The session's TimeZone in the task, and which server session it is."""
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('TimeZone'), pg_backend_pid()")
        row = cur.fetchone()
    return list(row or ())


# The Django connections ``keep_connection`` kept past its task.
KEPT: list[Any] = []


@task(backend="atomic")
def keep_connection() -> None:
    """Keeps its thread's Django connection for after the task (which it must not)."""
    KEPT.append(connections["default"])


@task(backend="atomic")
def record_then_close(key: str) -> str:
    """Closes Django's connection after a write, then tries another query."""
    Effect.objects.create(key=key)
    connection.close()
    try:
        Effect.objects.count()
    except Exception as exc:
        return type(exc).__name__
    return "the query ran"
