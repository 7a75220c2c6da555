"""The smallest Django project that uses pgwork's task backend: the tests' settings.

The database is the one ``PGWORK_DJANGO_TEST_DSN`` names (a ``manage.py`` run in a
subprocess); in-process, each test points Django at a database of its own.
"""

from __future__ import annotations

import importlib.util
import os

from psycopg.conninfo import conninfo_to_dict

_params = conninfo_to_dict(os.environ.get("PGWORK_DJANGO_TEST_DSN", "dbname=postgres"))

SECRET_KEY = "tests"
USE_TZ = True
INSTALLED_APPS = [
    "pgwork.contrib.django",
    "tests.contrib.django.taskapp",
    "tests.contrib.django.conformanceapp",
]
if importlib.util.find_spec("django.tasks") is None:
    INSTALLED_APPS.append("django_tasks")  # the backport, on Django before 6.0
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _params.get("dbname", ""),
        "USER": _params.get("user", ""),
        "PASSWORD": _params.get("password", ""),
        "HOST": _params.get("host", ""),
        "PORT": _params.get("port", ""),
    }
}
TASKS = {
    "default": {
        "BACKEND": "pgwork.contrib.django.PgworkBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"MAX_ATTEMPTS": 1},
    },
    # A task that fails then succeeds: its attempts, errors and context.attempt.
    "retrying": {
        "BACKEND": "pgwork.contrib.django.PgworkBackend",
        "OPTIONS": {"MAX_ATTEMPTS": 3},
    },
    # Its tasks write through the ORM in their job's transaction.
    "atomic": {
        "BACKEND": "pgwork.contrib.django.PgworkBackend",
        "OPTIONS": {"ATOMIC": True, "MAX_ATTEMPTS": 2},
    },
}
