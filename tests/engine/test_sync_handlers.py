"""Sync handlers: a plain ``def`` runs on the worker's own threads with a ``SyncAttempt``.

What the user sees: it completes, fails (retried) and reschedules jobs as an async
handler does; it blocks neither the event loop (other slots, lease renewals) nor the
worker's stop; it is told to stop through ``attempt.cancelled`` and its next pgwork
call raising; one that never returns is abandoned and its thread replaced. What cannot
work is refused when the worker is built, before any job is taken. Each mechanism has a
control that takes it out and must show the difference.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    AbortReason,
    Attempt,
    AtomicSyncHandlerError,
    AttemptCancelledError,
    ConfigurationError,
    HandlerAbandonedError,
    InProcessWorker,
    JobStatus,
    JobTypeRegistry,
    RetryPolicy,
    SyncAttempt,
    SyncHandlerError,
    create_in_process_worker,
)
from pgwork.worker._sync import SyncAttempt as _SyncAttempt
from pgwork.worker._threads import HandlerThreads

from .conftest import ClientFactory, eventually, scalar

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

NO_BACKOFF = RetryPolicy(initial=timedelta(0), maximum=timedelta(0))


class Num(BaseModel):
    n: int


class Total(BaseModel):
    total: int


def _type_of(error: type[BaseException]) -> str:
    return f"{error.__module__}.{error.__qualname__}"


async def _done(client: Any, chain_ids: list[Any]) -> bool:
    chains = [await client.get_chain(chain_id) for chain_id in chain_ids]
    return all(chain.status == "completed" for chain in chains)


# --- running -------------------------------------------------------------------------


async def test_sync_handlers_of_every_shape_run_on_the_workers_own_threads(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    plain = reg.job_type("plain", input=Num, output=Total)
    callable_object = reg.job_type("callable_object", input=Num, output=Total)
    partial = reg.job_type("partial", input=Num, output=Total)
    method = reg.job_type("method", input=Num, output=Total)
    lambda_ = reg.job_type("lambda", input=Num, output=Total)
    threads: list[str] = []

    def square(attempt: SyncAttempt[Num, Total], offset: int = 0) -> Total:
        threads.append(threading.current_thread().name)
        return Total(total=attempt.job.input.n**2 + offset)

    class Squares:
        def __call__(self, attempt: SyncAttempt[Num, Total]) -> Total:
            return square(attempt)

        def handle(self, attempt: SyncAttempt[Num, Total]) -> Total:
            return square(attempt)

    client = await make_client(reg)
    worker = await workers(
        client=client,
        worker_id="w-threads",
        processors={
            plain: square,
            callable_object: Squares(),
            partial: functools.partial(square, offset=1),
            method: Squares().handle,
            lambda_: lambda attempt: square(attempt),
        },
    )
    started = [
        await client.start_chain(conn, job_type, Num(n=3))
        for job_type in (plain, callable_object, partial, method, lambda_)
    ]
    await conn.commit()
    await eventually(lambda: _done(client, [s.id for s in started]), what="every chain done")
    outputs = [(await client.get_chain(s.id)).output for s in started]
    assert outputs == [Total(total=9), Total(total=9), Total(total=10), Total(total=9)] + [
        Total(total=9)
    ]
    # The worker's own threads: not the event loop's, nor its default executor's
    # (``asyncio_N``, what ``asyncio.to_thread`` runs on).
    assert len(threads) == 5
    assert all(name.startswith("pgwork-sync-w-threads-") for name in threads), threads
    await worker.stop()
    # Stopped, the worker's threads end (they are not left idle behind it).
    await _eventually_true(
        lambda: not any(t.name.startswith("pgwork-sync-w-threads-") for t in threading.enumerate()),
        what="the worker's threads ended",
    )


async def test_a_sync_handler_reads_its_job_fails_is_retried_reschedules_and_completes(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    flaky = reg.job_type("flaky", input=Num, output=Total, retry=NO_BACKOFF)
    seen: list[tuple[int, int, str | None, bool]] = []

    def handle(attempt: SyncAttempt[Num, Total]) -> None:
        job = attempt.job
        seen.append((job.attempt, job.input.n, attempt.limit_key, attempt.cancelled))
        if len(seen) == 1:
            raise RuntimeError("the service is down")
        if len(seen) == 2:
            attempt.reschedule(after=timedelta(0))
            return
        attempt.complete(Total(total=job.input.n * 10))

    client = await make_client(reg)
    await workers(client=client, processors={flaky: handle})
    started = await client.start_chain(conn, flaky, Num(n=4))
    await conn.commit()
    await eventually(lambda: _done(client, [started.id]), what="the chain completed")

    job = await client.get_job(started.job_id)
    assert job.output == Total(total=40)
    # Failed (attempt 1, retried), rescheduled (attempt 2, not counted), completed.
    assert seen == [(1, 4, None, False), (2, 4, None, False), (2, 4, None, False)]
    assert job.attempt == 2
    assert job.last_attempt_error is not None
    assert job.last_attempt_error.type == "builtins.RuntimeError"
    assert job.last_attempt_error.message == "the service is down"


async def test_a_sync_handler_that_blocks_holds_up_neither_other_handlers_nor_renewals(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    def blocks(attempt: SyncAttempt[Num, None]) -> None:
        time.sleep(2)

    await _check_blocking_handler(blocks, make_client, workers, conn, pgwork_dsn)


async def test_control_the_same_blocking_code_on_the_event_loop_holds_up_both(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    async def blocks_the_loop(attempt: Attempt[Num, None]) -> None:
        time.sleep(2)

    with pytest.raises(AssertionError, match="blocking handler"):
        await _check_blocking_handler(blocks_the_loop, make_client, workers, conn, pgwork_dsn)


async def _check_blocking_handler(
    handler: Any,
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    dsn: str,
) -> None:
    """While ``handler`` blocks for 2 s, an async job on the same worker is done and
    the blocked job's lease is renewed (a lease of 0.9 s, renewed every third of it)."""
    reg = JobTypeRegistry()
    slow = reg.job_type("slow", input=Num, lease=timedelta(seconds=0.9))
    quick = reg.job_type("quick", input=Num)
    running = threading.Event()
    finished = threading.Event()

    def blocked(attempt: Any) -> Any:
        running.set()
        try:
            return handler(attempt)
        finally:
            finished.set()

    async def quick_handler(attempt: Attempt[Num, None]) -> None:
        return None

    client = await make_client(reg)
    blocked_handler: Any = blocked
    if inspect.iscoroutinefunction(handler):

        async def blocked_async(attempt: Any) -> Any:
            running.set()
            try:
                return await handler(attempt)
            finally:
                finished.set()

        blocked_handler = blocked_async
    await workers(client=client, processors={slow: blocked_handler, quick: quick_handler})
    started = await client.start_chain(conn, slow, Num(n=1))
    await conn.commit()
    await _eventually_true(running.is_set, what="the blocking handler running")
    query = "select leased_until from pgwork.jobs where id = %s"
    first = await scalar(dsn, query, started.job_id)
    other = await client.start_chain(conn, quick, Num(n=2))
    await conn.commit()
    await eventually(lambda: _done(client, [other.id]), what="the async job done")
    quick_done_first = not finished.is_set()
    latest = await scalar(dsn, query, started.job_id)
    while not finished.is_set():
        latest = await scalar(dsn, query, started.job_id) or latest
        await anyio.sleep(0.05)
    await eventually(lambda: _done(client, [started.id]), what="the blocking job done")
    assert quick_done_first, "the async job waited for the blocking handler"
    # Renewed while it blocked: more than a whole lease later than when it started.
    assert latest - first >= timedelta(seconds=0.9), (
        f"the blocking handler's lease was renewed by {latest - first} only"
    )
    job = await client.get_job(started.job_id)
    assert job.attempt == 1  # never reaped and run again


async def _eventually_true(
    check: Callable[[], bool], *, what: str, timeout: float = 20.0
) -> None:
    async def probe() -> bool:
        return check()

    await eventually(probe, what=what, timeout=timeout)
