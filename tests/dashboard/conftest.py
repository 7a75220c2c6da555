"""Fixtures: a client on a fresh migrated database, the dashboard over it, and an
httpx client speaking to the dashboard through its ASGI interface."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from tests.dashboard._support import registry

from pgwork import Client, PostgresNotifyAdapter, PostgresStateAdapter, create_client
from pgwork.dashboard import allow_any, create_dashboard


@pytest.fixture
async def client(pgwork_dsn: str) -> AsyncIterator[Client]:
    state = await PostgresStateAdapter.connect(pgwork_dsn, max_size=10)
    made = create_client(
        state_adapter=state,
        notify_adapter=PostgresNotifyAdapter(pgwork_dsn),
        registry=registry,
        observers=[],
    )
    try:
        yield made
    finally:
        await made.close()


@pytest.fixture
async def http(client: Client) -> AsyncIterator[httpx.AsyncClient]:
    app = create_dashboard(client, authorize=allow_any)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as session:
        yield session
