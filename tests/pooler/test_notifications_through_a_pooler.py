"""LISTEN through a transaction pooler receives nothing: pgwork says so at start.

The notify adapter checks its channel end to end when it starts listening. Pointed at
the pooler, it raises ``NotificationsUnavailableError`` (or, when told to, warns and
polls); pointed at the server directly, the same check passes.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    JobTypeRegistry,
    Notice,
    NotificationsUnavailableError,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
)
from pgwork.postgres.notify import decode_notice

pytestmark = pytest.mark.anyio


class Item(BaseModel):
    n: int


registry = JobTypeRegistry()
ping = registry.job_type("ping", input=Item)


async def test_a_notify_adapter_behind_a_transaction_pooler_raises_when_it_starts_listening(
    pooled_dsn: str,
) -> None:
    adapter = PostgresNotifyAdapter(pooled_dsn, probe_timeout=0.5)
    try:
        with pytest.raises(NotificationsUnavailableError, match="direct connection") as caught:
            async with adapter.listen():
                pass
    finally:
        await adapter.close()
    assert caught.value.waited == 0.5


async def test_the_same_check_passes_on_a_direct_connection_and_notices_still_arrive(
    pgwork_dsn: str,
) -> None:
    adapter = PostgresNotifyAdapter(pgwork_dsn, probe_timeout=0.5)
    try:
        async with adapter.listen() as listener:
            await adapter.publish(None, notices=[Notice(kind="ready", queue="q")])
            with anyio.fail_after(10):
                got: list[Notice] = []
                while not got:
                    got = await listener.wait(1.0)
    finally:
        await adapter.close()
    assert got == [Notice(kind="ready", queue="q")]


def test_the_probe_payload_is_not_a_notice() -> None:
    assert decode_notice("probe|4f6d0c1e6b0a4bd0a1d2f3e4a5b6c7d8") is None


async def _pooled_worker(pooled_dsn: str, notify: PostgresNotifyAdapter, **options: Any) -> Any:
    state = await PostgresStateAdapter.connect(pooled_dsn, prepare_threshold=None)
    client = create_client(state_adapter=state, notify_adapter=notify, registry=registry)
    done = anyio.Event()

    async def handle(attempt: Any) -> None:
        done.set()

    worker = create_in_process_worker(client=client, processors={ping: handle}, **options)
    return client, worker, done


async def test_a_worker_whose_notifications_go_through_the_pooler_does_not_start(
    pooled_dsn: str,
) -> None:
    client, worker, _ = await _pooled_worker(
        pooled_dsn, PostgresNotifyAdapter(pooled_dsn, probe_timeout=0.5)
    )
    try:
        with pytest.raises(NotificationsUnavailableError):
            await worker.start()
    finally:
        await worker.stop()
        await client.close()


async def _enqueue_and_wait(
    client: Any, worker: Any, done: anyio.Event, pooled_dsn: str, within: float
) -> bool:
    await worker.start()
    try:
        async with await psycopg.AsyncConnection.connect(
            pooled_dsn, prepare_threshold=None
        ) as conn:
            await client.start_chain(conn, ping, Item(n=1))
            await conn.commit()
        with anyio.move_on_after(within):
            await done.wait()
        return done.is_set()
    finally:
        await worker.stop()
        await client.close()


async def test_when_told_to_poll_it_warns_and_the_worker_still_takes_jobs(
    pooled_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pgwork.notify")
    notify = PostgresNotifyAdapter(
        pooled_dsn, probe_timeout=0.5, when_unavailable="poll", fallback_poll_interval=0.2
    )
    # A poll interval far beyond the wait below: only the fallback's hints can help.
    client, worker, done = await _pooled_worker(pooled_dsn, notify, poll_interval=600)
    assert await _enqueue_and_wait(client, worker, done, pooled_dsn, within=20)
    assert "notifications unavailable, polling every 0.2s" in caplog.text


async def test_control_without_the_check_a_pooled_listener_waits_silently(
    pooled_dsn: str, pgwork_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What the check prevents: no error, no warning, and no notice ever arrives."""
    caplog.set_level(logging.WARNING, logger="pgwork")
    pooled = PostgresNotifyAdapter(pooled_dsn, probe_timeout=None)
    direct = PostgresNotifyAdapter(pgwork_dsn, probe_timeout=None)
    try:
        async with pooled.listen() as listener:
            await direct.publish(None, notices=[Notice(kind="ready", queue="q")])
            got = await listener.wait(1.5)
    finally:
        await pooled.close()
        await direct.close()
    assert got == []
    assert caplog.records == []
