"""An acquire leases a job whose row another transaction updated while it ran.

The acquire locks its candidates (``FOR UPDATE SKIP LOCKED``) and then leases them by
the row version the lock returned (``ctid``). When a candidate's row was updated and
committed after the statement's snapshot but before its lock, the lock follows the
update to the new version, which the snapshot cannot see: matched by ``ctid`` alone
the job was locked but not leased, and the worker took the short acquire for a
drained queue (the job then waited for the poll). Writes that touch pending rows
include marking a chain awaited and enqueueing a job blocked on that chain.

The order is forced, no timing involved: the acquiring connection resolves ``now()``
to a function of the test's that waits on an advisory lock the test holds (its
``search_path`` names ``pg_catalog`` after that schema). So the statement has taken its
snapshot and waits before reading a single row; the concurrent update commits; the
test lets the acquire go on. The statement text is the shipped one.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from pydantic import BaseModel

from pgwork import JobTypeRegistry, PostgresStateAdapter
from pgwork.adapters.state import AcquiredJob, Completion

from .conftest import ClientFactory, eventually

pytestmark = pytest.mark.anyio

GATE_KEY = 7_314_159

GATE = f"""
CREATE SCHEMA gate;
CREATE FUNCTION gate.now() RETURNS timestamptz LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_catalog.pg_advisory_lock_shared({GATE_KEY});
    PERFORM pg_catalog.pg_advisory_unlock_shared({GATE_KEY});
    RETURN pg_catalog.now();
END
$$;
"""


class Num(BaseModel):
    n: int


@pytest.fixture
async def gated_state(pgwork_dsn: str) -> AsyncIterator[PostgresStateAdapter]:
    """A state adapter whose statements read ``now()`` through the gate."""
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as conn:
        await conn.execute(GATE)
    dsn = make_conninfo(pgwork_dsn, options="-c search_path=gate,pg_catalog")
    state = await PostgresStateAdapter.connect(dsn)
    try:
        yield state
    finally:
        await state.close()


async def _waiting_at_the_gate(conn: psycopg.AsyncConnection[Any]) -> bool:
    cur = await conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND objid = %s AND database = (SELECT oid FROM pg_database"
        " WHERE datname = current_database())",
        (GATE_KEY,),
    )
    row = await cur.fetchone()
    return row is not None and row[0] > 0


Update = Callable[[Any, str, Any], Awaitable[None]]


async def _mark_awaited(client: Any, dsn: str, chain_id: Any) -> None:
    await client.state.mark_chain_awaited(chain_id=chain_id)


async def _enqueue_a_dependant(client: Any, dsn: str, chain_id: Any) -> None:
    dependant = client.registry.resolve("dependant")
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await client.start_chain(conn, dependant, Num(n=2), blockers=[chain_id])
        await conn.commit()


@pytest.mark.parametrize("update", [_mark_awaited, _enqueue_a_dependant], ids=lambda f: f.__name__)
@pytest.mark.parametrize("turn", ["acquire", "complete_and_acquire"])
@pytest.mark.parametrize("queues", [["default"], None], ids=["by-queue", "any-queue"])
async def test_an_acquire_leases_a_candidate_updated_between_its_snapshot_and_its_lock(
    pgwork_dsn: str,
    make_client: ClientFactory,
    gated_state: PostgresStateAdapter,
    update: Update,
    turn: str,
    queues: list[str] | None,
) -> None:
    reg = JobTypeRegistry()
    job_type = reg.job_type("work", input=Num)
    reg.job_type("dependant", input=Num)
    client = await make_client(reg)
    leases = {"work": timedelta(seconds=60)}
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        done = await client.start_chain(conn, job_type, Num(n=0))
        target = await client.start_chain(conn, job_type, Num(n=1))
        await conn.commit()
    [running] = await client.state.acquire(
        worker_id="w", leases=leases, queues=["default"], limit=1
    )
    assert running.id == done.id
    acquired: list[AcquiredJob] = []

    async def acquire() -> None:
        if turn == "acquire":
            acquired.extend(
                await gated_state.acquire(worker_id="w", leases=leases, queues=queues, limit=10)
            )
            return
        completion = Completion(
            job_id=running.id,
            lease_token=running.lease_token,
            output_json="null",
            continuation=None,
        )
        results, jobs = await gated_state.complete_and_acquire(
            completions=[completion],
            worker_id="w",
            leases=leases,
            queues=queues,
            limit=10,
        )
        assert [r.accepted for r in results] == [True]
        acquired.extend(jobs)

    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as gate:
        await gate.execute("SELECT pg_advisory_lock(%s)", (GATE_KEY,))
        async with anyio.create_task_group() as tg:
            tg.start_soon(acquire)
            await eventually(
                functools.partial(_waiting_at_the_gate, gate), what="the acquire at the gate"
            )
            # The acquire has its snapshot and waits; the row changes under it.
            await update(client, pgwork_dsn, target.id)
            await gate.execute("SELECT pg_advisory_unlock(%s)", (GATE_KEY,))
    assert [job.id for job in acquired] == [target.id]
    [job] = await client.state.get_jobs(None, job_ids=[target.id])
    assert job.status == "running"
    assert job.attempt == 1
