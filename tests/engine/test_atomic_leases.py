"""A lone atomic attempt's lease is kept by renewals, as a staged attempt's: its job's
row is not locked while the handler runs, so nothing else keeps another worker's
reaper off a handler that outlasts its lease."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    ChainStart,
    JobStatus,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
)

from .conftest import ClientFactory, eventually, scalar

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

LEASE = timedelta(seconds=1)


class Num(BaseModel):
    n: int


async def _renewed_past(dsn: str, job_id: Any, moment: Any) -> bool:
    return bool(
        await scalar(
            dsn,
            "SELECT leased_until > %s FROM pgwork.jobs WHERE id = %s AND status = 'running'",
            moment,
            job_id,
        )
    )


async def test_a_lone_atomic_attempts_lease_is_renewed_while_its_handler_runs(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    pgwork_dsn: str,
) -> None:
    """The handler outlasts its lease three times over; meanwhile the lease is renewed
    (its end moves past three leases after the start), and the job completes on its
    first attempt. A build that leaves lone atomic attempts out of the renewals never
    gets there."""
    reg = JobTypeRegistry()
    pay = reg.job_type("pay", input=Num, mode="atomic", lease=LEASE, timeout=timedelta(seconds=30))
    client = await make_client(reg)
    running, release = anyio.Event(), anyio.Event()

    async def handle(attempt: Any) -> None:
        running.set()
        await release.wait()

    await workers(client=client, processors={pay: handle}, atomic_group=1)
    started = await client.start_chain(conn, pay, Num(n=1))
    await conn.commit()
    with anyio.fail_after(10):
        await running.wait()
    began = await scalar(pgwork_dsn, "SELECT clock_timestamp()")
    await eventually(
        lambda: _renewed_past(pgwork_dsn, started.job_id, began + 3 * LEASE),
        timeout=15,
        what="the atomic attempt's lease to be renewed past three leases",
    )
    release.set()
    await client.await_chain(started.id, timeout=15)
    job = await client.get_job(started.job_id)
    assert job.status is JobStatus.COMPLETED
    assert job.attempt == 1


async def _all_renewed_past(dsn: str, job_ids: list[Any], moment: Any) -> bool:
    return bool(
        await scalar(
            dsn,
            "SELECT count(*) = %s FROM pgwork.jobs"
            " WHERE id = ANY(%s) AND status = 'running' AND leased_until > %s",
            len(job_ids),
            job_ids,
            moment,
        )
    )


async def test_lone_atomic_leases_are_renewed_while_their_handlers_hold_every_pooled_connection(
    workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """At the library's default sizing (as many slots as pooled connections), every
    slot runs a lone atomic attempt, each holding a pooled connection for its
    transaction, for three leases: their leases are renewed all along, and each job
    completes on its first attempt. Renewals that wait for a pooled connection never
    get one, and every attempt is aborted for a lost lease."""
    reg = JobTypeRegistry()
    pay = reg.job_type("pay", input=Num, mode="atomic", lease=LEASE, timeout=timedelta(seconds=30))
    state = await PostgresStateAdapter.connect(pgwork_dsn)
    client = create_client(
        state_adapter=state, notify_adapter=PostgresNotifyAdapter(pgwork_dsn), registry=reg
    )
    count = state.pool.max_size
    running: set[int] = set()
    all_running, release = anyio.Event(), anyio.Event()
    aborted: list[Any] = []

    async def handle(attempt: Any) -> None:
        running.add(attempt.job.input.n)
        if len(running) == count:
            all_running.set()
        try:
            await release.wait()
        finally:
            if attempt.abort_reason is not None:
                aborted.append(attempt.abort_reason)

    worker = await workers(client=client, processors={pay: handle}, max_slots=count, atomic_group=1)
    try:
        chains = await client.start_chains(conn, [ChainStart(pay, Num(n=n)) for n in range(count)])
        await conn.commit()
        with anyio.fail_after(20):
            await all_running.wait()
        began = await scalar(pgwork_dsn, "SELECT clock_timestamp()")
        await eventually(
            lambda: _all_renewed_past(pgwork_dsn, [c.job_id for c in chains], began + 3 * LEASE),
            timeout=15,
            what="every atomic attempt's lease to be renewed past three leases",
        )
        release.set()
        for chain in chains:
            await client.await_chain(chain.id, timeout=15)
            job = await client.get_job(chain.job_id)
            assert job.status is JobStatus.COMPLETED
            assert job.attempt == 1
        assert aborted == []
    finally:
        release.set()
        await worker.stop()
        await client.close()
