"""Debounced enqueues through the client, on real PostgreSQL, racing for real.

Fifty transactions on fifty connections enqueue one key at once: one job comes of it,
with the input of the last merge (or of the insert, ``keep="first"``), run once by a
real worker. At REPEATABLE READ every transaction that loses a race fails with a
serialization failure, retries, and still no second job appears. An enqueue that
races the job's start waits for it and starts a new chain; an enqueue that merges
holds the job back from workers until it commits. A stream of enqueues that never
pauses still runs the job at its deadline. Times are the database's.

Controls (run by hand, each failing the test it names): the statement without its
``ON CONFLICT`` clause (and so without the unique index's arbitration) makes the
fifty enqueues fifty jobs (``test_fifty_concurrent_enqueues_*``); a merge that sets
the start without capping it at the deadline never lets the stream's job run
(``test_a_stream_that_never_pauses_still_runs_the_job_at_its_deadline``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal
from uuid import UUID

import anyio
import psycopg
import psycopg.errors
import pytest
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel
from tests._core_only import CoreOnly

from pgwork import (
    Attempt,
    CapabilityMissingError,
    ChainStart,
    Client,
    Debounce,
    DedupSpec,
    InvalidOptionError,
    JobStatus,
    JobTypeRegistry,
    PostgresStateAdapter,
    create_client,
)

from .conftest import ClientFactory, eventually, scalar

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

SECOND = timedelta(seconds=1)
ENQUEUERS = 50


class Doc(BaseModel):
    n: int


def registry() -> JobTypeRegistry:
    reg = JobTypeRegistry()
    reg.job_type("reindex", input=Doc, output=int)
    reg.job_type("other", input=Doc)
    return reg


async def _jobs_of(dsn: str, key: str) -> int:
    return int(await scalar(dsn, "SELECT count(*) FROM pgwork.jobs WHERE dedup_key = %s", key))


@pytest.mark.parametrize("keep", ["last", "first"])
async def test_fifty_concurrent_enqueues_of_a_key_make_one_job_run_once(
    make_client: ClientFactory, workers: Any, pgwork_dsn: str, keep: Literal["last", "first"]
) -> None:
    client = await make_client(registry())
    reindex = client.registry.get("reindex")
    spec = Debounce("doc-1", delay=SECOND / 2, max_wait=60 * SECOND, keep=keep)
    await _order_sequence(pgwork_dsn)
    go = anyio.Event()
    done: dict[int, tuple[bool, UUID, int]] = {}  # n -> (debounced, chain id, merge order)

    async def enqueue(n: int, conn: psycopg.AsyncConnection[Any]) -> None:
        await go.wait()
        started = await client.start_chain(conn, reindex, Doc(n=n), dedup=spec)
        # Taken while this transaction holds the job's row (merges wait on it in turn,
        # the first insert's index entry likewise): the order the enqueues landed in.
        cur = await conn.execute("SELECT nextval('debounce_order')")
        (order,) = await cur.fetchone()  # type: ignore[misc]
        await conn.commit()
        done[n] = (started.debounced, started.id, order)

    async with _connections(pgwork_dsn, ENQUEUERS) as conns, anyio.create_task_group() as tg:
        for n, conn in enumerate(conns):
            tg.start_soon(enqueue, n, conn)
        go.set()

    assert len(done) == ENQUEUERS
    assert await _jobs_of(pgwork_dsn, "doc-1") == 1
    inserted = [n for n, (merged, _, _) in done.items() if not merged]
    assert len(inserted) == 1, f"{len(inserted)} enqueues started a chain"
    chain_id = done[inserted[0]][1]
    assert {chain for _, chain, _ in done.values()} == {chain_id}
    landed_last = max(done, key=lambda n: done[n][2])
    # The insert took the first place in line, and every merge a later one.
    assert min(done, key=lambda n: done[n][2]) == inserted[0]

    runs: list[int] = []

    async def handle(attempt: Attempt[Doc, int]) -> int:
        runs.append(attempt.job.input.n)
        return attempt.job.input.n

    await workers(client=client, processors={reindex: handle})
    result = await client.await_chain(chain_id, timeout=60)
    expected = landed_last if keep == "last" else inserted[0]
    assert result == expected
    assert runs == [expected]
    job = await client.get_job(chain_id)
    assert job.debounce_deadline is not None
    assert job.debounce_deadline - job.created_at == spec.max_wait
    assert job.started_at is not None
    assert job.scheduled_at <= job.started_at <= job.debounce_deadline
    assert await _jobs_of(pgwork_dsn, "doc-1") == 1


async def test_fifty_concurrent_enqueues_at_repeatable_read_retry_into_one_job(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    reindex = client.registry.get("reindex")
    spec = Debounce("doc-2", delay=60 * SECOND, max_wait=120 * SECOND)
    go = anyio.Event()
    first_round_failures = 0
    retries = 0
    merged: list[bool] = []

    async def enqueue(n: int, conn: psycopg.AsyncConnection[Any]) -> None:
        nonlocal first_round_failures, retries
        await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        # Every first try's snapshot is taken before any of them enqueues.
        await conn.execute("SELECT 1")
        await go.wait()
        for attempt in range(200):
            if attempt:
                retries += 1
            try:
                started = await client.start_chain(conn, reindex, Doc(n=n), dedup=spec)
                await conn.commit()
            except psycopg.errors.SerializationFailure:
                await conn.rollback()
                first_round_failures += attempt == 0
                continue
            merged.append(started.debounced)
            return
        raise AssertionError(f"enqueue {n} never got through")

    async with _connections(pgwork_dsn, ENQUEUERS) as conns, anyio.create_task_group() as tg:
        for n, conn in enumerate(conns):
            tg.start_soon(enqueue, n, conn)
        await _snapshots_taken(pgwork_dsn, ENQUEUERS)
        go.set()

    assert len(merged) == ENQUEUERS
    assert merged.count(False) == 1, "more than one enqueue started a chain"
    # Each first try but one met a job its snapshot could not see, and failed.
    assert first_round_failures == ENQUEUERS - 1
    assert retries >= ENQUEUERS - 1
    assert await _jobs_of(pgwork_dsn, "doc-2") == 1


async def test_an_enqueue_racing_the_jobs_start_waits_and_starts_a_new_chain(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    reindex = client.registry.get("reindex")
    spec = Debounce("doc-3", delay=60 * SECOND, max_wait=120 * SECOND)
    first = await client.start_chain(conn, reindex, Doc(n=1), dedup=spec)
    await conn.commit()
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as worker:
        # What a worker's acquire writes, not yet committed: the job starts.
        await worker.execute(
            "UPDATE pgwork.jobs SET status = 'running', started_at = now(), attempt = 1,"
            " lease_token = gen_random_uuid(), leased_by = 'w',"
            " leased_until = now() + interval '1 minute' WHERE id = %s",
            (first.job_id,),
        )
        results = []

        async def enqueue() -> None:
            results.append(await client.start_chain(conn, reindex, Doc(n=2), dedup=spec))
            await conn.commit()

        async with anyio.create_task_group() as tg:
            tg.start_soon(enqueue)
            await _waiting_on_a_lock(pgwork_dsn)
            assert not results, "the enqueue did not wait for the start to commit"
            await worker.commit()
    [again] = results
    assert not again.debounced
    assert not again.deduplicated
    assert again.id != first.id
    started = await client.get_job(first.job_id)
    assert started.status is JobStatus.RUNNING
    assert started.input == Doc(n=1), "the merge changed a job that had started"
    assert (await client.get_job(again.job_id)).input == Doc(n=2)
    assert await _jobs_of(pgwork_dsn, "doc-3") == 2


async def test_a_merge_holds_the_job_from_workers_until_it_commits(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    reindex = client.registry.get("reindex")
    tiny = Debounce("doc-4", delay=timedelta(milliseconds=1), max_wait=60 * SECOND)
    first = await client.start_chain(conn, reindex, Doc(n=1), dedup=tiny)
    await conn.commit()
    await eventually(lambda: _due(client, first.job_id), what="the job to be due")
    merged = await client.start_chain(conn, reindex, Doc(n=2), dedup=tiny)
    assert merged.debounced
    leases = {"reindex": 60 * SECOND}
    # The merging transaction holds the row: an acquire passes it by, without waiting.
    assert await client.state.acquire(worker_id="w", leases=leases, queues=None, limit=5) == []
    await conn.commit()
    await eventually(lambda: _due(client, first.job_id), what="the job to be due again")
    [job] = await client.state.acquire(worker_id="w", leases=leases, queues=None, limit=5)
    assert job.id == first.job_id
    assert job.input == {"n": 2}


async def test_a_stream_that_never_pauses_still_runs_the_job_at_its_deadline(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    reindex = client.registry.get("reindex")
    spec = Debounce("doc-5", delay=SECOND / 2, max_wait=2 * SECOND)
    runs: list[int] = []

    async def handle(attempt: Attempt[Doc, int]) -> int:
        runs.append(attempt.job.input.n)
        return attempt.job.input.n

    await workers(client=client, processors={reindex: handle}, poll_interval=0.1)
    first = await client.start_chain(conn, reindex, Doc(n=0), dedup=spec)
    await conn.commit()
    n = 0
    with anyio.fail_after(30):
        # Far closer together than the delay: without the deadline the job never runs.
        while (await client.get_job(first.job_id)).status is JobStatus.PENDING:
            n += 1
            await client.start_chain(conn, reindex, Doc(n=n), dedup=spec)
            await conn.commit()
            await anyio.sleep(0.05)
        await client.await_chain(first.id, timeout=30)
    job = await client.get_job(first.job_id)
    assert job.debounce_deadline is not None
    assert job.debounce_deadline - job.created_at == spec.max_wait
    # The stream outlasted the delay each time: the job ran when its deadline came.
    assert job.scheduled_at == job.debounce_deadline
    assert job.started_at is not None
    assert job.started_at >= job.scheduled_at
    assert runs[0] == job.input.n
    assert n > 1


async def test_a_batch_debounces_its_debounced_items_and_inserts_the_others(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    reindex, other = client.registry.get("reindex"), client.registry.get("other")
    spec = Debounce("doc-6", delay=60 * SECOND, max_wait=120 * SECOND)
    started = await client.start_chains(
        conn,
        [
            ChainStart(reindex, Doc(n=1), dedup=spec),
            ChainStart(other, Doc(n=2)),
            ChainStart(other, Doc(n=3), dedup=DedupSpec("plain")),
            ChainStart(reindex, Doc(n=4), dedup=spec),
            ChainStart(other, Doc(n=5), dedup=DedupSpec("plain")),
        ],
    )
    await conn.commit()
    assert [(s.deduplicated, s.debounced) for s in started] == [
        (False, False),
        (False, False),
        (False, False),
        (True, True),
        (True, False),
    ]
    assert started[3].id == started[0].id
    assert started[4].id == started[2].id
    assert (await client.get_job(started[0].job_id)).input == Doc(n=4)
    assert (await client.get_job(started[1].job_id)).input == Doc(n=2)


def test_a_debounce_is_checked_whole_when_it_is_made() -> None:
    with pytest.raises(InvalidOptionError, match="delay of Debounce"):
        Debounce("k", delay=timedelta(0), max_wait=SECOND)
    with pytest.raises(InvalidOptionError, match="max_wait of Debounce"):
        Debounce("k", delay=2 * SECOND, max_wait=SECOND)
    with pytest.raises(InvalidOptionError, match="max_wait of Debounce"):
        Debounce("k", delay=SECOND, max_wait=None)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="keep of Debounce"):
        Debounce("k", delay=SECOND, max_wait=SECOND, keep="latest")  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="dedup of Debounce"):
        Debounce("", delay=SECOND, max_wait=SECOND)
    with pytest.raises(InvalidOptionError, match="delay of Debounce"):
        Debounce("k", delay=timedelta(days=10**8), max_wait=timedelta(days=10**8))
    assert Debounce("k", delay=SECOND, max_wait=SECOND).keep == "last"


async def test_a_debounced_chain_with_a_schedule_or_blockers_is_refused_before_any_sql(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    reindex = client.registry.get("reindex")
    spec = Debounce("doc-7", delay=SECOND, max_wait=SECOND)
    blocker = await client.start_chain(conn, reindex, Doc(n=0))
    with pytest.raises(InvalidOptionError, match="schedule of a chain debounced on 'doc-7'"):
        await client.start_chain(conn, reindex, Doc(n=1), dedup=spec, schedule=SECOND)
    with pytest.raises(InvalidOptionError, match="blockers of a chain debounced on 'doc-7'"):
        await client.start_chain(conn, reindex, Doc(n=1), dedup=spec, blockers=[blocker])
    # The transaction is still usable: nothing reached the database.
    await conn.commit()
    assert (await client.get_job(blocker.job_id)).status is JobStatus.PENDING


async def test_a_store_without_the_capability_refuses_a_debounce_before_any_sql(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry(), store=CoreOnly)
    reindex = client.registry.get("reindex")
    kept = await client.start_chain(conn, reindex, Doc(n=0))
    spec = Debounce("doc-8", delay=SECOND, max_wait=SECOND)
    with pytest.raises(CapabilityMissingError, match="Debouncing"):
        await client.start_chain(conn, reindex, Doc(n=1), dedup=spec)
    await conn.commit()
    assert (await client.get_job(kept.job_id)).status is JobStatus.PENDING


def test_the_sync_twin_debounces(pgwork_dsn: str) -> None:
    client = create_client(
        state_adapter=PostgresStateAdapter(AsyncConnectionPool(pgwork_dsn, open=False)),
        registry=registry(),
    )
    reindex = client.registry.get("reindex")
    spec = Debounce("doc-9", delay=60 * SECOND, max_wait=120 * SECOND)
    with psycopg.connect(pgwork_dsn) as conn:
        first = client.start_chain_sync(conn, reindex, Doc(n=1), dedup=spec)
        conn.commit()
        again = client.start_chain_sync(conn, reindex, Doc(n=2), dedup=spec)
        conn.commit()
        assert not first.debounced
        assert again.debounced
        assert again.id == first.id
        assert client.get_job_sync(conn, first.job_id).input == Doc(n=2)


async def _due(client: Client, job_id: UUID) -> bool:
    job = await client.get_job(job_id)
    return job.scheduled_at <= await client.state.now()


async def _order_sequence(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        await c.execute("CREATE SEQUENCE debounce_order")


class _connections:
    """``count`` connections of the caller's kind (not autocommit), closed on exit."""

    def __init__(self, dsn: str, count: int) -> None:
        self.dsn = dsn
        self.count = count
        self.conns: list[psycopg.AsyncConnection[Any]] = []

    async def __aenter__(self) -> list[psycopg.AsyncConnection[Any]]:
        for _ in range(self.count):
            self.conns.append(await psycopg.AsyncConnection.connect(self.dsn))
        return self.conns

    async def __aexit__(self, *exc: object) -> None:
        for conn in self.conns:
            await conn.close()


async def _snapshots_taken(dsn: str, count: int) -> None:
    """Until ``count`` backends of this database sit idle inside a transaction."""

    async def idle_in_transaction() -> bool:
        found = await scalar(
            dsn,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND state = 'idle in transaction'",
        )
        return int(found) >= count

    await eventually(idle_in_transaction, what=f"{count} open transactions")


async def _waiting_on_a_lock(dsn: str) -> None:
    async def waiting() -> bool:
        found = await scalar(
            dsn,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock'",
        )
        return int(found) >= 1

    await eventually(waiting, what="the enqueue to wait on a lock")
