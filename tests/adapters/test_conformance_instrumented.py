"""The instrumented wrapper is a state adapter like any other: the whole shipped suite
passes through it unchanged."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pgwork import PostgresStateAdapter
from pgwork.observability import Event, InstrumentedStateAdapter
from pgwork.testing.conformance import StateAdapterConformance

pytestmark = pytest.mark.anyio


class _Count:
    def __init__(self) -> None:
        self.events = 0

    def on_event(self, event: Event) -> None:
        self.events += 1


class TestInstrumentedPostgresStateAdapter(StateAdapterConformance):
    @pytest.fixture
    async def state_adapter(
        self, pgwork_dsn: str, pgwork_schema: str
    ) -> AsyncIterator[InstrumentedStateAdapter]:
        inner = await PostgresStateAdapter.connect(pgwork_dsn, schema=pgwork_schema, max_size=20)
        counter = _Count()
        adapter = InstrumentedStateAdapter(inner, observers=[counter])
        try:
            yield adapter
        finally:
            await adapter.close()
        assert counter.events > 0
