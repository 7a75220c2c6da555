"""A client for code without an event loop (Django views, Flask, scripts): built on a
pool that is never opened, it enqueues on the caller's blocking connection; the ways
such code gets it wrong are refused at construction, with the recipe in the message."""

from __future__ import annotations

import asyncio
import gc
import warnings

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool
from pydantic import BaseModel

from pgwork import (
    ConfigurationError,
    JobStatus,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    UnsupportedConnectionError,
    create_client,
)


class Welcome(BaseModel):
    email: str


registry = JobTypeRegistry()
send_welcome = registry.job_type("send_welcome", input=Welcome)


def test_client_built_without_an_event_loop_enqueues_in_the_callers_transaction(
    pgwork_dsn: str,
) -> None:
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()  # this test really has no event loop
    client = create_client(
        state_adapter=PostgresStateAdapter(AsyncConnectionPool(pgwork_dsn, open=False)),
        notify_adapter=PostgresNotifyAdapter(pgwork_dsn),
        registry=registry,
    )
    with psycopg.connect(pgwork_dsn) as conn:
        kept = client.start_chain_sync(conn, send_welcome, Welcome(email="ada@example.com"))
    with psycopg.connect(pgwork_dsn) as conn:
        dropped = client.start_chain_sync(conn, send_welcome, Welcome(email="eve@example.com"))
        conn.rollback()

    with psycopg.connect(pgwork_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT id, status::text FROM pgwork.jobs").fetchall()
    assert rows == [(kept.job_id, JobStatus.PENDING.value)]
    assert dropped.job_id != kept.job_id


def test_an_unawaited_connect_is_refused_with_the_recipe(pgwork_dsn: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ConfigurationError, match=r"still to be awaited") as refused:
            create_client(
                state_adapter=PostgresStateAdapter.connect(pgwork_dsn),  # type: ignore[arg-type]
                registry=registry,
            )
        gc.collect()

    assert "AsyncConnectionPool(dsn, open=False)" in str(refused.value)
    assert [w for w in caught if "never awaited" in str(w.message)] == []


@pytest.mark.parametrize("given", ["dsn", "blocking pool"])
def test_a_dsn_or_a_blocking_pool_instead_of_an_async_pool_is_refused(
    pgwork_dsn: str, given: str
) -> None:
    pool: object = pgwork_dsn if given == "dsn" else ConnectionPool(pgwork_dsn, open=False)
    with pytest.raises(ConfigurationError, match=r"wraps a psycopg_pool\.AsyncConnectionPool"):
        PostgresStateAdapter(pool)  # type: ignore[arg-type]


def test_a_connection_not_yet_opened_is_refused_saying_how_to_open_it(pgwork_dsn: str) -> None:
    """Django's ``connection.connection`` is None outside ``transaction.atomic()`` until a
    first query opens it: the refusal says so."""
    client = create_client(
        state_adapter=PostgresStateAdapter(AsyncConnectionPool(pgwork_dsn, open=False)),
        registry=registry,
    )
    with pytest.raises(UnsupportedConnectionError, match=r"connection\.ensure_connection\(\)"):
        client.start_chain_sync(None, send_welcome, Welcome(email="ada@example.com"))
