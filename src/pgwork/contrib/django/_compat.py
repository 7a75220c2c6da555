"""Django's task API, from Django itself (``django.tasks``, Django 6.0+) or from the
``django-tasks`` package that backports it to earlier Djangos: one import path for the
rest of ``pgwork.contrib.django``, whichever is installed. The two differ only in names
(``InvalidTask`` there is ``InvalidTaskError`` here; ``normalize_json`` moved)."""

from __future__ import annotations

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
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
]

try:
    from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, TaskResultStatus, task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import DEFAULT_TASK_PRIORITY, Task, TaskContext, TaskError, TaskResult
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
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
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.utils import normalize_json
    except ImportError as exc:
        raise ImportError(
            "pgwork.contrib.django needs Django's task framework: Django 6.0 or newer "
            "(django.tasks), or the django-tasks package on an earlier Django "
            "(pip install 'pgwork[django]')"
        ) from exc
