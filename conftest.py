"""Shared test configuration of the repository's two suites, the library's (tests/) and
the benchmark's (bench/tests/); at the root, so that its plugins load however pytest is
started (`python -m pytest`, `python -m pytest bench/tests`, `pytest .`).

The PostgreSQL fixtures (``pgwork_dsn``, ``empty_database_dsn``, ``pg_server_dsn``, ...)
come from pgwork's own pytest plugin, ``pgwork.testing.plugin``. Async tests run on
anyio's pytest plugin with the asyncio backend, on asyncio's own event loop, or on
uvloop's when ``PGWORK_TEST_LOOP=uvloop`` (as ``pgwork worker`` runs where uvloop is
installed; ``.ci/run`` runs one of its two passes so).
"""

from __future__ import annotations

from typing import Any

import pytest
from tests._loop import TEST_LOOP

pytest_plugins = [
    "pytester",
    "tests._skips",
    "tests._progress",
    "tests._controls",
    "tests._shards",
]


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"use_uvloop": TEST_LOOP == "uvloop"})
