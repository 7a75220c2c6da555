"""What the runs of the shipped notify suite share: an adapter built for each test and
closed after it, and publishing in a caller's own PostgreSQL transactions (psycopg,
committed on a clean exit, else rolled back), which only PostgreSQL's adapter can
see."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
import pytest

from pgwork.adapters.notify import NotifyAdapter
from pgwork.testing.conformance import NotifyAdapterConformance, TransactionFactory

__all__ = ["InCallersTransactions", "caller_transactions"]


def caller_transactions(dsn: str) -> TransactionFactory:
    """A caller's own psycopg connection: committed on clean exit, else rolled back."""

    @asynccontextmanager
    async def transaction() -> AsyncIterator[object]:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            yield conn

    return transaction


class InCallersTransactions(NotifyAdapterConformance):
    """The notify suite over the adapter ``new_adapter`` builds for each test (or a
    ``notify_adapter`` fixture of the subclass's own), publishing in a caller's
    transactions."""

    def new_adapter(self) -> NotifyAdapter:
        pytest.fail(f"{type(self).__name__} must define new_adapter() or notify_adapter")

    @pytest.fixture
    async def notify_adapter(self) -> AsyncIterator[NotifyAdapter]:
        adapter = self.new_adapter()
        try:
            yield adapter
        finally:
            await adapter.close()

    @pytest.fixture
    def notify_transaction(self, pgwork_dsn: str) -> TransactionFactory:
        return caller_transactions(pgwork_dsn)
