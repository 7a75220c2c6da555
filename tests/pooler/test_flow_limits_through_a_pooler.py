"""Flow limits hold for workers whose state connections go through PgBouncer in
transaction mode (notifications direct, ``prepare_threshold=None``, as
docs/deploying.md has it).

A limited acquire takes a transaction-level advisory lock per limited type and then
leases, in one transaction: the pooler keeps a transaction on one server session, so
the lock still covers the acquire. These tests watch it from outside pgwork: every
handler writes when it began and when it ended, by the database's clock, on a direct
connection of its own, and the test counts from those rows the most attempts that ran
at once, per type and per limit key; and, from the moment each attempt's acquire began
(its lease less its length) and its handler's first write, the most attempts of the
rated type certainly started in one window (``tests/_starts.py``): the rate's count
sits in the same transaction as its lock.

Control: a type without limits, drained in the same run and written to the same rows,
shows more than two attempts at once and more starts in a window than the rate allows,
so the oracle sees overlap and density where there is some.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import anyio
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel
from tests._starts import Start, most_started

from pgwork import (
    ChainStart,
    Client,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    Rate,
    create_client,
    create_in_process_worker,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


class Item(BaseModel):
    n: int


registry = JobTypeRegistry()
capped = registry.job_type("capped", input=Item, concurrency=2)
keyed = registry.job_type("keyed", input=Item, key_concurrency=1)
RATE = Rate(3, per=timedelta(milliseconds=300))
rated = registry.job_type("rated", input=Item, rate=RATE)
free = registry.job_type("free", input=Item)

KEYS: tuple[str | None, ...] = ("a", "b", "c", None)
# Long enough that the free type's attempts overlap on a loaded machine too.
HOLD = 0.15

SPANS = """
CREATE TABLE flow_spans (
    id bigserial PRIMARY KEY,
    job_id uuid NOT NULL,
    type_name text NOT NULL,
    limit_key text,
    leased_at timestamptz NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at timestamptz
)
"""


@pytest.fixture
async def spans(pgwork_dsn: str) -> AsyncIterator[AsyncConnectionPool]:
    """Direct connections (not the pooler's) on which the handlers write their spans."""
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as conn:
        await conn.execute(SPANS)
    pool = AsyncConnectionPool(
        pgwork_dsn, min_size=2, max_size=20, kwargs={"autocommit": True}, open=False
    )
    await pool.open()
    yield pool
    await pool.close()


def recording(pool: AsyncConnectionPool, total: int, all_ran: anyio.Event) -> Any:
    """A handler that holds each attempt ``HOLD`` seconds between its two span writes;
    ``all_ran`` is set once ``total`` attempts wrote their end."""
    ended = 0

    async def handle(attempt: Any) -> None:
        nonlocal ended
        assert attempt.job.leased_until is not None
        async with pool.connection() as conn:
            cur = await conn.execute(
                "INSERT INTO flow_spans (job_id, type_name, limit_key, leased_at)"
                " VALUES (%s, %s, %s, %s) RETURNING id",
                (
                    attempt.job.id,
                    attempt.job.type_name,
                    attempt.limit_key,
                    attempt.job.leased_until - attempt.job_type.lease,
                ),
            )
            row = await cur.fetchone()
        assert row is not None
        try:
            await anyio.sleep(HOLD)
        finally:
            with anyio.CancelScope(shield=True):
                async with pool.connection() as conn:
                    await conn.execute(
                        "UPDATE flow_spans SET ended_at = clock_timestamp() WHERE id = %s",
                        (row[0],),
                    )
            ended += 1
            if ended >= total:
                all_ran.set()

    return handle


def _most(spans: Sequence[tuple[datetime, datetime | None]]) -> int:
    """The most spans open at one instant (an end sorts before a start at the same
    instant; a span without an end never closes)."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans if e is not None])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


async def overlaps(dsn: str) -> tuple[dict[str, int], dict[str, int], dict[str, int], int]:
    """The most attempts at once per type, per keyed group (``''``: no key), the most
    certainly started in one window of the rate per type, and the number of spans."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT type_name, limit_key, leased_at, started_at, ended_at FROM flow_spans"
        )
        rows = await cur.fetchall()
    by_type: dict[str, list[tuple[datetime, datetime | None]]] = {}
    by_key: dict[str, list[tuple[datetime, datetime | None]]] = {}
    starts: dict[str, list[Start]] = {}
    for type_name, key, leased, started, ended in rows:
        by_type.setdefault(type_name, []).append((started, ended))
        starts.setdefault(type_name, []).append((leased, started))
        if type_name == keyed.name:
            by_key.setdefault(key or "", []).append((started, ended))
    return (
        {name: _most(s) for name, s in by_type.items()},
        {key: _most(s) for key, s in by_key.items()},
        {name: most_started(s, RATE.per) for name, s in starts.items()},
        len(rows),
    )


async def _pooled_client(pooled_dsn: str, pgwork_dsn: str) -> Client:
    state = await PostgresStateAdapter.connect(pooled_dsn, max_size=8, prepare_threshold=None)
    return create_client(
        state_adapter=state, notify_adapter=PostgresNotifyAdapter(pgwork_dsn), registry=registry
    )


async def _enqueue(client: Client, pooled_dsn: str, each: int) -> int:
    """``each`` jobs of ``capped``, ``free`` and ``rated``, and ``each`` per key of ``keyed``,
    interleaved, enqueued through the pooler; returns how many."""
    items = []
    for n in range(each):
        items.append(ChainStart(capped, Item(n=n)))
        items.append(ChainStart(free, Item(n=n)))
        items.append(ChainStart(rated, Item(n=n)))
        items += [ChainStart(keyed, Item(n=n), limit_key=key) for key in KEYS]
    async with await psycopg.AsyncConnection.connect(pooled_dsn, prepare_threshold=None) as conn:
        await client.start_chains(conn, items)
        await conn.commit()
    return len(items)


async def _drain(
    pooled_dsn: str, pgwork_dsn: str, pool: AsyncConnectionPool, *, workers: int, total: int
) -> dict[str, int]:
    """Run ``workers`` workers (a pooled client each) until ``total`` attempts ran, and
    stop them (a stop writes what they completed); returns the jobs by status."""
    clients = [await _pooled_client(pooled_dsn, pgwork_dsn) for _ in range(workers)]
    all_ran = anyio.Event()
    handle = recording(pool, total, all_ran)
    started = [
        create_in_process_worker(
            client=c,
            processors={capped: handle, keyed: handle, free: handle, rated: handle},
            max_slots=8,
            poll_interval=5,
        )
        for c in clients
    ]
    try:
        for worker in started:
            await worker.start()
        with anyio.fail_after(90):
            await all_ran.wait()
    finally:
        for worker in started:
            await worker.stop()
        for c in clients:
            await c.close()
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT status::text, count(*) FROM pgwork.jobs GROUP BY 1")
        return dict(await cur.fetchall())


@pytest.mark.parametrize("workers", [1, 2], ids=["one worker", "two workers racing"])
async def test_limits_hold_for_workers_behind_a_transaction_pooler(
    pooled_dsn: str, pgwork_dsn: str, spans: AsyncConnectionPool, workers: int
) -> None:
    """``concurrency=2``, ``key_concurrency=1`` and three starts in 300 ms hold, for
    one worker and for two racing through the same pooler, and every job completes
    once; the free type, beside them, runs more than two at once and starts more than
    three in a window (the control)."""
    setup = await _pooled_client(pooled_dsn, pgwork_dsn)
    try:
        total = await _enqueue(setup, pooled_dsn, each=12)
    finally:
        await setup.close()

    by_status = await _drain(pooled_dsn, pgwork_dsn, spans, workers=workers, total=total)

    by_type, by_key, started, attempts = await overlaps(pgwork_dsn)
    assert by_status == {"completed": total}
    assert attempts == total
    assert by_type[capped.name] == 2
    assert by_key == {"a": 1, "b": 1, "c": 1, "": 1}
    assert by_type[keyed.name] > 1  # the keys ran side by side
    assert started[rated.name] == RATE.n
    assert by_type[free.name] > 2  # the control: the oracle sees overlap past a limit
    assert started[free.name] > RATE.n  # and density past a rate
