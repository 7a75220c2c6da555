"""pgwork as a backend of Django's task framework (``django.tasks``, Django 6.0+, or the
``django-tasks`` package on earlier Djangos): ``pip install 'pgwork[django]'``.

    INSTALLED_APPS = [..., "pgwork.contrib.django"]
    TASKS = {"default": {"BACKEND": "pgwork.contrib.django.PgworkBackend"}}

then ``manage.py pgwork_migrate`` once and ``manage.py pgwork_worker`` to run the
tasks. See docs/sync.md, "Django".
"""

from __future__ import annotations

from pgwork.contrib.django._atomic import AtomicTaskError
from pgwork.contrib.django._backend import PgworkBackend, TaskArgumentsError

__all__ = ["AtomicTaskError", "PgworkBackend", "TaskArgumentsError"]
