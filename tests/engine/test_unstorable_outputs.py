"""An output the database cannot store fails its own job, not the jobs written with it.

In a LATIN1 database a handler returns "€", which that encoding has no byte for. The
worker writes staged completions in batches (and a grouped atomic member that wrote
nothing goes with them): the one outcome must not fail the batch, or every job in it
runs again."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import anyio
import psycopg
import pytest
from psycopg import sql
from pydantic import BaseModel

from pgwork import (
    Attempt,
    ChainStart,
    JobStatus,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    RetryPolicy,
    create_client,
    create_in_process_worker,
)
from pgwork.postgres import migrate
from pgwork.testing.databases import database_dsn, drop_database, unique_database_name

from .conftest import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

JOBS = 10
BAD = 4
MAX_ATTEMPTS = 3


class Num(BaseModel):
    n: int


@pytest.fixture
def latin1_dsn(pg_server_dsn: str) -> Iterator[str]:
    """A migrated database whose encoding is LATIN1."""
    name = unique_database_name()
    with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL(
                "CREATE DATABASE {} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' "
                "TEMPLATE template0"
            ).format(sql.Identifier(name))
        )
    try:
        dsn = database_dsn(pg_server_dsn, name)
        migrate.upgrade(dsn)
        yield dsn
    finally:
        drop_database(pg_server_dsn, name)


@pytest.mark.parametrize("mode", ["staged", "atomic", "grouped", "grouped-writing"])
async def test_an_output_the_database_cannot_store_fails_only_its_own_job(
    latin1_dsn: str, mode: str
) -> None:
    """Ten jobs finish together; one returns "€". The nine others complete with one
    attempt each; that one fails (retried per its policy, then for good) with a reason
    that names the encoding. (Control: the batch written as a whole, however it fails:
    all ten run again.)"""
    await _one_bad_output_among_ten(latin1_dsn, mode, "€", "latin")


async def _one_bad_output_among_ten(dsn: str, mode: str, bad_output: str, reason: str) -> None:
    """Run ten jobs of ``mode``, the one with input ``BAD`` returning ``bad_output``;
    check that only that one failed, with ``reason`` in its error's message."""
    reg = JobTypeRegistry()
    echo = reg.job_type(
        "echo",
        input=Num,
        output=str,
        mode="staged" if mode == "staged" else "atomic",
        max_attempts=MAX_ATTEMPTS,
        retry=RetryPolicy(initial=timedelta(0), maximum=timedelta(0)),
    )
    state = await PostgresStateAdapter.connect(dsn, max_size=20)
    client = create_client(
        state_adapter=state, notify_adapter=PostgresNotifyAdapter(dsn), registry=reg
    )
    writes = mode in ("atomic", "grouped-writing")
    calls: Counter[int] = Counter()
    all_started = anyio.Event()
    if mode.startswith("grouped"):
        # A group's members run one after another on their lane: nothing to wait for.
        all_started.set()

    async def handle(attempt: Attempt[Num, str]) -> str:
        n = attempt.job.input.n
        calls[n] += 1
        if writes:
            await attempt.connection.execute("INSERT INTO effects VALUES (%s)", (n,))
        if len(calls) == JOBS:
            all_started.set()
        with anyio.fail_after(20):
            await all_started.wait()  # the ten outcomes are written together
        return bad_output if n == BAD else "ok"

    try:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await conn.execute("CREATE TABLE effects (n int NOT NULL)")
            started = await client.start_chains(
                conn, [ChainStart(echo, Num(n=n)) for n in range(JOBS)]
            )
            await conn.commit()

            async def all_final() -> bool:
                jobs = [await client.get_job(s.job_id) for s in started]
                return all(j.status in (JobStatus.COMPLETED, JobStatus.FAILED) for j in jobs)

            async with create_in_process_worker(
                client=client,
                processors={echo: handle},
                poll_interval=0.05,
                max_slots=JOBS,
                atomic_group=1 if mode == "atomic" else JOBS,
                atomic_group_wait=0.2,
            ):
                await eventually(all_final, timeout=40, what="every job final")
            jobs = {(await client.get_job(s.job_id)).input.n: s.job_id for s in started}
            for n, job_id in jobs.items():
                job = await client.get_job(job_id)
                if n == BAD:
                    assert job.status is JobStatus.FAILED
                    assert job.attempt == MAX_ATTEMPTS
                    assert job.last_attempt_error is not None
                    assert "OutcomeNotStorableError" in job.last_attempt_error.type
                    assert reason in job.last_attempt_error.message.lower()
                else:
                    assert job.status is JobStatus.COMPLETED, (n, job)
                    assert job.attempt == 1, (n, job)
                    assert job.output == "ok"
            assert all(calls[n] == 1 for n in range(JOBS) if n != BAD), calls
            if writes:
                cur = await conn.execute("SELECT n, count(*) FROM effects GROUP BY n ORDER BY n")
                assert await cur.fetchall() == [(n, 1) for n in range(JOBS) if n != BAD]
    finally:
        await client.close()


async def test_a_failure_whose_message_the_database_cannot_store_is_recorded(
    latin1_dsn: str,
) -> None:
    """A handler raises with "€" in its message: the failure is still written (the
    character escaped), the job retried and then failed for good. (Control: the
    message written as it is: the server refuses the write, and the job's recorded
    error is that refusal, not the handler's.)"""
    reg = JobTypeRegistry()
    pay = reg.job_type(
        "pay",
        input=Num,
        max_attempts=2,
        retry=RetryPolicy(initial=timedelta(0), maximum=timedelta(0)),
    )
    state = await PostgresStateAdapter.connect(latin1_dsn, max_size=20)
    client = create_client(
        state_adapter=state, notify_adapter=PostgresNotifyAdapter(latin1_dsn), registry=reg
    )

    async def handle(attempt: Attempt[Num, None]) -> None:
        raise ValueError("price in € is not accepted")

    try:
        async with await psycopg.AsyncConnection.connect(latin1_dsn) as conn:
            started = await client.start_chain(conn, pay, Num(n=1))
            await conn.commit()

        async def failed() -> bool:
            return (await client.get_job(started.job_id)).status is JobStatus.FAILED

        async with create_in_process_worker(
            client=client, processors={pay: handle}, poll_interval=0.05
        ):
            await eventually(failed, timeout=20, what="the job to fail")
        job = await client.get_job(started.job_id)
        assert job.attempt == 2
        assert job.last_attempt_error is not None
        assert job.last_attempt_error.type == "builtins.ValueError"
        assert job.last_attempt_error.message == "price in \\u20ac is not accepted"
    finally:
        await client.close()
