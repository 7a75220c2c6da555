"""A worker that stopped taking jobs because it could not write its heartbeat takes
them again as soon as it can.

A worker whose heartbeat has failed for half of ``dead_worker_after`` takes no new jobs
(another worker may soon declare it dead and take its jobs back). When the heartbeat
gets through again, the worker must look for work at once: with jobs already announced
and the listener awake, nothing else will send it looking (the poll runs only once an
acquire found the queues empty). Each test here polls every 30 s unless it says
otherwise, so work that starts within seconds was started by that wake-up.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgwork import (
    Attempt,
    Client,
    InProcessWorker,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
)

from ._wakeup_kit import PROMPT, Num, Starts, enqueue
from .conftest import eventually

pytestmark = pytest.mark.anyio

JOBS = 4


@pytest.fixture
async def closing() -> AsyncIterator[list[Client]]:
    made: list[Client] = []
    yield made
    for client in made:
        await client.close()


async def _client(
    dsn: str,
    registry: JobTypeRegistry,
    made: list[Client],
    *,
    listen_dsn: str | None = None,
    **state: Any,
) -> Client:
    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(dsn, **state),
        notify_adapter=PostgresNotifyAdapter(listen_dsn or dsn),
        registry=registry,
    )
    made.append(client)
    return client


async def _unhealthy(worker: InProcessWorker) -> None:
    async def stale() -> bool:
        return not worker._heartbeat.healthy

    await eventually(stale, timeout=PROMPT, what="the worker's heartbeat to fail")


async def test_a_worker_takes_queued_work_as_soon_as_its_heartbeat_gets_through_again(
    pgwork_dsn: str, closing: list[Client], start_worker: Any
) -> None:
    reg = JobTypeRegistry()
    job_type = reg.job_type("work", input=Num)
    # Every statement of the worker gives up after half a second, its heartbeat too.
    client = await _client(pgwork_dsn, reg, closing, operation_timeout=0.5)
    starts = Starts()
    worker = await start_worker(
        client=client,
        processors={job_type: starts},
        heartbeat_interval=0.25,
        dead_worker_after=1.5,
    )
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as holder:
        # The heartbeat fails while this transaction holds the worker's row.
        await holder.execute(
            "SELECT 1 FROM pgwork.workers WHERE id = %s FOR UPDATE", (worker.worker_id,)
        )
        await _unhealthy(worker)
        for _ in range(JOBS):
            await enqueue(pgwork_dsn, client, job_type)
        assert not await starts.within(0.5), "a worker with a failing heartbeat took a job"
        await holder.commit()
    assert await starts.within(PROMPT, count=JOBS), (
        f"{len(starts.times)} of {JOBS} jobs started after the heartbeat recovered"
    )


async def test_a_worker_takes_work_queued_during_an_outage_within_the_poll_interval(
    pgwork_dsn: str, pg_server_dsn: str, closing: list[Client], start_worker: Any
) -> None:
    # Every pooled connection of the worker is cut, and no new one is let in, until
    # its heartbeat has failed for half of dead_worker_after; jobs are queued
    # meanwhile. Its listener, on a direct connection (the state adapter's may go
    # through a pooler that failed over), hears them.
    poll = 2.0
    name = f"pgwork-outage-{uuid.uuid4().hex[:8]}"
    dbname = conninfo_to_dict(pgwork_dsn)["dbname"]
    worker_dsn = make_conninfo(pgwork_dsn, application_name=name)
    reg = JobTypeRegistry()
    job_type = reg.job_type("work", input=Num)
    starts = Starts()
    worker = await start_worker(
        client=await _client(worker_dsn, reg, closing, listen_dsn=pgwork_dsn),
        processors={job_type: starts},
        heartbeat_interval=1.0,
        dead_worker_after=4.0,
        poll_interval=poll,
    )
    enqueuer = await _client(pgwork_dsn, reg, closing)
    allow = sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS {}")
    async with (
        await psycopg.AsyncConnection.connect(pg_server_dsn, autocommit=True) as admin,
        await psycopg.AsyncConnection.connect(pgwork_dsn) as caller,
    ):
        try:
            await admin.execute(allow.format(sql.Identifier(dbname), sql.SQL("false")))
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (name,),
            )
            await _unhealthy(worker)
            for _ in range(JOBS):
                await enqueuer.start_chain(caller, job_type, Num(n=1))
            await caller.commit()
        finally:
            await admin.execute(allow.format(sql.Identifier(dbname), sql.SQL("true")))
    restored = time.monotonic()
    with anyio.move_on_after(poll + PROMPT):
        await starts.within(poll + PROMPT, count=JOBS)
    assert len(starts.times) == JOBS, (
        f"{len(starts.times)} of {JOBS} jobs queued during the outage started within "
        f"{poll + PROMPT:g}s of the database coming back"
    )
    print(f"the last job started {starts.times[-1] - restored:.2f}s after the outage")


async def test_atomic_handlers_holding_every_pooled_connection_do_not_stop_the_heartbeat(
    pgwork_dsn: str, closing: list[Client], start_worker: Any
) -> None:
    # Two slots, two pooled connections, two atomic handlers that hold theirs for
    # longer than half of dead_worker_after; two more jobs wait behind them.
    reg = JobTypeRegistry()
    job_type = reg.job_type("long", input=Num, mode="atomic")
    client = await _client(pgwork_dsn, reg, closing, min_size=2, max_size=2)
    held = anyio.Event()
    release = anyio.Event()
    healthy_while_held: list[bool] = []
    starts = Starts()

    async def hold(attempt: Attempt[Num, Any]) -> None:
        await starts(attempt)
        if len(starts.times) == 2:
            held.set()
        if len(starts.times) <= 2:
            with anyio.fail_after(PROMPT * 2):
                await release.wait()

    worker = await start_worker(
        client=client,
        processors={job_type: hold},
        max_slots=2,
        prefetch=0,
        heartbeat_interval=0.25,
        dead_worker_after=1.5,
    )
    for _ in range(JOBS):
        await enqueue(pgwork_dsn, client, job_type)
    with anyio.fail_after(PROMPT):
        await held.wait()
    # Four heartbeats' worth, and more than half of dead_worker_after.
    await anyio.sleep(1.0)
    healthy_while_held.append(worker._heartbeat.healthy)
    release.set()
    assert await starts.within(PROMPT, count=JOBS), (
        f"{len(starts.times)} of {JOBS} jobs started once the long handlers ended"
    )
    assert healthy_while_held == [True], "the heartbeat waited for a pooled connection"
