"""Fixtures for engine tests: a client on a fresh migrated database, workers, probes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    Client,
    InProcessWorker,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
)
from pgwork.adapters.state import AcquiredJob

if TYPE_CHECKING:
    from ._run_one import RunOne


class ClientFactory(Protocol):
    """``make_client(registry)``: a client on this test's database. ``store`` makes its
    state adapter of the PostgreSQL one: ``store=CoreOnly`` gives a client over a store
    that offers only the core of the contract."""

    def __call__(
        self, registry: JobTypeRegistry, *, store: Callable[[PostgresStateAdapter], Any] = ...
    ) -> Awaitable[Client]: ...


@pytest.fixture
async def make_client(pgwork_dsn: str) -> AsyncIterator[ClientFactory]:
    """Build clients (PostgreSQL state + LISTEN/NOTIFY) on this test's database."""
    clients: list[Client] = []

    async def factory(
        registry: JobTypeRegistry, *, store: Callable[[PostgresStateAdapter], Any] = lambda s: s
    ) -> Client:
        state = await PostgresStateAdapter.connect(pgwork_dsn, max_size=20)
        client = create_client(
            state_adapter=store(state),
            notify_adapter=PostgresNotifyAdapter(pgwork_dsn),
            registry=registry,
        )
        clients.append(client)
        return client

    yield factory
    for client in clients:
        await client.close()


@pytest.fixture
async def workers() -> AsyncIterator[Callable[..., Awaitable[InProcessWorker]]]:
    """Start workers that are stopped when the test ends, whatever happened."""
    started: list[InProcessWorker] = []

    async def start(**kwargs: Any) -> InProcessWorker:
        kwargs.setdefault("poll_interval", 0.5)
        worker = create_in_process_worker(**kwargs)
        await worker.start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        await worker.stop()


@pytest.fixture
async def conn(pgwork_dsn: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A caller's own connection (not autocommit): what an application passes as tx."""
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as connection:
        yield connection


async def eventually(
    predicate: Callable[[], Awaitable[bool]], *, timeout: float = 20.0, what: str = "condition"
) -> None:
    """Re-check ``predicate`` (a database read) until it holds; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await anyio.sleep(0.02)


async def scalar(dsn: str, query: str, *params: Any) -> Any:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        cur = await c.execute(query, params or None)
        row = await cur.fetchone()
        return row[0] if row else None


class HangUntilAborted:
    """A handler that runs until the worker aborts it, recording why.

    ``running`` is set once the handler started, ``aborted`` once it was stopped;
    ``reasons`` holds each attempt's ``abort_reason``.
    """

    def __init__(self) -> None:
        self.running = anyio.Event()
        self.aborted = anyio.Event()
        self.reasons: list[Any] = []

    async def __call__(self, attempt: Any) -> Any:
        self.running.set()
        try:
            await anyio.sleep_forever()
        finally:
            self.reasons.append(attempt.abort_reason)
            self.aborted.set()


async def acquired_job(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> tuple[Client, AcquiredJob]:
    """A client whose registry has one job type, ``step``, and one such job enqueued
    and acquired straight through the state adapter (by worker ``"w"``, no worker
    running): for tests of the worker's parts on their own."""
    reg = JobTypeRegistry()
    step = reg.job_type("step", input=_Num)
    client = await make_client(reg)
    await client.start_chain(conn, step, _Num(n=1))
    await conn.commit()
    [job] = await client.state.acquire(
        worker_id="w", leases={"step": timedelta(seconds=60)}, queues=None, limit=1
    )
    return client, job


class _Num(BaseModel):
    n: int


@pytest.fixture
def run_one(
    make_client: ClientFactory,
    workers: Callable[..., Awaitable[InProcessWorker]],
    conn: psycopg.AsyncConnection[Any],
) -> RunOne:
    """One job run to a status on a worker of its own (tests/engine/_run_one.py, which
    imports this module: hence the import inside)."""
    from ._run_one import RunOne

    return RunOne(make_client, workers, conn)


# The wake-up tests' clients and workers (tests/engine/_wakeup_kit.py, which imports
# this module: hence the imports inside the fixtures).


@pytest.fixture
async def clients(pgwork_dsn: str) -> AsyncIterator[Callable[..., Awaitable[Client]]]:
    from ._wakeup_kit import client_factory

    async with client_factory(pgwork_dsn) as make:
        yield make


@pytest.fixture
async def start_worker() -> AsyncIterator[Callable[..., Awaitable[InProcessWorker]]]:
    from ._wakeup_kit import worker_starter

    async with worker_starter() as start:
        yield start
