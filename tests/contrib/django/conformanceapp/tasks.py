"""Tasks for the checks Django's task tests make of a backend, each a plain module-level
``@task``, as Django asks. The worker of ``test_django_conformance.py`` finds them here,
as ``manage.py pgwork_worker`` would."""

from __future__ import annotations

import sys
from typing import Any

from django.db import connection

from pgwork.contrib.django._compat import TaskContext, task


@task
def do_nothing(*args: Any, **kwargs: Any) -> None:
    return None


@task
async def do_nothing_async(*args: Any, **kwargs: Any) -> None:
    return None


@task
def answer() -> int:
    return 42


@task
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """The call's arguments as the function saw them (``args`` a tuple, as Python
    passes them: the value stored is a list, as JSON has no tuples)."""
    return {"args": args, "kwargs": kwargs, "types": [type(a).__name__ for a in args]}


@task
def raise_value_error(message: str) -> None:
    raise ValueError(message)


@task
async def raise_value_error_async(message: str) -> None:
    raise ValueError(message)


@task
def raise_nested() -> None:
    raise ValueError(ValueError("the inner error"))


@task
def exit_process(code: int) -> None:
    sys.exit(code)


@task
async def exit_process_async(code: int) -> None:
    sys.exit(code)


@task
def interrupt() -> None:
    raise KeyboardInterrupt("pressed")


@task
def return_unstorable() -> Any:
    return {"when": object()}


@task
def return_not_a_number() -> float:
    """A float Django's normalisation lets through and pgwork cannot store."""
    return float("nan")


@task(takes_context=True)
def own_id(context: TaskContext) -> str:
    return context.task_result.id


@task(takes_context=True)
def which_attempt(context: TaskContext) -> dict[str, Any]:
    result = context.task_result
    return {
        "attempt": context.attempt,
        "status": str(result.status),
        "worker_ids": list(result.worker_ids),
        "started": result.started_at is not None,
    }


@task(takes_context=True, backend="retrying")
def fail_once(context: TaskContext) -> dict[str, Any]:
    """Fails its first attempt; the second returns what its context said of the task."""
    if context.attempt < 2:
        raise RuntimeError(f"attempt {context.attempt} fails")
    result = context.task_result
    return {
        "attempt": context.attempt,
        "errors": [error.exception_class_path for error in result.errors],
        "workers": len(result.worker_ids),
    }


@task
def note_run(label: str) -> None:
    """Append ``label`` to the table ``runs`` the test made: the order tasks ran in."""
    with connection.cursor() as cur:
        cur.execute("INSERT INTO runs (label) VALUES (%s)", [label])
