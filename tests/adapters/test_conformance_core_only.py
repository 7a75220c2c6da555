"""The core of the contract stands on its own: the shipped state suite against
PostgreSQL seen through its core operations alone runs every case that requires no
capability, and skips the others, each saying which capability the store lacks.

The store is the real PostgreSQL adapter; the view hands out its core operations and
nothing else, as a store that offers only the core would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests._core_only import CoreOnly

from pgwork import PostgresStateAdapter
from pgwork.adapters import state
from pgwork.adapters.capabilities import CAPABILITY_PROTOCOLS
from pgwork.testing.conformance import StateAdapterConformance, StateHarness

pytestmark = pytest.mark.anyio


class TestCoreOnlyStateAdapter(StateAdapterConformance):
    @pytest.fixture
    async def state_adapter(self, pgwork_dsn: str, pgwork_schema: str) -> AsyncIterator[Any]:
        adapter = await PostgresStateAdapter.connect(pgwork_dsn, schema=pgwork_schema, max_size=20)
        try:
            yield CoreOnly(adapter)
        finally:
            await adapter.close()

    async def test_the_view_offers_the_core_and_no_capability(
        self, state_adapter: Any, store: StateHarness
    ) -> None:
        assert isinstance(state_adapter, state.CoreStateAdapter)
        assert [c.__name__ for c in CAPABILITY_PROTOCOLS if isinstance(state_adapter, c)] == []
        assert not isinstance(state_adapter, state.StateAdapter)
