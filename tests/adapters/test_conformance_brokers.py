"""The shipped notify suite against the Redis and NATS adapters, on the servers this
machine runs (``PGWORK_TEST_REDIS_URL``, ``PGWORK_TEST_NATS_URL``); each skips, saying
why, when its server does not answer. They cannot see PostgreSQL's transactions, so
they claim no commit-only delivery: a notice published in one goes after the commit
inside ``notify_after_commit``, and is repeated to its taker otherwise."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
import pytest
from tests.adapters._brokers import nats_url, redis_url, unique_name

from pgwork.notify.nats import NatsNotifyAdapter
from pgwork.notify.redis import RedisNotifyAdapter
from pgwork.testing.conformance import NotifyAdapterConformance, TransactionFactory

pytestmark = pytest.mark.anyio


def _caller_transactions(dsn: str) -> TransactionFactory:
    @asynccontextmanager
    async def transaction() -> AsyncIterator[object]:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            yield conn

    return transaction


class TestRedisNotifyAdapter(NotifyAdapterConformance):
    hands_out_hints = True

    @pytest.fixture
    async def notify_adapter(self) -> AsyncIterator[RedisNotifyAdapter]:
        adapter = RedisNotifyAdapter(redis_url(), channel=unique_name("pgwork-test"))
        try:
            yield adapter
        finally:
            await adapter.close()

    @pytest.fixture
    def notify_transaction(self, pgwork_dsn: str) -> TransactionFactory:
        return _caller_transactions(pgwork_dsn)


class TestNatsNotifyAdapter(NotifyAdapterConformance):
    hands_out_hints = True

    @pytest.fixture
    async def notify_adapter(self) -> AsyncIterator[NatsNotifyAdapter]:
        adapter = NatsNotifyAdapter(nats_url(), subject=unique_name("pgwork.test"))
        try:
            yield adapter
        finally:
            await adapter.close()

    @pytest.fixture
    def notify_transaction(self, pgwork_dsn: str) -> TransactionFactory:
        return _caller_transactions(pgwork_dsn)
