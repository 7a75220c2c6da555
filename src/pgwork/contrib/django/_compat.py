"""Django's task API, from Django itself (``django.tasks``, Django 6.0+) or from the
``django-tasks`` package that backports it to earlier Djangos: one import path for the
rest of ``pgwork.contrib.django``, whichever is installed. The two differ only in names
(``InvalidTask`` there is ``InvalidTaskError`` here; ``normalize_json`` moved).

``asend_robust``: a signal's ``asend_robust``, which Django has from 5.0 on; on 4.2 its
``send_robust`` run on a thread (``sync_to_async``), as ``asend_robust`` runs sync
receivers."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.dispatch import Signal

__all__ = [
    "DEFAULT_TASK_BACKEND_ALIAS",
    "DEFAULT_TASK_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "asend_robust",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]

try:
    from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, TaskResultStatus, task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import DEFAULT_TASK_PRIORITY, Task, TaskContext, TaskError, TaskResult
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
except ImportError:
    try:
        from django_tasks import DEFAULT_TASK_BACKEND_ALIAS, TaskResultStatus, task, task_backends
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import (
            DEFAULT_TASK_PRIORITY,
            Task,
            TaskContext,
            TaskError,
            TaskResult,
        )
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json
    except ImportError as exc:
        raise ImportError(
            "pgwork.contrib.django needs Django's task framework: Django 6.0 or newer "
            "(django.tasks), or the django-tasks package on an earlier Django "
            "(pip install 'pgwork[django]')"
        ) from exc


async def asend_robust(signal: Signal, sender: Any, **named: Any) -> list[tuple[Any, Any]]:
    """``signal.asend_robust(sender, **named)``: every receiver called, each exception
    one raises logged and returned instead of raised."""
    send = getattr(signal, "asend_robust", None)
    if send is not None:
        return await send(sender, **named)  # type: ignore[no-any-return]
    return await sync_to_async(signal.send_robust)(sender, **named)  # type: ignore[no-any-return]
