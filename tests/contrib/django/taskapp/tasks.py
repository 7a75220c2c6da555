"""The app's tasks that ``manage.py pgwork_worker`` finds and runs."""

from __future__ import annotations

from typing import Any

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
