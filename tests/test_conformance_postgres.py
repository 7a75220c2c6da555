"""The shipped conformance suites against the PostgreSQL adapters, plus what is
PostgreSQL's own: adopting a caller's connection, and a lock-wait probe that lets the
suite see a blocked writer instead of timing it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
import pytest

from pgwork import PostgresNotifyAdapter, PostgresStateAdapter
from pgwork.testing.conformance import (
    LockWaiters,
    NotifyAdapterConformance,
    StateAdapterConformance,
    StateHarness,
    TransactionFactory,
)

pytestmark = pytest.mark.anyio


class TestPostgresStateAdapter(StateAdapterConformance):
    @pytest.fixture
    async def state_adapter(
        self, pgwork_dsn: str, pgwork_schema: str
    ) -> AsyncIterator[PostgresStateAdapter]:
        adapter = await PostgresStateAdapter.connect(pgwork_dsn, schema=pgwork_schema, max_size=20)
        try:
            yield adapter
        finally:
            await adapter.close()

    @pytest.fixture
    def lock_waiters(self, pgwork_dsn: str) -> LockWaiters:
        async def count() -> int:
            async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as c:
                cur = await c.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
                row = await cur.fetchone()
                return int(row[0]) if row else 0

        return count

    async def test_insert_on_an_adopted_connection_commits_and_rolls_back_with_it(
        self, state_adapter: PostgresStateAdapter, store: StateHarness, pgwork_dsn: str
    ) -> None:
        kept, dropped = store.new_job(), store.new_job()
        async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
            tx = await state_adapter.adopt(conn)
            await state_adapter.insert_jobs(tx, jobs=[dropped])
            await conn.rollback()
            await state_adapter.insert_jobs(tx, jobs=[kept])
            assert not await store.exists(kept.id)
            await conn.commit()
        assert await store.exists(kept.id)
        assert not await store.exists(dropped.id)


def caller_transactions(dsn: str) -> TransactionFactory:
    """A caller's own psycopg connection: committed on clean exit, else rolled back."""

    @asynccontextmanager
    async def transaction() -> AsyncIterator[object]:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            yield conn

    return transaction


class TestPostgresNotifyAdapter(NotifyAdapterConformance):
    delivers_on_commit_only = True
    folds_identical_notices = True

    @pytest.fixture
    async def notify_adapter(
        self, pgwork_dsn: str, pgwork_schema: str
    ) -> AsyncIterator[PostgresNotifyAdapter]:
        adapter = PostgresNotifyAdapter(pgwork_dsn, schema=pgwork_schema)
        try:
            yield adapter
        finally:
            await adapter.close()

    @pytest.fixture
    def notify_transaction(self, pgwork_dsn: str) -> TransactionFactory:
        return caller_transactions(pgwork_dsn)
