"""The app's tasks that ``manage.py pgwork_worker`` finds and runs."""

from __future__ import annotations

from typing import Any

from django.db import connection

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
