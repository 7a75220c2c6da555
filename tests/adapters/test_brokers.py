"""What the Redis and NATS adapters do beyond the shipped notify suite: survive their
server's restart, let every worker look when a budget is gone, shrug off a broker
that is away and messages that are no notices.

The restart tests run a server of their own (``private_redis``, ``private_nats``); the
others use the machine's. Each skips, saying why, when its server cannot be had.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
import pytest
from tests.adapters._brokers import (
    PrivateServer,
    nats_url,
    private_nats,
    private_redis,
    redis_url,
    unique_name,
)

from pgwork.adapters.notify import Listener, Notice, NotifyAdapter
from pgwork.notify.nats import NatsNotifyAdapter
from pgwork.notify.redis import RedisNotifyAdapter

pytestmark = pytest.mark.anyio

BOUND = 30.0  # liveness only: a restart and a reconnect take well under this

Make = Callable[[str], NotifyAdapter]


def _redis(url: str, **options: Any) -> RedisNotifyAdapter:
    options.setdefault("reconnect_initial", 0.05)
    options.setdefault("reconnect_max", 0.5)
    return RedisNotifyAdapter(url, channel=unique_name("pgwork-test"), **options)


def _nats(url: str, **options: Any) -> NatsNotifyAdapter:
    options.setdefault("reconnect_wait", 0.2)
    return NatsNotifyAdapter(url, subject=unique_name("pgwork.test"), **options)


BROKERS: dict[str, tuple[Make, Callable[[], str], Callable[[], Any]]] = {
    "redis": (_redis, redis_url, private_redis),
    "nats": (_nats, nats_url, private_nats),
}


@asynccontextmanager
async def _adapter(make: Make, url: str) -> AsyncIterator[NotifyAdapter]:
    adapter = make(url)
    try:
        yield adapter
    finally:
        await adapter.close()


async def _until(listener: Listener, wanted: Callable[[Notice], bool]) -> list[Notice]:
    """Everything heard until a notice ``wanted`` arrives (fails after ``BOUND``)."""
    got: list[Notice] = []
    with anyio.fail_after(BOUND):
        while not any(wanted(n) for n in got):
            got += await listener.wait(1.0)
    return got


class _Deaf:
    """The control build's listener: deaf to ``reconnected``."""

    def __init__(self, inner: Listener) -> None:
        self._inner = inner

    async def wait(self, timeout: float) -> list[Notice]:
        return [n for n in await self._inner.wait(timeout) if n.kind != "reconnected"]


@contextmanager
def _server(kind: str) -> Iterator[PrivateServer]:
    with BROKERS[kind][2]() as server:
        yield server


@pytest.mark.parametrize("kind", ["redis", "nats"])
@pytest.mark.parametrize("build", ["reported", "control-deaf"])
async def test_listener_reports_reconnected_after_the_server_restarts(
    kind: str, build: str
) -> None:
    make = BROKERS[kind][0]
    with _server(kind) as server:
        async with _adapter(make, server.url) as adapter, adapter.listen() as heard:
            listener: Listener = heard if build == "reported" else _Deaf(heard)
            before = Notice(kind="ready", queue="before")
            await adapter.publish(None, notices=[before])
            await _until(listener, lambda n: n == before)
            await anyio.to_thread.run_sync(server.stop)
            await anyio.to_thread.run_sync(server.start)
            if build == "control-deaf":
                with pytest.raises(TimeoutError):
                    await _until(listener, lambda n: n.kind == "reconnected")
                return
            await _until(listener, lambda n: n.kind == "reconnected")
            # Subscribed again: what is published from now on arrives.
            after = Notice(kind="ready", queue="after")
            with anyio.fail_after(BOUND):
                while True:
                    await adapter.publish(None, notices=[after])
                    if after in await listener.wait(0.5):
                        break


@pytest.mark.parametrize("kind", ["redis", "nats"])
async def test_each_notice_hands_out_its_own_looks(kind: str) -> None:
    """Two notices of one job each: one winner apiece, whoever won the other; a notice
    of more jobs than there are claimants: every claimant wins."""
    make, url, _ = BROKERS[kind]
    sent = [
        Notice(kind="ready", queue="a", count=1),
        Notice(kind="ready", queue="b", count=1),
        Notice(kind="ready", queue="c", count=3),
    ]
    async with (
        _adapter(make, url()) as adapter,
        adapter.listen() as one,
        adapter.listen() as two,
    ):
        await adapter.publish(None, notices=sent)
        heard = [await _until(listener, lambda n: n.queue == "c") for listener in (one, two)]
        won: dict[str, int] = {}
        for listener, notices in zip((one, two), heard, strict=True):
            for notice in notices:
                assert notice.hint is not None
                if await listener.claim(notice):  # type: ignore[attr-defined]
                    won[notice.queue or ""] = won.get(notice.queue or "", 0) + 1
    assert won == {"a": 1, "b": 1, "c": 2}


@pytest.mark.parametrize("kind", ["redis", "nats"])
async def test_a_broker_that_is_away_costs_a_logged_warning_not_an_enqueue(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    with _server(kind) as server:
        url = server.url
    # The server is gone: nothing answers at its address any more.
    make = BROKERS[kind][0]
    adapter = make(url) if kind == "redis" else _nats(url, operation_timeout=1.0)
    try:
        with caplog.at_level(logging.WARNING, logger="pgwork.notify"):
            started = time.monotonic()
            await adapter.publish(object(), notices=[Notice(kind="ready", queue="q", count=1)])
            await adapter.publish(None, notices=[Notice(kind="ready", queue="q")])
        assert time.monotonic() - started < BOUND
        assert "could not publish" in caplog.text
    finally:
        await adapter.close()


@pytest.mark.parametrize("kind", ["redis", "nats"])
async def test_a_message_that_is_no_notice_is_ignored(kind: str) -> None:
    make, url, _ = BROKERS[kind]
    async with _adapter(make, url()) as adapter, adapter.listen() as listener:
        for junk in (b"not json", b'{"v": 1, "n": [["ready", 7]]}', b'{"v": 99, "n": []}'):
            await _publish_raw(adapter, junk)
        marker = Notice(kind="ready", queue=f"marker-{uuid.uuid4().hex}")
        await adapter.publish(None, notices=[marker])
        got = await _until(listener, lambda n: n == marker)
    assert got == [marker]


async def _publish_raw(adapter: NotifyAdapter, payload: bytes) -> None:
    if isinstance(adapter, RedisNotifyAdapter):
        await adapter._commands.publish(adapter.channel, payload)
    else:
        assert isinstance(adapter, NatsNotifyAdapter)
        await (await adapter._connection()).publish(adapter.subject, payload)


async def test_a_notice_published_in_the_stores_own_transaction_waits_for_its_commit(
    pgwork_dsn: str,
) -> None:
    """A worker's completions with continuations run in a transaction of the store's
    own: what they announce through a broker goes out once that transaction committed."""
    from pgwork import PostgresStateAdapter

    state = await PostgresStateAdapter.connect(pgwork_dsn, max_size=2)
    notice = Notice(kind="ready", queue="own-transaction", count=1)
    try:
        async with _adapter(_redis, redis_url()) as adapter, adapter.listen() as listener:
            async with state.transaction() as tx:
                await adapter.publish(tx, notices=[notice])
                early = await listener.wait(0.3)
                assert not [n for n in early if n.queue == notice.queue], "sent before commit"
            got = await _until(listener, lambda n: n.queue == notice.queue)
        assert [n.count for n in got if n.queue == notice.queue] == [1]
    finally:
        await state.close()


@pytest.mark.parametrize("kind", ["redis", "nats"])
def test_a_synchronous_enqueue_stores_its_job_and_leaves_it_to_the_poll(
    kind: str, pgwork_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``start_chain_sync`` runs without an event loop, where no broker can be reached:
    the job is stored all the same, and the workers' poll finds it."""
    import psycopg
    from psycopg_pool import AsyncConnectionPool
    from pydantic import BaseModel

    from pgwork import JobTypeRegistry, PostgresStateAdapter, create_client

    class Mail(BaseModel):
        to: str

    registry = JobTypeRegistry()
    mail = registry.job_type("mail", input=Mail)
    make, url, _ = BROKERS[kind]
    client = create_client(
        state_adapter=PostgresStateAdapter(AsyncConnectionPool(pgwork_dsn, open=False)),
        notify_adapter=make(url()),
        registry=registry,
    )
    with (
        caplog.at_level(logging.WARNING, logger="pgwork.notify"),
        psycopg.connect(pgwork_dsn) as conn,
    ):
        started = client.start_chain_sync(conn, mail, Mail(to="ada@example.com"))
    with psycopg.connect(pgwork_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT id FROM pgwork.jobs").fetchall()
    assert rows == [(started.job_id,)]
    assert "no event loop" in caplog.text
