"""The pgwork side of the benchmark: job types, clients, bulk loading, and clocks.

Handlers are no-ops that only count and timestamp themselves, so what is measured is
pgwork's own cost per job: acquiring, bookkeeping, completing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import anyio
import psycopg
from psycopg import sql
from pydantic import BaseModel

from pgwork import (
    ChainStart,
    Client,
    Continue,
    JobTypeRegistry,
    NotifyAdapter,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    Rate,
    Retention,
    create_client,
)
from pgwork.testing import uuid7_sql

__all__ = [
    "KEY_CONCURRENCY",
    "NOTIFY_KINDS",
    "PACED_RATE",
    "RETAINED",
    "SCHEMA",
    "Counter",
    "Item",
    "bulk_load",
    "enqueue_jobs",
    "make_notify",
    "open_client",
    "outstanding",
    "registry",
    "settle",
    "wait_drained",
]

SCHEMA = "pgwork"
# ``noop_limited``'s concurrency: more than any drain runs at once, so the limit is
# counted on every acquire and never binds.
GENEROUS = 5_000
# ``keyed``'s key_concurrency: what ``python -m bench.flow`` makes bind.
KEY_CONCURRENCY = 2
# ``paced``'s rate, per second: what ``python -m bench.flow --rate`` drains at.
PACED_RATE = 1_000
# How long ``noop_retained`` keeps a completed chain: what ``python -m bench.retention``
# deletes behind a drain, every chain a few seconds after it ended.
RETAINED = timedelta(seconds=5)


class Item(BaseModel):
    n: int


def registry() -> JobTypeRegistry:
    """The benchmark's job types: a staged and an atomic no-op, a staged no-op with a
    limit that never binds (``concurrency`` far above any drain's slots), a staged type
    limited per key and one limited by a rate (``bench.flow``), a staged no-op whose
    completed chains are kept ``RETAINED`` (``bench.retention``), and a 3-step chain."""
    reg = JobTypeRegistry()
    reg.job_type("noop", input=Item)
    reg.job_type("noop_limited", input=Item, concurrency=GENEROUS)
    reg.job_type("noop_atomic", input=Item, mode="atomic")
    reg.job_type("keyed", input=Item, key_concurrency=KEY_CONCURRENCY)
    reg.job_type("paced", input=Item, rate=Rate(PACED_RATE, per=timedelta(seconds=1)))
    reg.job_type("noop_retained", input=Item, retention=Retention(completed=RETAINED))
    reg.job_type("step1", input=Item, continue_with=["step2"])
    reg.job_type("step2", input=Item, entry=False, continue_with=["step3"])
    reg.job_type("step3", input=Item, entry=False)
    return reg


# The notify transports a benchmark client can use (``make_notify``).
NOTIFY_KINDS = ("postgres", "redis", "nats", "none")
REDIS_URL = "redis://127.0.0.1:6379/0"
NATS_URL = "nats://127.0.0.1:4222"


def make_notify(kind: str, dsn: str) -> NotifyAdapter | None:
    """The notify adapter ``kind`` names: PostgreSQL's LISTEN/NOTIFY on ``dsn``, Redis or
    NATS on this machine's servers (``PGWORK_BENCH_REDIS_URL``, ``PGWORK_BENCH_NATS_URL``
    to point elsewhere), or None: no notification a worker in another process hears."""
    if kind == "postgres":
        return PostgresNotifyAdapter(dsn, schema=SCHEMA)
    if kind == "redis":
        from pgwork.notify.redis import RedisNotifyAdapter

        return RedisNotifyAdapter(os.environ.get("PGWORK_BENCH_REDIS_URL", REDIS_URL))
    if kind == "nats":
        from pgwork.notify.nats import NatsNotifyAdapter

        return NatsNotifyAdapter(os.environ.get("PGWORK_BENCH_NATS_URL", NATS_URL))
    if kind == "none":
        return None
    raise ValueError(f"unknown notify kind {kind!r}; choose from {NOTIFY_KINDS}")


@asynccontextmanager
async def open_client(
    dsn: str, *, pool_size: int = 10, notify: str = "postgres"
) -> AsyncIterator[Client]:
    state = await PostgresStateAdapter.connect(dsn, schema=SCHEMA, max_size=pool_size)
    client = create_client(
        state_adapter=state,
        notify_adapter=make_notify(notify, dsn),
        registry=registry(),
    )
    try:
        yield client
    finally:
        await client.close()


async def enqueue_jobs(
    client: Client,
    conn: psycopg.AsyncConnection[Any],
    count: int,
    batch: int | None,
    progress: Callable[[int], None],
) -> float:
    """Enqueue ``count`` no-op jobs through ``conn``: one ``start_chain`` and commit per
    job (``batch`` None), or ``start_chains`` of ``batch`` and a commit; return the
    seconds it took. The one enqueue loop, run in the harness or in a child process."""
    noop = client.registry.get("noop")
    started = time.perf_counter()
    if batch is None:
        for i in range(count):
            await client.start_chain(conn, noop, Item(n=i))
            await conn.commit()
            if i % 500 == 0:
                progress(i)
    else:
        for first in range(0, count, batch):
            last = min(count, first + batch)
            items = [ChainStart(noop, Item(n=i)) for i in range(first, last)]
            await client.start_chains(conn, items)
            await conn.commit()
            if first % 500 < batch:  # as often as the peers report (_peer_common.py)
                progress(last)
    return time.perf_counter() - started


@dataclass
class Counter:
    """Handler calls, with the wall-clock time (``time.time``) of the first and last.

    ``done`` is set when ``count`` reaches ``target``.
    """

    target: int
    count: int = 0
    first: float | None = None
    last: float = 0.0
    done: anyio.Event = field(default_factory=anyio.Event)
    starts: dict[int, float] = field(default_factory=dict)
    record_starts: bool = False
    # Counts at which to note the time (into ``marked``), for rates over windows.
    marks: frozenset[int] = frozenset()
    marked: dict[int, float] = field(default_factory=dict)
    # Called as the first handler starts (a worker process tells the harness, which
    # starts reading what the run costs).
    on_first: Callable[[], None] | None = None

    def touch(self) -> float:
        """Note that a handler started (without counting it); return the time."""
        now = time.time()
        if self.first is None:
            self.first = now
            if self.on_first is not None:
                self.on_first()
        return now

    def hit(self, n: int | None = None) -> None:
        now = self.touch()
        self.last = now
        self.count += 1
        if self.count in self.marks:
            self.marked[self.count] = now
        if self.record_starts and n is not None:
            self.starts[n] = now
        if self.count >= self.target:
            self.signal(self.done)

    def signal(self, event: anyio.Event | asyncio.Event) -> None:
        """Set ``event``, which the event loop waits on (a counter hit on other threads
        sets it through the loop)."""
        event.set()

    def handler(self) -> Callable[[Any], Any]:
        async def noop(attempt: Any) -> None:
            self.hit(attempt.job.input.n)

        return noop

    def chain_handlers(self, reg: JobTypeRegistry) -> dict[str, Callable[[Any], Any]]:
        """Handlers for step1 -> step2 -> step3; only step3 (a finished chain) counts."""
        step2_type, step3_type = reg.get("step2"), reg.get("step3")

        async def step1(attempt: Any) -> Continue[Item]:
            self.touch()
            return Continue(step2_type, Item(n=attempt.job.input.n))

        async def step2(attempt: Any) -> Continue[Item]:
            return Continue(step3_type, Item(n=attempt.job.input.n))

        async def step3(attempt: Any) -> None:
            self.hit(attempt.job.input.n)

        return {"step1": step1, "step2": step2, "step3": step3}


# Server-side generation is the fastest way to a big backlog: no client encoding, one
# statement per chunk. Rows are what start_chains would write for a fresh chain: its own
# root, pending, ids time-ordered like pgwork's UUIDv7 (so the primary key stays append-
# mostly), built from clock_timestamp().
_BULK_INSERT = f"""
WITH s AS (
    SELECT g, {uuid7_sql("clock_timestamp()")} AS u
    FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
)
INSERT INTO {{jobs}} (
    id, type_name, chain_id, chain_type_name, chain_index, input, status, queue,
    priority, max_attempts, scheduled_at, chain_status, limit_group
)
SELECT u, %(type_name)s, u, %(type_name)s, 0, jsonb_build_object('n', g), 'pending',
       'default', 0, 5, now(), 'active', %(limit_group)s
FROM s
"""

BULK_CHUNK = 100_000


async def bulk_load(
    dsn: str,
    count: int,
    *,
    type_name: str = "noop",
    first: int = 0,
    on_chunk: Callable[[int], None] | None = None,
) -> None:
    """Insert ``count`` pending jobs of ``type_name`` straight into pgwork's jobs table."""
    query = sql.SQL(_BULK_INSERT).format(jobs=sql.Identifier(SCHEMA, "jobs"))
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        done = 0
        while done < count:
            size = min(BULK_CHUNK, count - done)
            await conn.execute(
                query,
                {
                    "first": first + done,
                    "last": first + done + size - 1,
                    "type_name": type_name,
                    # As the client writes it for a type limited as a whole.
                    "limit_group": "" if type_name == "noop_limited" else None,
                },
            )
            done += size
            if on_chunk is not None:
                on_chunk(size)
        await conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(SCHEMA, "jobs")))


async def settle(dsn: str) -> None:
    """Vacuum the jobs table and checkpoint, so that what follows measures the queue as
    it is rather than the aftermath of what came before: the first reader of a fresh
    row writes its hint bits, dead index entries of finished jobs slow the acquire's
    scan until a vacuum, and autovacuum or a checkpoint of a big load's WAL would run
    in the middle of a measurement. pgbench prepares its tables the same way."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.Identifier(SCHEMA, "jobs")))
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            await conn.execute("CHECKPOINT")


_OUTSTANDING = sql.SQL("SELECT count(*) FROM {} WHERE status IN ('pending', 'running')").format(
    sql.Identifier(SCHEMA, "jobs")
)


async def outstanding(conn: psycopg.AsyncConnection[Any]) -> int:
    """Jobs not yet finished. Both states are covered by partial indexes, so this stays
    cheap while a worker drains the table."""
    cur = await conn.execute(_OUTSTANDING)
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def wait_drained(dsn: str, *, interval: float = 0.01, timeout: float = 600.0) -> float:
    """Wait until no job is pending or running; return the ``time.time()`` it was seen."""
    deadline = time.monotonic() + timeout
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while await outstanding(conn) > 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs still outstanding after {timeout:.0f}s")
            await anyio.sleep(interval)
    return time.time()
