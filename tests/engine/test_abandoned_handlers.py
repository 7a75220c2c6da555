"""Handlers that ignore cancellation: abandoned after ``abandon_after``, never waited for.

Each stuck handler shields itself until the test releases it, so the abandoned
coroutine can be seen ending late without changing anything (and the event loop can
close at the end of the test).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import anyio.lowlevel
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    Attempt,
    HandlerAbandonedError,
    JobStatus,
    JobTypeRegistry,
    RetryPolicy,
    create_in_process_worker,
)
from pgwork.observability import ATTEMPT_ABANDONED, Event

from .conftest import ClientFactory, eventually, scalar

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

NO_BACKOFF = RetryPolicy(initial=timedelta(0), maximum=timedelta(0))
ABANDONED = f"{HandlerAbandonedError.__module__}.{HandlerAbandonedError.__qualname__}"


class Num(BaseModel):
    n: int


class Recorder:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def on_event(self, event: Event) -> None:
        self.events.append(event)

    def named(self, name: str) -> list[Event]:
        return [e for e in self.events if e.name == name]


class IgnoresCancellation:
    """Shields itself on the attempts in ``stuck_on`` until ``release`` is set, then
    returns ``"late"``; completes other attempts at once with ``"on time"``."""

    def __init__(self, *stuck_on: int) -> None:
        self.stuck_on = stuck_on
        self.running = anyio.Event()
        self.release = anyio.Event()
        self.ended_late = anyio.Event()

    async def __call__(self, attempt: Attempt[Num, Any]) -> str:
        if attempt.job.attempt not in self.stuck_on:
            return "on time"
        self.running.set()
        with anyio.CancelScope(shield=True):
            await self.release.wait()
        self.ended_late.set()
        return "late"


async def test_timed_out_handler_that_ignores_cancellation_is_abandoned_and_retried(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    reg = JobTypeRegistry()
    stuck = reg.job_type(
        "stuck",
        input=Num,
        timeout=timedelta(milliseconds=200),
        abandon_after=timedelta(milliseconds=300),
        retry=NO_BACKOFF,
    )
    client = await make_client(reg)
    handle = IgnoresCancellation(1)
    recorder = Recorder()
    worker = create_in_process_worker(
        client=client,
        processors={stuck: handle},
        max_slots=1,
        poll_interval=0.1,
        observers=[recorder],
    )
    async with worker:
        started = await client.start_chain(conn, stuck, Num(n=1))
        await conn.commit()

        async def completed() -> bool:
            return (await client.get_job(started.job_id)).status is JobStatus.COMPLETED

        # The one slot was freed: attempt 2 ran while attempt 1 is still stuck.
        await eventually(completed, what="attempt 2 to complete in the freed slot")
        assert not handle.ended_late.is_set()
        assert worker.abandoned_handlers == 1
        job = await client.get_job(started.job_id)
        assert (job.attempt, job.output) == (2, "on time")
        assert job.last_attempt_error is not None
        assert job.last_attempt_error.type == ABANDONED
        assert "timeout after 0:00:00.200000" in job.last_attempt_error.message
        (event,) = recorder.named(ATTEMPT_ABANDONED)
        assert event.fields["attempt"] == 1
        assert event.fields["waited_s"] >= 0.3

        # The abandoned handler ends late: nothing it returns is written.
        handle.release.set()
        with anyio.fail_after(5):
            await handle.ended_late.wait()
        await anyio.lowlevel.checkpoint()  # let the done callback run
        assert worker.abandoned_handlers == 0
    job = await client.get_job(started.job_id)
    assert (job.status, job.attempt, job.output) == (JobStatus.COMPLETED, 2, "on time")


async def test_abandoned_handler_fails_for_good_at_max_attempts(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], workers: Any
) -> None:
    reg = JobTypeRegistry()
    stuck = reg.job_type(
        "stuck",
        input=Num,
        timeout=timedelta(milliseconds=100),
        abandon_after=timedelta(milliseconds=100),
        max_attempts=1,
    )
    client = await make_client(reg)
    handle = IgnoresCancellation(1)
    await workers(client=client, processors={stuck: handle})
    started = await client.start_chain(conn, stuck, Num(n=1))
    await conn.commit()
    try:

        async def failed() -> bool:
            return (await client.get_job(started.job_id)).status is JobStatus.FAILED

        await eventually(failed, what="the job to fail")
        job = await client.get_job(started.job_id)
        assert job.attempt == 1
        assert job.last_attempt_error is not None
        assert job.last_attempt_error.type == ABANDONED
    finally:
        handle.release.set()


async def test_abandoned_handlers_lease_is_no_longer_renewed(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """Aborted for a lost lease (here: the job is taken over), the stuck handler's slot
    is freed after ``abandon_after`` and the worker stops renewing it at once."""
    reg = JobTypeRegistry()
    stuck = reg.job_type("stuck", input=Num, lease=timedelta(milliseconds=600))
    client = await make_client(reg)
    handle = IgnoresCancellation(1)
    recorder = Recorder()
    worker = create_in_process_worker(
        client=client,
        processors={stuck: handle},
        poll_interval=0.1,
        abandon_after=0.2,
        observers=[recorder],
    )
    async with worker:
        started = await client.start_chain(conn, stuck, Num(n=1))
        await conn.commit()
        with anyio.fail_after(10):
            await handle.running.wait()
        async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as other:
            await other.execute(
                "UPDATE pgwork.jobs SET lease_token = gen_random_uuid(), leased_by = 'thief', "
                "leased_until = now() + interval '1 hour' WHERE id = %s",
                (started.job_id,),
            )

        async def abandoned() -> bool:
            return bool(recorder.named(ATTEMPT_ABANDONED))

        await eventually(abandoned, what="the handler to be abandoned")
        assert worker.active_slots == 0
        (event,) = recorder.named(ATTEMPT_ABANDONED)
        assert event.fields["cause"] == "ownership_lost"
        # Nothing was written over the thief's lease.
        job = await client.get_job(started.job_id)
        assert (job.status, job.leased_by) == (JobStatus.RUNNING, "thief")
        handle.release.set()


async def test_stop_returns_when_a_handler_ignores_cancellation(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    stuck = reg.job_type("stuck", input=Num, retry=NO_BACKOFF)
    client = await make_client(reg)
    handle = IgnoresCancellation(1)
    worker = create_in_process_worker(
        client=client, processors={stuck: handle}, grace_period=0.1, abandon_after=0.2
    )
    await worker.start()
    started = await client.start_chain(conn, stuck, Num(n=1))
    await conn.commit()
    try:
        with anyio.fail_after(10):
            await handle.running.wait()
        with anyio.fail_after(5):
            await worker.stop()
        assert worker.abandoned_handlers == 1
        # The attempt counts (the handler may still be doing its work), and the job can
        # run again at once elsewhere.
        job = await client.get_job(started.job_id)
        assert (job.status, job.attempt, job.leased_by) == (JobStatus.PENDING, 1, None)
        assert job.last_attempt_error is not None
        assert job.last_attempt_error.type == ABANDONED
        assert "worker_stopping" in job.last_attempt_error.message
    finally:
        handle.release.set()


async def test_atomic_handler_that_ignores_cancellation_is_abandoned_and_rolled_back(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str, workers: Any
) -> None:
    await conn.execute("CREATE TABLE effects (attempt int)")
    await conn.commit()
    reg = JobTypeRegistry()
    pay = reg.job_type(
        "pay",
        input=Num,
        mode="atomic",
        timeout=timedelta(milliseconds=200),
        abandon_after=timedelta(milliseconds=200),
        retry=NO_BACKOFF,
    )
    client = await make_client(reg)
    release = anyio.Event()

    async def handle(attempt: Attempt[Num, Any]) -> str:
        await attempt.connection.execute("INSERT INTO effects VALUES (%s)", (attempt.job.attempt,))
        if attempt.job.attempt == 1:
            with anyio.CancelScope(shield=True):
                await release.wait()
        return "done"

    await workers(client=client, processors={pay: handle}, max_slots=1, poll_interval=0.1)
    started = await client.start_chain(conn, pay, Num(n=1))
    await conn.commit()
    try:

        async def completed() -> bool:
            return (await client.get_job(started.job_id)).status is JobStatus.COMPLETED

        # Attempt 1's transaction was dropped (its row lock with it), so attempt 2 could
        # take the job, and only its write committed.
        await eventually(completed, what="attempt 2 to complete")
        assert await scalar(pgwork_dsn, "SELECT array_agg(attempt) FROM effects") == [2]
    finally:
        release.set()
