"""The worker registry: workers register, send heartbeats, and a dead worker's jobs are
taken back at once by a live one."""

from __future__ import annotations

from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import Attempt, JobStatus, JobTypeRegistry

from .conftest import ClientFactory, eventually

pytestmark = pytest.mark.anyio


class Item(BaseModel):
    name: str


async def test_running_workers_are_listed_with_their_status(
    make_client: ClientFactory, workers: Any
) -> None:
    reg = JobTypeRegistry()
    job = reg.job_type("job", input=Item, queue="mail")
    client = await make_client(reg)

    async def handle(attempt: Attempt[Item, Any]) -> None:
        return None

    worker = await workers(client=client, processors={job: handle}, worker_id="listed", max_slots=3)
    listed = {w.id: w for w in await client.list_workers()}
    assert listed["listed"].alive
    assert listed["listed"].queues == ("mail",)
    assert listed["listed"].job_types == ("job",)
    assert listed["listed"].max_slots == 3
    await worker.stop()
    stopped = {w.id: w for w in await client.list_workers()}
    assert stopped["listed"].status == "stopped"
    assert not stopped["listed"].alive


async def test_a_dead_workers_jobs_are_taken_back_without_waiting_for_their_leases(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    job = reg.job_type("job", input=Item, output=str)
    client = await make_client(reg)
    started = [await client.start_chain(conn, job, Item(name=str(i))) for i in range(3)]
    await conn.commit()
    # A worker that registered, took the jobs with hour-long leases, then went silent.
    await conn.execute(
        "INSERT INTO pgwork.workers (id, host, pid, queues, job_types, max_slots, "
        "heartbeat_at) VALUES ('ghost', 'h', 1, '{default}', '{job}', 3, "
        "now() - interval '10 minutes')"
    )
    await conn.execute(
        "UPDATE pgwork.jobs SET status = 'running', attempt = 1, leased_by = 'ghost', "
        "lease_token = gen_random_uuid(), leased_until = now() + interval '1 hour'"
    )
    await conn.commit()

    async def handle(attempt: Attempt[Item, str]) -> str:
        return f"rescued {attempt.job.input.name}"

    await workers(
        client=client,
        processors={job: handle},
        worker_id="alive",
        heartbeat_interval=0.1,
        dead_worker_after=5.0,
    )

    async def all_done() -> bool:
        jobs = [await client.get_job(s.job_id) for s in started]
        return all(j.status is JobStatus.COMPLETED for j in jobs)

    await eventually(all_done, what="jobs of the dead worker completed")
    job_rows = [await client.get_job(s.job_id) for s in started]
    assert all(j.attempt == 2 for j in job_rows)
    ghost = {w.id: w for w in await client.list_workers()}["ghost"]
    assert ghost.status == "stopped"


async def test_a_worker_declared_dead_registers_again_when_it_comes_back(
    make_client: ClientFactory, workers: Any, pgwork_dsn: str
) -> None:
    reg = JobTypeRegistry()
    job = reg.job_type("job", input=Item)
    client = await make_client(reg)

    async def handle(attempt: Attempt[Item, Any]) -> None:
        return None

    await workers(client=client, processors={job: handle}, worker_id="back", heartbeat_interval=0.1)
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as admin:
        await admin.execute("UPDATE pgwork.workers SET status = 'stopped' WHERE id = 'back'")

    async def alive_again() -> bool:
        listed = {w.id: w for w in await client.list_workers()}
        return listed["back"].status != "stopped"

    with anyio.fail_after(10):
        await eventually(alive_again, what="re-registration")
