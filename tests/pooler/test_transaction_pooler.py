"""pgwork through PgBouncer in transaction mode: enqueue and work pooled, listen direct.

The positive tests pass ``prepare_threshold=None`` to every pooled connection; the
controls keep psycopg's default and get the errors a transaction pooler causes, or
point the notify adapter at the pooler and get ``NotificationsUnavailableError``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    ChainStart,
    Client,
    Continue,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
)
from pgwork.postgres._enqueue import COPY_MIN_ROWS
from pgwork.testing.pgbouncer import pgbouncer

pytestmark = pytest.mark.anyio

# Errors of a statement prepared in one server session and used from another.
POOLER_ERRORS = (
    psycopg.errors.DuplicatePreparedStatement,
    psycopg.errors.InvalidSqlStatementName,
    psycopg.errors.ProtocolViolation,
)


class Item(BaseModel):
    n: int


registry = JobTypeRegistry()
staged = registry.job_type("staged", input=Item)
atomic = registry.job_type("atomic", input=Item, mode="atomic")
first = registry.job_type("first", input=Item, continue_with=["second"])
second = registry.job_type("second", input=Item, entry=False, mode="atomic")


async def _client(state_dsn: str, notify_dsn: str, **options: Any) -> Client:
    state = await PostgresStateAdapter.connect(state_dsn, max_size=10, **options)
    return create_client(
        state_adapter=state, notify_adapter=PostgresNotifyAdapter(notify_dsn), registry=registry
    )


@pytest.fixture
async def pooled_client(pooled_dsn: str, pgwork_dsn: str) -> AsyncIterator[Client]:
    client = await _client(pooled_dsn, pgwork_dsn, prepare_threshold=None)
    yield client
    await client.close()


async def _enqueue_everything(client: Client, pooled_dsn: str) -> int:
    """One job per transaction, small batches, a COPY-sized batch, chains; returns the
    number of jobs that will run (a chain of ``first`` runs two)."""
    expected = 0
    async with await psycopg.AsyncConnection.connect(pooled_dsn, prepare_threshold=None) as conn:
        for n in range(60):
            await client.start_chain(conn, atomic if n % 3 == 0 else staged, Item(n=n))
            await conn.commit()
        expected += 60
        for batch in range(10):
            await client.start_chains(
                conn, [ChainStart(staged, Item(n=1000 + batch * 10 + i)) for i in range(10)]
            )
            await conn.commit()
        expected += 100
        big = COPY_MIN_ROWS * 8
        await client.start_chains(conn, [ChainStart(staged, Item(n=2000 + i)) for i in range(big)])
        await conn.commit()
        expected += big
        await client.start_chains(conn, [ChainStart(first, Item(n=5000 + i)) for i in range(40)])
        await conn.commit()
        expected += 80
    return expected


async def test_jobs_enqueued_and_worked_through_a_transaction_pooler_complete_exactly_once(
    pooled_dsn: str,
    pgwork_dsn: str,
    pooled_client: Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="pgwork")
    expected = await _enqueue_everything(pooled_client, pooled_dsn)
    ran: Counter[tuple[str, int]] = Counter()
    all_ran = anyio.Event()

    async def handle(attempt: Any) -> Any:
        ran[(attempt.job.type_name, attempt.job.input.n)] += 1
        if sum(ran.values()) >= expected:
            all_ran.set()
        if attempt.job.type_name == "first":
            return Continue(second, attempt.job.input)
        return None

    processors = {staged: handle, atomic: handle, first: handle, second: handle}
    # Two workers, each with its own pool through the pooler; notifications direct.
    worker_clients = [await _client(pooled_dsn, pgwork_dsn, prepare_threshold=None) for _ in "ab"]
    workers = [
        create_in_process_worker(client=c, processors=processors, max_slots=10, poll_interval=5)
        for c in worker_clients
    ]
    try:
        for worker in workers:
            await worker.start()
        with anyio.fail_after(60):
            await all_ran.wait()
    finally:
        for worker in workers:
            await worker.stop()
        for c in worker_clients:
            await c.close()

    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        cur = await conn.execute("SELECT status::text, count(*) FROM pgwork.jobs GROUP BY 1")
        by_status = dict(await cur.fetchall())
    duplicates = sum(count - 1 for count in ran.values() if count > 1)
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    print(  # the figures docs/deploying.md quotes; shown with -s
        f"\npooler e2e: enqueued={expected} completed={by_status.get('completed', 0)} "
        f"handled={sum(ran.values())} duplicates={duplicates} warnings_logged={len(errors)}"
    )
    assert by_status == {"completed": expected}
    assert duplicates == 0
    assert len(ran) == expected
    assert errors == []


async def _enqueue_from_two_sessions(client: Client, pooled_dsn: str, **options: Any) -> None:
    """Enough single-job transactions on one connection, then on another, for psycopg
    to prepare the enqueue statement on each (it prepares after ``prepare_threshold``
    runs). One client at a time: the pooler hands both the same server session."""
    for _ in range(2):
        async with await psycopg.AsyncConnection.connect(pooled_dsn, **options) as conn:
            for n in range(8):
                await client.start_chain(conn, staged, Item(n=n))
                await conn.commit()


async def test_psycopg_default_prepare_threshold_fails_through_a_transaction_pooler(
    pooled_dsn: str, pgwork_dsn: str
) -> None:
    client = await _client(pooled_dsn, pgwork_dsn)  # psycopg's default threshold
    try:
        with pytest.raises(POOLER_ERRORS):
            await _enqueue_from_two_sessions(client, pooled_dsn)
    finally:
        await client.close()


async def test_prepare_threshold_none_enqueues_through_a_transaction_pooler(
    pooled_dsn: str, pooled_client: Client
) -> None:
    await _enqueue_from_two_sessions(pooled_client, pooled_dsn, prepare_threshold=None)
    counts = await pooled_client.count_jobs()
    assert sum(c.ready for c in counts) == 16


@pytest.mark.usefixtures("transaction_pooler")  # skips, with its reason, without pgbouncer
async def test_state_adapter_statements_through_the_pooler_need_prepare_threshold_none(
    pg_server_dsn: str, pgwork_dsn: str
) -> None:
    """The worker's own statements: many acquires over the adapter's pooled sessions.

    Through a pooler with one server session, every client's transactions run in that
    same session, so two clients preparing their statements (psycopg names them
    ``_pg3_0``, ``_pg3_1``, ... per connection) collide whatever the timing: the control
    does not depend on how the pooler happened to interleave its clients."""
    outcomes = {}
    with pgbouncer(pg_server_dsn, pool_mode="transaction", pool_size=1) as single:
        dsn = single.dsn_for(pgwork_dsn)
        for label, options in (("none", {"prepare_threshold": None}), ("default", {})):
            state = await PostgresStateAdapter.connect(dsn, min_size=4, max_size=4, **options)
            try:
                async with anyio.create_task_group() as tasks:
                    for _ in range(4):
                        tasks.start_soon(_acquire_many, state)
                outcomes[label] = "ok"
            except* POOLER_ERRORS:
                outcomes[label] = "pooler error"
            finally:
                await state.close()
    assert outcomes == {"none": "ok", "default": "pooler error"}


async def _acquire_many(state: PostgresStateAdapter) -> None:
    for _ in range(30):
        await state.acquire(
            worker_id="w", leases={"staged": timedelta(seconds=30)}, queues=["default"], limit=5
        )
