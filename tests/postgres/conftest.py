"""Fixtures of the tests that drive the PostgreSQL adapter directly."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pgwork.postgres.state import PostgresStateAdapter


@pytest.fixture
async def state(pgwork_dsn: str) -> AsyncIterator[PostgresStateAdapter]:
    """An adapter of two connections on the test's migrated database."""
    adapter = await PostgresStateAdapter.connect(pgwork_dsn, max_size=2)
    try:
        yield adapter
    finally:
        await adapter.close()
