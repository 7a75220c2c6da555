"""Shared test configuration.

The PostgreSQL fixtures (``pgwork_dsn``, ``empty_database_dsn``, ``pg_server_dsn``, ...)
come from pgwork's own pytest plugin, ``pgwork.testing.plugin``. Async tests run on
anyio's pytest plugin with the asyncio backend.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester", "tests._skips"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
