"""Steering jobs: dedup races, scheduling and cron, queues, cancel, retry, workerless
completion."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    AbortReason,
    Attempt,
    ChainStatus,
    DedupSpec,
    JobStatus,
    JobTypeRegistry,
)
from pgwork.errors import (
    ChainAlreadyFinishedError,
    InvalidCronError,
    InvalidDedupWindowError,
    JobAlreadyFinishedError,
    JobNotFoundError,
    JobNotRetryableError,
)
from pgwork.schedules import CronSchedule

from .conftest import ClientFactory, HangUntilAborted, eventually, scalar

pytestmark = pytest.mark.anyio


class Item(BaseModel):
    name: str


def registry() -> JobTypeRegistry:
    reg = JobTypeRegistry()
    reg.job_type("task", input=Item, output=Item)
    reg.job_type("high_task", input=Item, queue="high")
    reg.job_type("low_task", input=Item, queue="low")
    reg.job_type("report", input=Item)
    return reg


# --- deduplication -----------------------------------------------------------------


async def test_concurrent_enqueues_with_one_dedup_key_create_one_chain(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    task = client.registry.get("task")
    results = []

    async def enqueue(i: int) -> None:
        async with await psycopg.AsyncConnection.connect(pgwork_dsn) as c:
            results.append(await client.start_chain(c, task, Item(name=str(i)), dedup="once"))
            await anyio.sleep(0.01)  # hold the transaction open a little: others must wait
            await c.commit()

    async with anyio.create_task_group() as tg:
        for i in range(10):
            tg.start_soon(enqueue, i)
    assert sum(not r.deduplicated for r in results) == 1
    assert len({r.id for r in results}) == 1
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs") == 1


async def test_dedup_scopes_incomplete_and_window(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    task = client.registry.get("task")
    first = await client.start_chain(conn, task, Item(name="a"), dedup="k")
    await conn.commit()
    await client.complete_job(conn, first.job_id, Item(name="done"))
    await conn.commit()
    # "incomplete" no longer matches a completed chain; a window still does.
    windowed = await client.start_chain(
        conn, task, Item(name="b"), dedup=DedupSpec("k", scope="window", window=timedelta(hours=1))
    )
    fresh = await client.start_chain(conn, task, Item(name="c"), dedup="k")
    await conn.commit()
    assert windowed.deduplicated
    assert windowed.id == first.id
    assert not fresh.deduplicated


def test_a_dedup_window_that_is_not_positive_is_refused() -> None:
    with pytest.raises(InvalidDedupWindowError, match="'k'"):
        DedupSpec("k", scope="window", window=timedelta(0))
    with pytest.raises(InvalidDedupWindowError):
        DedupSpec("k", scope="window")


# --- scheduling --------------------------------------------------------------------


async def test_trigger_runs_a_scheduled_job_now(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    task = client.registry.get("task")
    ran = anyio.Event()

    async def handle(attempt: Attempt[Item, Item]) -> Item:
        ran.set()
        return attempt.job.input

    await workers(client=client, processors={task: handle})
    started = await client.start_chain(conn, task, Item(name="x"), schedule=timedelta(days=1))
    await conn.commit()
    await client.trigger(conn, [started.job_id])
    await conn.commit()
    with anyio.fail_after(10):
        await ran.wait()


async def test_a_worker_with_a_schedule_enqueues_and_runs_it(
    make_client: ClientFactory, workers: Any
) -> None:
    client = await make_client(registry())
    report = client.registry.get("report")
    ran = anyio.Event()

    async def handle(attempt: Attempt[Item, Any]) -> None:
        ran.set()

    await workers(
        client=client,
        processors={report: handle},
        schedules=[CronSchedule("every-minute", "* * * * *", report, Item(name="r"))],
    )
    with anyio.fail_after(15):
        await ran.wait()


def test_an_invalid_cron_expression_is_refused() -> None:
    reg = registry()
    with pytest.raises(InvalidCronError, match="'bad'") as err:
        CronSchedule("bad", "61 * * * *", reg.get("report"), Item(name="r"))
    assert err.value.expression == "61 * * * *"
    with pytest.raises(InvalidCronError):
        CronSchedule("bad", "every day", reg.get("report"), Item(name="r"))


# --- queues ------------------------------------------------------------------------


async def test_queues_are_drained_in_the_order_given_then_by_priority(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    task, high, low = (client.registry.get(n) for n in ("task", "high_task", "low_task"))
    order: list[str] = []
    done = anyio.Event()

    async def handle(attempt: Attempt[Item, Any]) -> None:
        order.append(attempt.job.input.name)
        if len(order) == 5:
            done.set()

    await client.start_chain(conn, low, Item(name="low"))
    await client.start_chain(conn, task, Item(name="default-late"), priority=5)
    await client.start_chain(conn, task, Item(name="default-urgent"), priority=-5)
    await client.start_chain(conn, high, Item(name="high"))
    await conn.commit()
    # A later transaction: jobs of one transaction share its scheduled_at (now()), and
    # the order among equal (priority, scheduled_at) is not defined.
    await client.start_chain(conn, low, Item(name="low-2"))
    await conn.commit()
    await workers(
        client=client,
        processors={task: handle, high: handle, low: handle},
        queues=["high", "default", "low"],
        max_slots=1,
    )
    with anyio.fail_after(20):
        await done.wait()
    assert order == ["high", "default-urgent", "default-late", "low", "low-2"]


async def test_a_paused_queue_keeps_its_jobs_until_resumed(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    task = client.registry.get("task")
    ran = anyio.Event()

    async def handle(attempt: Attempt[Item, Item]) -> Item:
        ran.set()
        return attempt.job.input

    await client.pause_queue("default")
    assert await scalar(pgwork_dsn, "SELECT paused FROM pgwork.queues WHERE name = 'default'")
    started = await client.start_chain(conn, task, Item(name="waits"))
    await conn.commit()
    await workers(client=client, processors={task: handle}, poll_interval=0.1)
    with anyio.move_on_after(1.0):
        await ran.wait()
    assert not ran.is_set()
    assert (await client.get_job(started.job_id)).status is JobStatus.PENDING
    await client.resume_queue("default")
    with anyio.fail_after(10):
        await ran.wait()


# --- cancel ------------------------------------------------------------------------


async def test_cancel_a_pending_chain_and_it_never_runs(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    task = client.registry.get("task")
    ran: list[str] = []

    async def handle(attempt: Attempt[Item, Item]) -> Item:
        ran.append(attempt.job.input.name)
        return attempt.job.input

    # Due at once, enqueued before the marker: a worker that ignored the cancel would
    # run it first (same queue and priority, earlier scheduled_at).
    doomed = await client.start_chain(conn, task, Item(name="doomed"))
    await conn.commit()
    assert await client.cancel(conn, [doomed.id]) == [doomed.id]
    await conn.commit()
    await workers(client=client, processors={task: handle})
    marker = await client.start_chain(conn, task, Item(name="marker"))
    await conn.commit()
    assert await client.await_chain(marker.id, timeout=10) == Item(name="marker")
    assert ran == ["marker"]
    chain = await client.get_chain(doomed.id)
    assert chain.status is ChainStatus.CANCELLED
    assert chain.current_job.status is JobStatus.CANCELLED
    with pytest.raises(ChainAlreadyFinishedError) as err:
        await client.cancel(conn, [doomed.id])
    assert err.value.chain_ids == (doomed.id,)
    await conn.rollback()


async def test_cancel_while_running_aborts_the_attempt_with_reason_cancelled(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    task = client.registry.get("task")
    handle = HangUntilAborted()
    running, aborted, reasons = handle.running, handle.aborted, handle.reasons

    await workers(client=client, processors={task: handle})
    started = await client.start_chain(conn, task, Item(name="long"))
    await conn.commit()
    with anyio.fail_after(10):
        await running.wait()
    await client.cancel(conn, [started.job_id])
    await conn.commit()
    with anyio.fail_after(10):
        await aborted.wait()
    assert reasons == [AbortReason.CANCELLED]
    assert (await client.get_job(started.job_id)).status is JobStatus.CANCELLED


async def test_cancelling_unknown_ids_names_them(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    from pgwork._ids import new_id

    client = await make_client(registry())
    ghost = new_id()
    with pytest.raises(JobNotFoundError) as err:
        await client.cancel(conn, [ghost])
    assert err.value.job_ids == (ghost,)


# --- retry -------------------------------------------------------------------------


async def test_retry_puts_a_failed_job_ahead_of_the_queue(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    job = reg.job_type("job", input=Item, max_attempts=1)
    client = await make_client(reg)
    order: list[str] = []
    flaky_fails = True
    failed = anyio.Event()
    all_done = anyio.Event()

    async def handle(attempt: Attempt[Item, Any]) -> None:
        if attempt.job.input.name == "flaky" and flaky_fails:
            failed.set()
            raise RuntimeError("first time")
        order.append(attempt.job.input.name)
        if len(order) == 4:
            all_done.set()

    worker = await workers(client=client, processors={job: handle}, max_slots=1)
    flaky = await client.start_chain(conn, job, Item(name="flaky"))
    await conn.commit()
    with anyio.fail_after(10):
        await failed.wait()
    await eventually(lambda: _failed(client, flaky.job_id), what="failed")
    await worker.stop()
    for name in ("q1", "q2", "q3"):
        await client.start_chain(conn, job, Item(name=name))
    await conn.commit()
    flaky_fails = False
    assert await client.retry(conn, [flaky.job_id], front=True) == [flaky.job_id]
    await conn.commit()
    assert (await client.get_chain(flaky.id)).status is ChainStatus.ACTIVE
    await workers(client=client, processors={job: handle}, max_slots=1)
    with anyio.fail_after(20):
        await all_done.wait()
    assert order == ["flaky", "q1", "q2", "q3"]
    assert (await client.get_job(flaky.job_id)).attempt == 1


async def _failed(client: Any, job_id: Any) -> bool:
    return (await client.get_job(job_id)).status is JobStatus.FAILED


async def test_retrying_a_job_that_has_not_failed_is_refused(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    started = await client.start_chain(conn, client.registry.get("task"), Item(name="x"))
    await conn.commit()
    with pytest.raises(JobNotRetryableError) as err:
        await client.retry(conn, [started.job_id])
    assert err.value.statuses == ("pending",)


# --- workerless completion -----------------------------------------------------------


async def test_completing_from_outside_a_worker_tells_the_holder_to_abandon(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    task = client.registry.get("task")
    handle = HangUntilAborted()
    running, aborted, reasons = handle.running, handle.aborted, handle.reasons

    await workers(client=client, processors={task: handle})
    started = await client.start_chain(conn, task, Item(name="webhook"))
    await conn.commit()
    with anyio.fail_after(10):
        await running.wait()
    await client.complete_job(conn, started.job_id, Item(name="from webhook"))
    await conn.commit()
    with anyio.fail_after(10):
        await aborted.wait()
    assert reasons == [AbortReason.COMPLETED_ELSEWHERE]
    assert await client.await_chain(started.id, timeout=5) == Item(name="from webhook")
    with pytest.raises(JobAlreadyFinishedError) as err:
        await client.complete_job(conn, started.job_id, Item(name="again"))
    assert err.value.job_ids == (started.job_id,)
    assert err.value.statuses == ("completed",)
