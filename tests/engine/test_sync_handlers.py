"""Sync handlers: a plain ``def`` runs on the worker's own threads with a ``SyncAttempt``.

What the user sees: it completes, fails (retried) and reschedules jobs as an async
handler does; it blocks neither the event loop (other slots, lease renewals) nor the
worker's stop; it is told to stop through ``attempt.cancelled`` and its next pgwork
call raising; one that never returns is abandoned and its thread replaced. What cannot
work is refused when the worker is built, before any job is taken. Each mechanism has a
control that takes it out and must show the difference.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import inspect
import itertools
import statistics
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    AbortReason,
    Attempt,
    AttemptCancelledError,
    ChainStart,
    HandlerAbandonedError,
    InProcessWorker,
    JobStatus,
    JobTypeRegistry,
    RetryPolicy,
    SyncAttempt,
    SyncHandlerError,
    create_in_process_worker,
)
from pgwork.observability import ADAPTER_CALL_STOP, Event, InstrumentedStateAdapter
from pgwork.worker._sync import SyncAttempt as _SyncAttempt
from pgwork.worker._threads import HandlerThreads

from ._run_one import RunOne
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
    assert outputs == [Total(total=n) for n in (9, 9, 10, 9, 9)]
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
    run_one: RunOne,
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

    ran = await run_one(reg, Num(n=4), until=JobStatus.COMPLETED, processors={flaky: handle})

    job = await ran.job()
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
        time.sleep(2)  # noqa: ASYNC251 - the mistake this control makes on purpose

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


async def _eventually_true(check: Callable[[], bool], *, what: str, timeout: float = 20.0) -> None:
    async def probe() -> bool:
        return check()

    await eventually(probe, what=what, timeout=timeout)


# --- fifty at once -------------------------------------------------------------------

SLEEPERS = 50
SLEEP = 1.5  # how long each sleeper's handler blocks
LEASE = timedelta(seconds=1.2)  # shorter than a sleep: renewed while it blocks, or lost
PROBE = 0.01  # the lag probe's sleep


@dataclass(repr=False)
class Sleepers:
    """Handlers that each block for ``SLEEP`` seconds in ``time.sleep``, counting how
    many run at once; and what the event loop did meanwhile."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    started: threading.Event = field(default_factory=threading.Event)
    first_start: float = 0.0
    running: int = 0
    most_at_once: int = 0
    ended: int = 0
    lags: list[float] = field(default_factory=list)  # how late each probe woke, s
    renewals: list[float] = field(default_factory=list)  # when each renewal returned
    window_end: float = 0.0

    def __call__(self, attempt: Any) -> None:
        with self.lock:
            if not self.started.is_set():
                self.first_start = time.monotonic()
                self.started.set()
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            time.sleep(SLEEP)
        finally:
            with self.lock:
                self.running -= 1
                self.ended += 1

    def on_event(self, event: Event) -> None:
        if event.name == ADAPTER_CALL_STOP and event["operation"] == "renew":
            self.renewals.append(time.monotonic())

    def report(self) -> str:
        """The figures (docs/sync.md quotes them): ``pytest -rP`` shows them."""
        lags = sorted(self.lags)
        return (
            f"{self.most_at_once} handlers at once; event loop lag over {len(lags)} probes: "
            f"median {statistics.median(lags) * 1e3:.2f} ms, "
            f"p95 {lags[int(len(lags) * 0.95)] * 1e3:.2f} ms, max {lags[-1] * 1e3:.2f} ms; "
            f"longest without a lease renewal {self.longest_unrenewed():.3f} s"
        )

    def longest_unrenewed(self) -> float:
        """The longest the running leases went without a renewal, from the first
        handler's start to the end of the window."""
        marks = [
            self.first_start,
            *(t for t in self.renewals if self.first_start < t < self.window_end),
            self.window_end,
        ]
        return max(b - a for a, b in itertools.pairwise(marks))


async def _fifty_sleepers(
    handler: Any,
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    sleepers: Sleepers,
) -> tuple[Any, list[Any]]:
    """Fifty jobs whose ``handler`` blocks ``SLEEP`` seconds each, on a worker of 50
    slots and 50 threads. While they run, a probe task on the event loop sleeps
    ``PROBE`` seconds over and over and notes how late each wake-up is, and every lease
    renewal is timed; from the first handler's start until all fifty ended, or three
    sleeps later (fifty handlers on the loop itself would take fifty). Returns the
    client and the chains started."""
    reg = JobTypeRegistry()
    sleepy = reg.job_type("sleepy", input=Num, lease=LEASE)
    client = await make_client(
        reg, store=lambda state: InstrumentedStateAdapter(state, observers=[sleepers])
    )
    await workers(
        client=client,
        processors={sleepy: handler},
        max_slots=SLEEPERS,
        sync_threads=SLEEPERS,
        grace_period=0,
    )
    started = await client.start_chains(
        conn, [ChainStart(sleepy, Num(n=i)) for i in range(SLEEPERS)]
    )
    await conn.commit()
    await _eventually_true(sleepers.started.is_set, what="the first sleeper running")
    give_up = sleepers.first_start + 3 * SLEEP
    while sleepers.ended < SLEEPERS and time.monotonic() < give_up:
        before = time.perf_counter()
        await anyio.sleep(PROBE)
        sleepers.lags.append(time.perf_counter() - before - PROBE)
    sleepers.window_end = time.monotonic()
    return client, started


async def test_fifty_sync_handlers_in_time_sleep_leave_the_event_loop_responsive(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    sleepers = Sleepers()
    client, started = await _fifty_sleepers(sleepers, make_client, workers, conn, sleepers)
    print(sleepers.report())

    # The loop never waited for a handler: a probe that had would have woken a
    # handler's whole sleep late.
    assert max(sleepers.lags) < SLEEP / 2, (
        f"the event loop lagged {max(sleepers.lags):.3f} s behind its probe"
    )
    # Every lease was renewed well within its duration while its handler blocked.
    assert sleepers.longest_unrenewed() < LEASE.total_seconds(), (
        f"a lease went {sleepers.longest_unrenewed():.3f} s without a renewal"
    )
    assert sleepers.most_at_once == SLEEPERS
    await eventually(lambda: _done(client, [s.id for s in started]), what="every job done")
    jobs = [await client.get_job(s.job_id) for s in started]
    assert {job.attempt for job in jobs} == {1}  # no lease lapsed, none ran twice


async def test_control_fifty_sleeps_on_the_event_loop_stall_it_and_its_renewals(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    sleepers = Sleepers()

    async def sleeps_on_the_loop(attempt: Attempt[Num, None]) -> None:
        sleepers(attempt)  # time.sleep on the event loop: the mistake made on purpose

    await _fifty_sleepers(sleeps_on_the_loop, make_client, workers, conn, sleepers)
    print(sleepers.report())

    assert max(sleepers.lags) >= SLEEP / 2
    assert sleepers.longest_unrenewed() >= LEASE.total_seconds()
    assert sleepers.most_at_once == 1


# --- being stopped -------------------------------------------------------------------


class PollsCancelled:
    """A long sync handler that looks at ``attempt.cancelled`` between steps; once
    cancelled it tries one more pgwork call (which raises) and returns. Attempts past
    ``stuck_for`` complete at once."""

    def __init__(self, stuck_for: int = 1) -> None:
        self.stuck_for = stuck_for
        self.running = threading.Event()
        self.give_up = threading.Event()  # the test's own way out (for the controls)
        self.reasons: list[AbortReason | None] = []
        self.raised: list[AttemptCancelledError] = []

    def __call__(self, attempt: SyncAttempt[Num, Total]) -> Total:
        if attempt.job.attempt > self.stuck_for:
            return Total(total=0)
        self.running.set()
        while not attempt.wait_cancelled(0.01):
            if self.give_up.is_set():
                return Total(total=-1)
        self.reasons.append(attempt.cancel_reason)
        try:
            attempt.complete(Total(total=1))
        except AttemptCancelledError as exc:
            self.raised.append(exc)
        return Total(total=1)  # no longer decides the outcome


async def test_a_timed_out_sync_handler_is_told_to_stop_and_its_attempt_fails(
    run_one: RunOne,
) -> None:
    reg = JobTypeRegistry()
    slow = reg.job_type(
        "slow", input=Num, output=Total, timeout=timedelta(milliseconds=300), retry=NO_BACKOFF
    )
    handler = PollsCancelled()
    ran = await run_one(
        reg,
        Num(n=1),
        until=JobStatus.COMPLETED,
        what="the retry completed",
        processors={slow: handler},
    )

    assert handler.reasons == [AbortReason.TIMEOUT]
    [raised] = handler.raised
    assert raised.reason == "timeout"
    assert "complete()" in str(raised)
    job = await ran.job()
    assert job.attempt == 2
    assert job.output == Total(total=0)  # the timed-out attempt's return was not kept
    assert job.last_attempt_error is not None
    assert job.last_attempt_error.type == "builtins.TimeoutError"


class RaisesOnceCancelled(PollsCancelled):
    """``PollsCancelled``, but the stopped attempt lets its ``AttemptCancelledError``
    out, as a handler that does not catch it does."""

    def __call__(self, attempt: SyncAttempt[Num, Total]) -> Total:
        result = super().__call__(attempt)
        if self.raised and attempt.job.attempt <= self.stuck_for:
            raise self.raised[-1]
        return result


async def test_what_a_stopped_sync_handler_raises_is_not_reported_as_never_retrieved(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reported: list[str] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: reported.append(context["message"]))
    reg = JobTypeRegistry()
    slow = reg.job_type(
        "slow", input=Num, output=Total, timeout=timedelta(milliseconds=300), retry=NO_BACKOFF
    )
    handler = RaisesOnceCancelled()
    client = await make_client(reg)
    await workers(client=client, processors={slow: handler})
    started = await client.start_chain(conn, slow, Num(n=1))
    await conn.commit()
    await eventually(lambda: _done(client, [started.id]), what="the retry completed")
    raised = len(handler.raised)
    handler.raised.clear()  # its traceback holds the stopped attempt's future
    gc.collect()

    assert raised == 1
    assert not [m for m in reported if "never retrieved" in m], reported
    loop.set_exception_handler(None)


async def test_a_cancelled_jobs_sync_handler_is_told_to_stop(
    run_one: RunOne, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    slow = reg.job_type("slow", input=Num, output=Total)
    handler = PollsCancelled()
    ran = await run_one(
        reg,
        Num(n=1),
        until=handler.running.is_set,
        what="the handler running",
        processors={slow: handler},
    )
    await ran.client.cancel(conn, [ran.started.job_id])
    await conn.commit()
    await _eventually_true(lambda: bool(handler.raised), what="the handler told to stop")

    assert handler.reasons == [AbortReason.CANCELLED]
    assert handler.raised[0].reason == "cancelled"
    job = await ran.job()
    assert job.status is JobStatus.CANCELLED
    assert job.output is None


async def test_stopping_waits_for_a_sync_handler_then_tells_it_to_stop(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    short = reg.job_type("short", input=Num, output=Total)
    long = reg.job_type("long", input=Num, output=Total)
    finished = threading.Event()

    def a_moment(attempt: SyncAttempt[Num, Total]) -> Total:
        attempt.wait_cancelled(0.5)
        finished.set()
        return Total(total=0 if attempt.cancelled else 5)

    handler = PollsCancelled()
    client = await make_client(reg)
    worker = create_in_process_worker(
        client=client, processors={short: a_moment, long: handler}, poll_interval=0.5
    )
    await worker.start()
    first = await client.start_chain(conn, short, Num(n=1))
    second = await client.start_chain(conn, long, Num(n=1))
    await conn.commit()
    await _eventually_true(handler.running.is_set, what="the long handler running")
    # A graceful stop: the short handler ends within the grace period on its own, the
    # long one is told to stop once it passed, and its job is handed back.
    await worker.stop(grace_period=1.0)

    assert finished.is_set()
    assert (await client.get_chain(first.id)).output == Total(total=5)
    assert handler.reasons == [AbortReason.WORKER_STOPPING]
    job = await client.get_job(second.job_id)
    assert job.status is JobStatus.PENDING
    assert job.attempt == 0  # handed back, no attempt burned


async def test_control_without_the_cancellation_a_sync_handler_is_never_told_to_stop(
    run_one: RunOne, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_SyncAttempt, "_cancel", lambda self: None)
    reg = JobTypeRegistry()
    slow = reg.job_type(
        "slow",
        input=Num,
        output=Total,
        timeout=timedelta(milliseconds=300),
        abandon_after=timedelta(seconds=30),
    )
    handler = PollsCancelled()
    ran = await run_one(
        reg,
        Num(n=1),
        until=handler.running.is_set,
        what="the handler running",
        processors={slow: handler},
        grace_period=0,
    )
    await anyio.sleep(1.0)  # three timeouts long
    assert handler.reasons == []
    assert handler.raised == []
    handler.give_up.set()  # its thread ends (nothing else would end it)

    async def failed() -> bool:
        return (await ran.job()).last_attempt_error is not None

    await eventually(failed, what="the timed-out attempt failed")


# --- given up on ---------------------------------------------------------------------


class Stuck:
    """Ignores being told to stop until the test releases it."""

    def __init__(self) -> None:
        self.running = threading.Event()
        self.release = threading.Event()
        self.ended = threading.Event()

    def __call__(self, attempt: SyncAttempt[Num, Total]) -> Total:
        self.running.set()
        self.release.wait(30)
        self.ended.set()
        return Total(total=-1)


async def _abandon_then_run_another(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> tuple[InProcessWorker, Stuck, Any, Any, list[str]]:
    """One slot, one thread: a stuck sync handler times out and is abandoned, then a
    second sync job is enqueued."""
    reg = JobTypeRegistry()
    stuck_type = reg.job_type(
        "stuck",
        input=Num,
        output=Total,
        timeout=timedelta(milliseconds=200),
        abandon_after=timedelta(milliseconds=300),
        max_attempts=1,
    )
    next_type = reg.job_type("next", input=Num, output=Total)
    stuck = Stuck()
    names: list[str] = []

    def next_handler(attempt: SyncAttempt[Num, Total]) -> Total:
        names.append(threading.current_thread().name)
        return Total(total=attempt.job.input.n)

    client = await make_client(reg)
    worker = await workers(
        client=client,
        worker_id="w-stuck",
        processors={stuck_type: stuck, next_type: next_handler},
        max_slots=1,
    )
    first = await client.start_chain(conn, stuck_type, Num(n=1))
    await conn.commit()
    await _eventually_true(stuck.running.is_set, what="the stuck handler running")

    async def abandoned() -> bool:
        return (await client.get_job(first.job_id)).status is JobStatus.FAILED

    await eventually(abandoned, what="the stuck attempt failed as abandoned")
    second = await client.start_chain(conn, next_type, Num(n=7))
    await conn.commit()
    return worker, stuck, first, second, names


async def test_an_abandoned_sync_handler_frees_its_slot_and_its_thread_is_replaced(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    worker, stuck, first, second, names = await _abandon_then_run_another(
        make_client, workers, conn
    )
    await eventually(lambda: _done(client_of(worker), [second.id]), what="the next job done")

    assert not stuck.ended.is_set()  # it ran while the first thread was still stuck
    assert worker.abandoned_handlers == 1
    assert names == ["pgwork-sync-w-stuck-2"]
    job = await client_of(worker).get_job(first.job_id)
    assert job.last_attempt_error is not None
    assert job.last_attempt_error.type == _type_of(HandlerAbandonedError)

    # Released at last, the stuck thread retires: the pool is back to one thread.
    stuck.release.set()
    await _eventually_true(
        lambda: worker.abandoned_handlers == 0 and stuck.ended.is_set(), what="the stuck one ended"
    )
    await _eventually_true(
        lambda: "pgwork-sync-w-stuck-1" not in {t.name for t in threading.enumerate()},
        what="the stuck thread retired",
    )
    assert {t.name for t in threading.enumerate() if t.name.startswith("pgwork-sync-w-stuck")} == {
        "pgwork-sync-w-stuck-2"
    }


async def test_control_without_the_replacement_the_next_sync_job_waits_for_the_stuck_thread(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(HandlerThreads, "abandon", lambda self, key: None)
    worker, stuck, _, second, names = await _abandon_then_run_another(make_client, workers, conn)
    await anyio.sleep(1.5)
    assert names == []
    assert (await client_of(worker).get_chain(second.id)).status == "active"
    stuck.release.set()  # the thread is free again: the next job runs on it
    await eventually(lambda: _done(client_of(worker), [second.id]), what="the next job done")
    assert names == ["pgwork-sync-w-stuck-1"]


def client_of(worker: InProcessWorker) -> Any:
    return worker.client


# --- refused -------------------------------------------------------------------------


async def test_what_cannot_be_a_handler_is_refused_with_what_to_do(
    make_client: ClientFactory,
) -> None:
    reg = JobTypeRegistry()
    job = reg.job_type("job", input=Num)
    client = await make_client(reg)

    def generator(attempt: SyncAttempt[Num, None]) -> Any:
        yield 1

    async def async_generator(attempt: Attempt[Num, None]) -> Any:
        yield 1

    def says_coroutine(attempt: SyncAttempt[Num, None]) -> Coroutine[Any, Any, None]:
        raise AssertionError("never called")

    refused = {
        "not callable": 42,
        "generator function": generator,
        "generator function ": async_generator,
        "annotated to return something to await": says_coroutine,
    }
    for reason, handler in refused.items():
        with pytest.raises(SyncHandlerError, match=reason.strip()) as caught:
            create_in_process_worker(client=client, processors={job: handler})
        assert caught.value.type_name == "job"


async def test_a_plain_def_middleware_is_refused(make_client: ClientFactory) -> None:
    reg = JobTypeRegistry()
    job = reg.job_type("job", input=Num)
    client = await make_client(reg)

    def handle(attempt: SyncAttempt[Num, None]) -> None:
        return None

    def middleware(attempt: Attempt[Any, Any], call_next: Any) -> Any:
        return call_next(attempt)

    with pytest.raises(SyncHandlerError, match="middleware"):
        create_in_process_worker(client=client, processors={job: handle}, middlewares=[middleware])


async def test_a_def_that_returns_a_coroutine_fails_its_attempt_without_running_it(
    run_one: RunOne,
) -> None:
    reg = JobTypeRegistry()
    job_type = reg.job_type("job", input=Num, max_attempts=1)
    ran: list[int] = []

    async def work(n: int) -> None:
        ran.append(n)

    failed = await run_one(
        reg,
        Num(n=1),
        until=JobStatus.FAILED,
        processors={job_type: lambda attempt: work(attempt.job.input.n)},
    )
    job = await failed.job()
    assert job.last_attempt_error is not None
    assert job.last_attempt_error.type == _type_of(SyncHandlerError)
    assert "returned an awaitable" in job.last_attempt_error.message
    assert ran == []


async def test_middlewares_wrap_a_sync_handler_on_the_event_loop(run_one: RunOne) -> None:
    reg = JobTypeRegistry()
    job_type = reg.job_type("job", input=Num, output=Total)
    where: list[str] = []

    async def middleware(attempt: Attempt[Any, Any], call_next: Any) -> Any:
        where.append(f"before {threading.current_thread().name}")
        result = await call_next(attempt)
        where.append(f"after {type(result).__name__}")
        return result

    def handle(attempt: SyncAttempt[Num, Total]) -> Total:
        where.append("handler on " + threading.current_thread().name.split("-")[1])
        return Total(total=1)

    await run_one(
        reg,
        Num(n=1),
        until=JobStatus.COMPLETED,
        processors={job_type: handle},
        middlewares=[middleware],
    )
    assert where == ["before MainThread", "handler on sync", "after Total"]
