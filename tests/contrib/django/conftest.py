"""A Django project for the task backend's tests (``settings.py``, the app ``taskapp``),
pointed at a migrated database of its own for each test.

Needs Django's task framework: Django 6.0+ (Python 3.12+), or the ``django-tasks``
package (the test dependencies install it). Without either, collecting these tests
fails loudly rather than skipping them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import django
import pytest
from psycopg.conninfo import conninfo_to_dict

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.contrib.django.settings")
django.setup()


@pytest.fixture
def django_dsn(pgwork_dsn: str) -> Iterator[str]:
    """Django's ``default`` database is a fresh, migrated one for the test (the DSN)."""
    from django.db import connection

    params = conninfo_to_dict(pgwork_dsn)
    connection.close()
    saved = dict(connection.settings_dict)
    connection.settings_dict.update(
        NAME=params.get("dbname", ""),
        USER=params.get("user", ""),
        PASSWORD=params.get("password", ""),
        HOST=params.get("host", ""),
        PORT=params.get("port", ""),
    )
    try:
        yield pgwork_dsn
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
