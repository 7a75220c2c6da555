"""The shipped notify suite against the Redis and NATS adapters, on the servers this
machine runs (``PGWORK_TEST_REDIS_URL``, ``PGWORK_TEST_NATS_URL``); each skips, saying
why, when its server does not answer. They cannot see PostgreSQL's transactions, so
they claim no commit-only delivery: a notice published in one goes after the commit
inside ``notify_after_commit``, and is repeated to its taker otherwise."""

from __future__ import annotations

import pytest
from tests.adapters._brokers import nats_url, redis_url, unique_name
from tests.adapters._notify_suite import InCallersTransactions

from pgwork.notify.nats import NatsNotifyAdapter
from pgwork.notify.redis import RedisNotifyAdapter

pytestmark = pytest.mark.anyio


class TestRedisNotifyAdapter(InCallersTransactions):
    hands_out_hints = True

    def new_adapter(self) -> RedisNotifyAdapter:
        return RedisNotifyAdapter(redis_url(), channel=unique_name("pgwork-test"))


class TestNatsNotifyAdapter(InCallersTransactions):
    hands_out_hints = True

    def new_adapter(self) -> NatsNotifyAdapter:
        return NatsNotifyAdapter(nats_url(), subject=unique_name("pgwork.test"))
