"""The shipped notify suite against the in-process adapter, publishing inside real
PostgreSQL transactions it cannot see (so it claims no commit-only delivery)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
import pytest

from pgwork import InProcessNotifyAdapter
from pgwork.testing.conformance import NotifyAdapterConformance, TransactionFactory

pytestmark = pytest.mark.anyio


class TestInProcessNotifyAdapter(NotifyAdapterConformance):
    delivers_on_commit_only = False
    folds_identical_notices = False

    @pytest.fixture
    async def notify_adapter(self) -> AsyncIterator[InProcessNotifyAdapter]:
        adapter = InProcessNotifyAdapter()
        try:
            yield adapter
        finally:
            await adapter.close()

    @pytest.fixture
    def notify_transaction(self, pgwork_dsn: str) -> TransactionFactory:
        @asynccontextmanager
        async def transaction() -> AsyncIterator[object]:
            async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
                yield conn

        return transaction
