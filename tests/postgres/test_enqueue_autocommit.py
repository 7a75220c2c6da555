"""A connection in autocommit mode is refused by every enqueue, before any SQL.

On such a connection each statement commits by itself: the job would exist at once,
whatever the caller's code does next (Django outside ``atomic()`` runs this way), and a
batch could half succeed. The same connection inside ``conn.transaction()`` is a
transaction again, and enqueues like any other.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import psycopg
import pytest
import sqlalchemy as sa
from psycopg.pq import TransactionStatus
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import create_async_engine

from pgwork import (
    ChainStart,
    Client,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    UnsupportedConnectionError,
    create_client,
)

pytestmark = pytest.mark.anyio

BIG = 64  # large enough for the COPY path of start_chains


class Email(BaseModel):
    to: str


@pytest.fixture
async def client(pgwork_dsn: str) -> AsyncIterator[Client]:
    reg = JobTypeRegistry()
    reg.job_type("send_email", input=Email)
    c = create_client(
        state_adapter=await PostgresStateAdapter.connect(pgwork_dsn),
        notify_adapter=PostgresNotifyAdapter(pgwork_dsn),
        registry=reg,
        observers=[],
    )
    yield c
    await c.close()


def _batches(client: Client) -> list[list[ChainStart[Any]]]:
    send = client.registry.get("send_email")
    return [
        [ChainStart(send, Email(to="one@example.com"))],
        [ChainStart(send, Email(to="dedup@example.com"), dedup="signup-1")],
        [ChainStart(send, Email(to=f"{i}@example.com")) for i in range(BIG)],
    ]


async def _count(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        row = await (await c.execute("SELECT count(*) FROM pgwork.jobs")).fetchone()
        assert row is not None
        return int(row[0])


def _assert_refusal(caught: pytest.ExceptionInfo[UnsupportedConnectionError]) -> None:
    message = str(caught.value)
    assert "autocommit mode" in message
    assert "conn.transaction()" in message
    assert "atomic()" in message


async def test_an_autocommit_psycopg_connection_is_refused_before_any_sql(
    client: Client, pgwork_dsn: str
) -> None:
    send = client.registry.get("send_email")
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as auto:
        with pytest.raises(UnsupportedConnectionError) as caught:
            await client.start_chain(auto, send, Email(to="a@example.com"))
        _assert_refusal(caught)
        for batch in _batches(client):
            with pytest.raises(UnsupportedConnectionError):
                await client.start_chains(auto, batch)
        assert auto.info.transaction_status is TransactionStatus.IDLE
        assert auto.autocommit
    assert await _count(pgwork_dsn) == 0


async def test_an_autocommit_blocking_connection_is_refused_by_the_sync_twins(
    client: Client, pgwork_dsn: str
) -> None:
    send = client.registry.get("send_email")

    def enqueue() -> None:
        with psycopg.connect(pgwork_dsn, autocommit=True) as auto:
            with pytest.raises(UnsupportedConnectionError) as caught:
                client.start_chain_sync(auto, send, Email(to="a@example.com"))
            _assert_refusal(caught)
            for batch in _batches(client):
                with pytest.raises(UnsupportedConnectionError):
                    client.start_chains_sync(auto, batch)
            assert auto.info.transaction_status is TransactionStatus.IDLE

    await anyio.to_thread.run_sync(enqueue)
    assert await _count(pgwork_dsn) == 0


async def test_sqlalchemy_in_autocommit_isolation_is_refused_and_left_as_it_was(
    client: Client, pgwork_dsn: str
) -> None:
    send = client.registry.get("send_email")
    url = pgwork_dsn.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_async_engine(url, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as sa_conn:
            with pytest.raises(UnsupportedConnectionError) as caught:
                await client.start_chain(sa_conn, send, Email(to="a@example.com"))
            _assert_refusal(caught)
            assert not sa_conn.in_transaction()
    finally:
        await engine.dispose()
    on_asyncpg = url.replace("+psycopg", "+asyncpg", 1)
    engine = create_async_engine(on_asyncpg, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as sa_conn:
            with pytest.raises(UnsupportedConnectionError, match="not in a transaction"):
                await client.start_chain(sa_conn, send, Email(to="a@example.com"))
            assert not sa_conn.in_transaction()
            raw = await sa_conn.get_raw_connection()
            assert not raw.driver_connection.is_in_transaction()
    finally:
        await engine.dispose()

    def enqueue_sync() -> None:
        sync_engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
        try:
            with sync_engine.connect() as sync_conn:
                with pytest.raises(UnsupportedConnectionError):
                    client.start_chains_sync(sync_conn, _batches(client)[2])
                assert not sync_conn.in_transaction()
        finally:
            sync_engine.dispose()

    await anyio.to_thread.run_sync(enqueue_sync)
    assert await _count(pgwork_dsn) == 0


async def test_an_autocommit_connection_inside_its_transaction_block_enqueues_with_it(
    client: Client, pgwork_dsn: str
) -> None:
    send = client.registry.get("send_email")
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as auto:
        async with auto.transaction():
            await client.start_chain(auto, send, Email(to="gone@example.com"))
            raise psycopg.Rollback  # ends the block by rolling it back
        assert await _count(pgwork_dsn) == 0
        async with auto.transaction():
            for batch in _batches(client):
                await client.start_chains(auto, batch)
            await client.start_chain(auto, send, Email(to="kept@example.com"))
            assert await _count(pgwork_dsn) == 0  # not before the block commits
    assert await _count(pgwork_dsn) == 2 + BIG + 1
