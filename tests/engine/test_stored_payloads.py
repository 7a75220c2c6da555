"""A stored payload the worker cannot decode fails its own job only, at once.

Rows written outside pgwork (a hand-written INSERT, a migration script) may hold JSON
that parses in PostgreSQL but not in Python. Such a row must not take down the batch
it was acquired with: the others run on their first attempt.
"""

from __future__ import annotations

from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import Attempt, JobTypeRegistry
from pgwork.records import UndecodablePayload

from .conftest import ClientFactory, eventually, scalar

pytestmark = pytest.mark.anyio

DEPTH = 5_000


class Num(BaseModel):
    n: int


async def test_an_undecodable_input_fails_its_job_and_spares_the_batch(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], workers: Any, pgwork_dsn: str
) -> None:
    reg = JobTypeRegistry()
    step = reg.job_type("step", input=Num, max_attempts=3)
    client = await make_client(reg)
    started = [await client.start_chain(conn, step, Num(n=n)) for n in range(4)]
    bad = started[1].job_id
    # Valid jsonb, but deeper than Python's json parser can read.
    await conn.execute(
        "UPDATE pgwork.jobs SET input = (repeat('[', %s) || repeat(']', %s))::jsonb WHERE id = %s",
        (DEPTH, DEPTH, bad),
    )
    await conn.commit()

    ran: list[int] = []
    all_ran = anyio.Event()

    async def handler(attempt: Attempt[Num, Any]) -> None:
        ran.append(attempt.job.attempt)
        if len(ran) == 3:
            all_ran.set()

    # One worker, slots for all four: they are leased in one acquire.
    await workers(client=client, processors={step: handler}, max_slots=10)
    with anyio.fail_after(20):
        await all_ran.wait()
    assert ran == [1, 1, 1]

    async def bad_job_failed() -> bool:
        status = await scalar(pgwork_dsn, "SELECT status::text FROM pgwork.jobs WHERE id = %s", bad)
        return bool(status == "failed")

    await eventually(bad_job_failed, what="the undecodable job to fail")
    attempt, message = await _attempt_and_message(pgwork_dsn, bad)
    assert attempt == 1  # failed at once: a retry would read the same bytes
    assert "stored input of job type 'step' could not be decoded" in message
    assert "lease" not in message

    async def others_completed() -> bool:
        count = await scalar(
            pgwork_dsn,
            "SELECT count(*) FROM pgwork.jobs WHERE status = 'completed' AND attempt = 1",
        )
        return bool(count == 3)

    await eventually(others_completed, what="the other three to complete on attempt 1")


async def _attempt_and_message(dsn: str, job_id: Any) -> tuple[int, str]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        cur = await c.execute(
            "SELECT attempt, last_attempt_error->>'message' FROM pgwork.jobs WHERE id = %s",
            (job_id,),
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


class Renamed(BaseModel):
    """``Num`` after a deploy renamed its field: rows written before no longer fit."""

    count: int


async def test_reads_show_every_row_even_one_that_cannot_be_decoded(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    """get_job, get_chain, list_jobs and list_chains return a row whose stored input
    cannot be parsed (an ``UndecodablePayload`` stands in) or no longer fits its model
    (the stored JSON as it is), and decode every other row as usual."""
    reg = JobTypeRegistry()
    step = reg.job_type("step", input=Num)
    client = await make_client(reg)
    good, poison, stale = [await client.start_chain(conn, step, Num(n=n)) for n in range(3)]
    await conn.execute(
        "UPDATE pgwork.jobs SET input = (repeat('[', %s) || repeat(']', %s))::jsonb WHERE id = %s",
        (DEPTH, DEPTH, poison.job_id),
    )
    await conn.execute(
        """UPDATE pgwork.jobs SET input = '{"count": 7}'::jsonb WHERE id = %s""", (stale.job_id,)
    )
    await conn.commit()

    unparsable = (await client.get_job(poison.job_id)).input
    assert isinstance(unparsable, UndecodablePayload)
    assert "nested too deeply" in unparsable.reason
    assert (await client.get_job(stale.job_id)).input == {"count": 7}
    assert (await client.get_job(good.job_id)).input == Num(n=0)
    assert isinstance((await client.get_chain(poison.id)).input, UndecodablePayload)

    jobs = {job.id: job.input for job in (await client.list_jobs(limit=10)).items}
    assert jobs[good.job_id] == Num(n=0)
    assert isinstance(jobs[poison.job_id], UndecodablePayload)
    assert jobs[stale.job_id] == {"count": 7}
    chains = {chain.id: chain.input for chain in (await client.list_chains(limit=10)).items}
    assert chains[good.id] == Num(n=0)
    assert isinstance(chains[poison.id], UndecodablePayload)

    # A registry whose model changed decodes the rows that fit it.
    renamed = JobTypeRegistry()
    renamed.job_type("step", input=Renamed)
    later = await make_client(renamed)
    assert (await later.get_job(stale.job_id)).input == Renamed(count=7)
    assert (await later.get_job(good.job_id)).input == {"n": 0}
