"""The in-process worker: slots, outcomes, retries, middlewares, leases and stopping."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import anyio
import anyio.lowlevel
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    AbortReason,
    Attempt,
    ChainStart,
    ContinuationNotAllowedError,
    Continue,
    JobStatus,
    JobTypeRegistry,
    LogContextFilter,
    RetryPolicy,
    WorkerStateError,
    create_in_process_worker,
    log_context,
)
from pgwork.observability import LEASE_LOST

from .conftest import ClientFactory, HangUntilAborted, eventually, scalar

pytestmark = pytest.mark.anyio


class Num(BaseModel):
    n: int


class Total(BaseModel):
    total: int


async def _status(client: Any, job_id: Any) -> JobStatus:
    return (await client.get_job(job_id)).status


async def test_returned_value_completes_the_job_and_its_chain(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    square = reg.job_type("square", input=Num, output=Total)

    async def handle(attempt: Attempt[Num, Total]) -> Total:
        return Total(total=attempt.job.input.n**2)

    client = await make_client(reg)
    await workers(client=client, processors={square: handle})
    started = await client.start_chain(conn, square, Num(n=7))
    await conn.commit()

    async def done() -> bool:
        return (await client.get_chain(started.id)).status == "completed"

    await eventually(done, what="chain completed")
    chain = await client.get_chain(started.id)
    assert chain.output == Total(total=49)
    job = await client.get_job(started.job_id)
    assert job.status is JobStatus.COMPLETED
    assert job.attempt == 1
    assert job.output == Total(total=49)


async def test_continue_with_runs_the_next_job_in_the_same_chain(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    add = reg.job_type("add", input=Num, output=Total, continue_with=["double"])
    double = reg.job_type("double", input=Total, output=Total, entry=False)

    async def handle_add(attempt: Attempt[Num, Total]) -> None:
        await attempt.complete(continue_with=Continue(double, Total(total=attempt.job.input.n + 1)))

    async def handle_double(attempt: Attempt[Total, Total]) -> Total:
        return Total(total=attempt.job.input.total * 2)

    client = await make_client(reg)
    await workers(client=client, processors={add: handle_add, double: handle_double})
    started = await client.start_chain(conn, add, Num(n=4))
    await conn.commit()

    async def done() -> bool:
        return (await client.get_chain(started.id)).status == "completed"

    await eventually(done, what="two-step chain completed")
    jobs = await client.list_chain_jobs(started.id)
    assert [(j.type_name, j.chain_index, j.status) for j in jobs] == [
        ("add", 0, JobStatus.COMPLETED),
        ("double", 1, JobStatus.COMPLETED),
    ]
    assert (await client.get_chain(started.id)).output == Total(total=10)


async def test_two_workers_with_ten_slots_run_each_of_2000_jobs_exactly_once(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    await conn.execute("CREATE TABLE ledger (job_id uuid, worker text)")
    await conn.commit()
    reg = JobTypeRegistry()
    work = reg.job_type("work", input=Num)
    client = await make_client(reg)

    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as ledger:
        lock = anyio.Lock()

        async def handle(attempt: Attempt[Num, Any]) -> None:
            async with lock:  # one ledger connection shared by both workers' slots
                await ledger.execute(
                    "INSERT INTO ledger VALUES (%s, %s)", (attempt.job.id, attempt.worker_id)
                )

        await client.start_chains(conn, [ChainStart(work, Num(n=i)) for i in range(2000)])
        await conn.commit()
        await workers(client=client, processors={work: handle}, max_slots=10, worker_id="w1")
        await workers(client=client, processors={work: handle}, max_slots=10, worker_id="w2")

        async def drained() -> bool:
            return await scalar(pgwork_dsn, "SELECT count(*) FROM ledger") >= 2000

        await eventually(drained, timeout=60, what="2000 executions")
        await eventually(
            lambda: _count(pgwork_dsn, "status = 'completed'", 2000), what="all completed"
        )
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM ledger") == 2000
    assert await scalar(pgwork_dsn, "SELECT count(DISTINCT job_id) FROM ledger") == 2000
    assert await scalar(pgwork_dsn, "SELECT count(DISTINCT worker) FROM ledger") == 2


async def _count(dsn: str, where: str, expected: int) -> bool:
    return await scalar(dsn, f"SELECT count(*) FROM pgwork.jobs WHERE {where}") == expected


async def test_failures_retry_on_the_backoff_formula_then_fail_for_good(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    policy = RetryPolicy(
        initial=timedelta(milliseconds=200), multiplier=2.0, maximum=timedelta(milliseconds=500)
    )
    flaky = reg.job_type("flaky", input=Num, retry=policy, max_attempts=4)
    client = await make_client(reg)
    observed: list[tuple[int, float]] = []

    async def handle(attempt: Attempt[Num, Any]) -> None:
        job = await client.get_job(attempt.job.id)
        if job.last_attempt_at is not None:
            # Written by one statement with one now(): the gap is exactly the delay.
            observed.append((job.attempt, (job.scheduled_at - job.last_attempt_at).total_seconds()))
        raise ValueError(f"boom on attempt {attempt.job.attempt}")

    await workers(client=client, processors={flaky: handle}, poll_interval=0.05)
    started = await client.start_chain(conn, flaky, Num(n=1))
    await conn.commit()

    async def failed() -> bool:
        return await _status(client, started.job_id) is JobStatus.FAILED

    await eventually(failed, what="terminal failure")
    # delay after attempt k = min(0.2 * 2**(k-1), 0.5)
    assert observed == [(2, 0.2), (3, 0.4), (4, 0.5)]
    job = await client.get_job(started.job_id)
    assert job.attempt == 4
    assert job.completed_at is not None
    assert job.last_attempt_error is not None
    assert job.last_attempt_error.type == "builtins.ValueError"
    assert job.last_attempt_error.message == "boom on attempt 4"
    assert "Traceback" in (job.last_attempt_error.traceback or "")
    assert (await client.get_chain(started.id)).status == "failed"


async def test_a_continuation_the_registry_forbids_fails_the_job_without_retries(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    # Attempts to spare and no backoff: only the error's kind stops a retry.
    first = reg.job_type(
        "first", input=Num, max_attempts=5, retry=RetryPolicy(initial=timedelta(0))
    )
    other = reg.job_type("other", input=Num)
    client = await make_client(reg)

    async def handle(attempt: Attempt[Num, Any]) -> Any:
        return Continue(other, Num(n=1))

    await workers(client=client, processors={first: handle})
    started = await client.start_chain(conn, first, Num(n=1))
    await conn.commit()
    await eventually(
        lambda: _is(client, started.job_id, JobStatus.FAILED), what="failed continuation"
    )
    job = await client.get_job(started.job_id)
    assert job.last_attempt_error is not None
    assert job.last_attempt_error.type.endswith(ContinuationNotAllowedError.__name__)
    assert "'first'" in job.last_attempt_error.message
    assert "'other'" in job.last_attempt_error.message
    assert "Add it to continue_with=[...]" in job.last_attempt_error.message
    assert job.attempt == 1
    assert len(await client.list_chain_jobs(started.id)) == 1


async def _is(client: Any, job_id: Any, status: JobStatus) -> bool:
    return await _status(client, job_id) is status


async def test_an_output_that_fails_its_model_fails_the_attempt(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    typed = reg.job_type("typed", input=Num, output=Total, max_attempts=1)
    client = await make_client(reg)

    async def handle(attempt: Attempt[Num, Total]) -> Any:
        return {"total": "not a number"}

    await workers(client=client, processors={typed: handle})
    started = await client.start_chain(conn, typed, Num(n=1))
    await conn.commit()
    await eventually(lambda: _is(client, started.job_id, JobStatus.FAILED), what="failure")
    job = await client.get_job(started.job_id)
    assert job.last_attempt_error is not None
    assert job.last_attempt_error.type.endswith("PayloadValidationError")


async def test_reschedule_from_a_handler_runs_it_again_later_without_counting(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    poll = reg.job_type("poll", input=Num, output=Total)
    client = await make_client(reg)
    seen: list[int] = []

    async def handle(attempt: Attempt[Num, Total]) -> Total | None:
        seen.append(attempt.job.attempt)
        if len(seen) < 3:
            await attempt.reschedule(after=timedelta(milliseconds=50))
            return None
        return Total(total=len(seen))

    await workers(client=client, processors={poll: handle}, poll_interval=0.05)
    started = await client.start_chain(conn, poll, Num(n=1))
    await conn.commit()
    await eventually(lambda: _is(client, started.job_id, JobStatus.COMPLETED), what="completion")
    assert seen == [1, 1, 1]
    assert (await client.get_job(started.job_id)).output == Total(total=3)


async def test_middlewares_wrap_each_attempt_first_declared_outermost(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    job = reg.job_type("job", input=Num)
    client = await make_client(reg)
    events: list[str] = []
    finished = anyio.Event()

    def recorder(name: str) -> Any:
        async def middleware(attempt: Attempt[Any, Any], call_next: Any) -> Any:
            events.append(f"{name}:before")
            try:
                return await call_next(attempt)
            finally:
                events.append(f"{name}:after")
                if name == "outer":
                    finished.set()

        return middleware

    async def handle(attempt: Attempt[Num, Any]) -> None:
        events.append("handler")

    await workers(
        client=client, processors={job: handle}, middlewares=[recorder("outer"), recorder("inner")]
    )
    await client.start_chain(conn, job, Num(n=1))
    await conn.commit()
    with anyio.fail_after(10):
        await finished.wait()
    assert events == ["outer:before", "inner:before", "handler", "inner:after", "outer:after"]


async def test_log_context_middleware_puts_the_attempt_on_log_records(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    job = reg.job_type("logged", input=Num)
    client = await make_client(reg)
    records: list[logging.LogRecord] = []
    logged = anyio.Event()

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    app_log = logging.getLogger("tests.app")
    collector = Collect()
    collector.addFilter(LogContextFilter())
    app_log.addHandler(collector)
    app_log.setLevel(logging.INFO)

    async def handle(attempt: Attempt[Num, Any]) -> None:
        app_log.info("working on it")
        logged.set()

    try:
        await workers(
            client=client, processors={job: handle}, middlewares=[log_context], worker_id="w-log"
        )
        started = await client.start_chain(conn, job, Num(n=1))
        await conn.commit()
        with anyio.fail_after(10):
            await logged.wait()
        app_log.info("outside any attempt")
    finally:
        app_log.removeHandler(collector)
    inside, outside = records
    assert inside.job_id == str(started.job_id)  # type: ignore[attr-defined]
    assert inside.job_type == "logged"  # type: ignore[attr-defined]
    assert inside.attempt == 1
    assert inside.worker_id == "w-log"
    assert outside.job_id == "-"  # type: ignore[attr-defined]


async def test_stop_hands_in_flight_jobs_back_without_burning_an_attempt(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    stuck = reg.job_type("stuck", input=Num)
    client = await make_client(reg)
    handle = HangUntilAborted()
    running, reasons = handle.running, handle.reasons

    worker = create_in_process_worker(
        client=client, processors={stuck: handle}, grace_period=0.2, poll_interval=0.1
    )
    stop = await worker.start()
    started = await client.start_chain(conn, stuck, Num(n=1))
    await conn.commit()
    with anyio.fail_after(10):
        await running.wait()
    await stop()
    await stop()  # a second stop is safe and returns at once
    assert reasons == [AbortReason.WORKER_STOPPING]
    job = await client.get_job(started.job_id)
    assert job.status is JobStatus.PENDING
    assert job.attempt == 0
    assert job.leased_by is None


async def test_stop_lets_in_flight_attempts_finish_within_the_grace_period(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    """The handler is released only once the stopping worker has reported, in two
    heartbeats, that it is stopping with the attempt still running: a stop that
    ignored the grace period would have aborted it by then."""
    reg = JobTypeRegistry()
    slow = reg.job_type("slow", input=Num)
    client = await make_client(reg)
    running = anyio.Event()
    release = anyio.Event()
    aborted: list[Any] = []

    async def handle(attempt: Attempt[Num, Any]) -> str:
        running.set()
        try:
            await release.wait()
        except BaseException:
            aborted.append(attempt.abort_reason)
            raise
        return "finished"

    worker = create_in_process_worker(
        client=client, processors={slow: handle}, grace_period=30, heartbeat_interval=0.05
    )
    beats: set[Any] = set()

    async def stopping_with_the_attempt_running_twice() -> bool:
        if aborted:
            return True
        (me,) = await client.list_workers()
        if (me.status, me.active_slots) == ("stopping", 1):
            beats.add(me.heartbeat_at)
        return len(beats) >= 2

    async with worker:
        started = await client.start_chain(conn, slow, Num(n=1))
        await conn.commit()
        with anyio.fail_after(10):
            await running.wait()
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.stop)
            await eventually(
                stopping_with_the_attempt_running_twice,
                timeout=10,
                what="two heartbeats of a stopping worker with its attempt running",
            )
            assert aborted == [], "stop() aborted the attempt instead of waiting"
            release.set()
    assert aborted == []
    job = await client.get_job(started.job_id)
    assert job.status is JobStatus.COMPLETED
    assert job.output == "finished"


async def test_a_worker_cannot_be_started_twice(make_client: ClientFactory) -> None:
    reg = JobTypeRegistry()
    job = reg.job_type("job", input=Num)
    client = await make_client(reg)

    async def handle(attempt: Attempt[Num, Any]) -> None:
        return None

    worker = create_in_process_worker(client=client, processors={job: handle})
    stop = await worker.start()
    try:
        with pytest.raises(WorkerStateError):
            await worker.start()
    finally:
        await stop()
    with pytest.raises(WorkerStateError):
        await worker.run()


async def test_lost_lease_aborts_the_handler(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    reg = JobTypeRegistry()
    long = reg.job_type("long", input=Num, lease=timedelta(milliseconds=600))
    client = await make_client(reg)
    handle = HangUntilAborted()
    running, aborted, reasons = handle.running, handle.aborted, handle.reasons

    await workers(client=client, processors={long: handle})
    started = await client.start_chain(conn, long, Num(n=1))
    await conn.commit()
    with anyio.fail_after(10):
        await running.wait()
    # Another holder takes the job over (as a reaper and a second worker would).
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as other:
        await other.execute(
            "UPDATE pgwork.jobs SET lease_token = gen_random_uuid(), leased_by = 'thief', "
            "leased_until = now() + interval '1 hour' WHERE id = %s",
            (started.job_id,),
        )
    with anyio.fail_after(10):
        await aborted.wait()
    assert reasons == [AbortReason.OWNERSHIP_LOST]
    job = await client.get_job(started.job_id)
    assert job.status is JobStatus.RUNNING
    assert job.leased_by == "thief"


async def test_expired_lease_is_reaped_and_the_job_runs_again(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    reg = JobTypeRegistry()
    job_type = reg.job_type("job", input=Num, output=Total)
    client = await make_client(reg)
    started = await client.start_chain(conn, job_type, Num(n=5))
    await conn.commit()
    # A worker that died holding the job: running, attempt 1, lease long expired.
    await conn.execute(
        "UPDATE pgwork.jobs SET status = 'running', attempt = 1, leased_by = 'dead', "
        "lease_token = gen_random_uuid(), leased_until = now() - interval '1 minute' "
        "WHERE id = %s",
        (started.job_id,),
    )
    await conn.commit()

    async def handle(attempt: Attempt[Num, Total]) -> Total:
        return Total(total=attempt.job.attempt)

    await workers(client=client, processors={job_type: handle})
    await eventually(lambda: _is(client, started.job_id, JobStatus.COMPLETED), what="rerun")
    job = await client.get_job(started.job_id)
    assert job.attempt == 2
    assert job.output == Total(total=2)


async def test_atomic_attempt_commits_the_handlers_writes_with_its_completion(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    await conn.execute("CREATE TABLE effects (n int)")
    await conn.commit()
    reg = JobTypeRegistry()
    pay = reg.job_type(
        "pay",
        input=Num,
        mode="atomic",
        max_attempts=2,
        retry=RetryPolicy(initial=timedelta(0), maximum=timedelta(0)),
    )
    client = await make_client(reg)
    attempts: list[int] = []

    async def handle(attempt: Attempt[Num, Any]) -> None:
        attempts.append(attempt.job.attempt)
        await attempt.connection.execute("INSERT INTO effects VALUES (%s)", (attempt.job.attempt,))
        if attempt.job.attempt == 1:
            raise RuntimeError("crash after writing")

    await workers(client=client, processors={pay: handle}, poll_interval=0.05)
    started = await client.start_chain(conn, pay, Num(n=1))
    await conn.commit()
    await eventually(lambda: _is(client, started.job_id, JobStatus.COMPLETED), what="completion")
    assert attempts == [1, 2]
    # The first attempt's write was rolled back with it; the second committed.
    assert await scalar(pgwork_dsn, "SELECT array_agg(n) FROM effects") == [2]


async def test_atomic_completion_refused_in_its_own_transaction_commits_nothing(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    await conn.execute("CREATE TABLE effects (n int)")
    await conn.commit()
    reg = JobTypeRegistry()
    pay = reg.job_type("pay", input=Num, mode="atomic")
    client = await make_client(reg)
    lost = anyio.Event()
    actions: list[str] = []

    class Observer:
        def on_event(self, event: Any) -> None:
            if event.name == LEASE_LOST:
                actions.append(event["action"])
                lost.set()

    async def handle(attempt: Attempt[Num, Any]) -> None:
        await attempt.connection.execute("INSERT INTO effects VALUES (1)")
        # The row lock cannot stop the attempt's own transaction from moving the job
        # on: its completion, sent with the COMMIT, is then refused.
        await attempt.connection.execute(
            "UPDATE pgwork.jobs SET lease_token = gen_random_uuid() WHERE id = %s",
            (attempt.job.id,),
        )

    await workers(client=client, processors={pay: handle}, observers=[Observer()])
    started = await client.start_chain(conn, pay, Num(n=1))
    await conn.commit()
    with anyio.fail_after(10):
        await lost.wait()
    assert actions == ["completion"]
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM effects") == 0
    job = await client.get_job(started.job_id)
    assert job.status is JobStatus.RUNNING
    assert job.output is None


async def _failed(client: Any, job_id: Any) -> Any:
    """Wait until the job failed; its last attempt's error."""
    await eventually(lambda: _is(client, job_id, JobStatus.FAILED), what="timeout")
    job = await client.get_job(job_id)
    assert job.last_attempt_error is not None
    return job.last_attempt_error


async def test_atomic_attempt_past_its_deadline_is_rolled_back_and_retried(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    reg = JobTypeRegistry()
    hang = reg.job_type(
        "hang", input=Num, mode="atomic", timeout=timedelta(milliseconds=300), max_attempts=1
    )
    client = await make_client(reg)

    async def handle(attempt: Attempt[Num, Any]) -> None:
        await attempt.connection.execute("SELECT 1")
        await anyio.sleep_forever()

    await workers(client=client, processors={hang: handle})
    started = await client.start_chain(conn, hang, Num(n=1))
    await conn.commit()
    error = await _failed(client, started.job_id)
    assert error.type.endswith("TimeoutError")


async def test_staged_handler_past_its_timeout_fails_with_a_timeout_error(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    hang = reg.job_type("hang", input=Num, timeout=timedelta(milliseconds=200), max_attempts=1)
    client = await make_client(reg)

    async def handle(attempt: Attempt[Num, Any]) -> None:
        await anyio.sleep_forever()

    await workers(client=client, processors={hang: handle})
    started = await client.start_chain(conn, hang, Num(n=1))
    await conn.commit()
    error = await _failed(client, started.job_id)
    assert error.type == "builtins.TimeoutError"


async def test_a_handler_that_swallows_its_timeout_and_returns_completes_with_its_result(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    """As with ``anyio.fail_after``: a timeout is a failure only when the handler ended by
    its cancellation."""
    reg = JobTypeRegistry()
    slow = reg.job_type("slow", input=Num, timeout=timedelta(milliseconds=100))
    client = await make_client(reg)

    async def handle(attempt: Attempt[Num, Any]) -> str:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            return "caught"
        return "unreachable"

    await workers(client=client, processors={slow: handle})
    started = await client.start_chain(conn, slow, Num(n=1))
    await conn.commit()
    await eventually(lambda: _is(client, started.job_id, JobStatus.COMPLETED), what="completed")
    job = await client.get_job(started.job_id)
    assert (job.attempt, job.output) == (1, "caught")


async def test_a_job_type_no_processor_handles_is_never_acquired(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    known = reg.job_type("known", input=Num)
    orphan = reg.job_type("orphan", input=Num)
    client = await make_client(reg)
    handled = anyio.Event()

    async def handle(attempt: Attempt[Num, Any]) -> None:
        handled.set()

    await workers(client=client, processors={known: handle})
    lonely = await client.start_chain(conn, orphan, Num(n=1))
    await client.start_chain(conn, known, Num(n=1))
    await conn.commit()
    with anyio.fail_after(10):
        await handled.wait()
    job = await client.get_job(lonely.job_id)
    assert job.status is JobStatus.PENDING
    assert job.attempt == 0


async def test_a_worker_cancelled_from_outside_cancels_its_running_handlers(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    hang_type = reg.job_type("hang", input=Num)
    hang = HangUntilAborted()
    client = await make_client(reg)
    worker = create_in_process_worker(
        client=client, processors={hang_type: hang}, poll_interval=0.2
    )
    await client.start_chain(conn, hang_type, Num(n=1))
    await conn.commit()

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(worker.run)
            await hang.running.wait()
            group.cancel_scope.cancel()
        # run() returned only after the handler it started had ended.
        assert hang.aborted.is_set()


async def test_a_staged_slot_takes_its_next_job_while_the_last_outcome_is_written(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """With one slot (and no prefetch), a job's completion goes out with the acquire of
    the next one: every job runs, in order, and no turn needs a statement of its own to
    complete."""
    reg = JobTypeRegistry()
    step = reg.job_type("step", input=Num)
    seen: list[int] = []

    async def handle(attempt: Attempt[Num, None]) -> None:
        seen.append(attempt.job.input.n)

    client = await make_client(reg)
    calls: list[tuple[int, int]] = []
    real = client.state.complete_and_acquire

    async def counting(**kwargs: Any) -> Any:
        results, acquired = await real(**kwargs)
        calls.append((len(kwargs["completions"]), len(acquired)))
        return results, acquired

    client.state.complete_and_acquire = counting  # type: ignore[method-assign]
    await client.start_chains(conn, [ChainStart(step, Num(n=n)) for n in range(5)])
    await conn.commit()
    await workers(client=client, processors={step: handle}, max_slots=1, prefetch=0)

    async def all_done() -> bool:
        done = "SELECT count(*) FROM pgwork.jobs WHERE status = 'completed'"
        return bool(await scalar(pgwork_dsn, done) == 5)

    await eventually(all_done, what="five jobs completed")
    assert seen == [0, 1, 2, 3, 4]
    # Every acquire counted, empty ones too: the first brought job 0; jobs 0..3 were
    # each completed by the acquire that brought the next job; job 4's completion went
    # with an acquire that found the queue empty, and none followed it.
    assert calls == [(0, 1), *[(1, 1)] * 4, (1, 0)]


async def test_with_more_than_200_slots_one_write_completes_a_job_of_every_slot(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """The completions a turn (or the batcher alone) writes at once are bounded by the
    worker's slots, not by a fixed 200: 300 handlers that return together are completed
    by one statement (above 200 at least), where a cap of 200 split them and cost a
    second write."""
    reg = JobTypeRegistry()
    step = reg.job_type("step", input=Num)
    started = 0
    all_started, release = anyio.Event(), anyio.Event()

    async def handle(attempt: Attempt[Num, None]) -> None:
        nonlocal started
        started += 1
        if started == 300:
            all_started.set()
        await release.wait()

    client = await make_client(reg)
    written: list[int] = []
    turn, alone = client.state.complete_and_acquire, client.state.complete

    async def counted_turn(**kwargs: Any) -> Any:
        if kwargs["completions"]:
            written.append(len(kwargs["completions"]))
        return await turn(**kwargs)

    async def counted_alone(tx: Any, **kwargs: Any) -> Any:
        written.append(len(kwargs["completions"]))
        return await alone(tx, **kwargs)

    client.state.complete_and_acquire = counted_turn  # type: ignore[method-assign]
    client.state.complete = counted_alone  # type: ignore[method-assign]
    await client.start_chains(conn, [ChainStart(step, Num(n=i)) for i in range(300)])
    await conn.commit()
    await workers(client=client, processors={step: handle}, max_slots=300, prefetch=0)
    with anyio.fail_after(20):
        await all_started.wait()
    release.set()

    async def all_done() -> bool:
        done = "SELECT count(*) FROM pgwork.jobs WHERE status = 'completed'"
        return bool(await scalar(pgwork_dsn, done) == 300)

    await eventually(all_done, what="300 jobs completed")
    # Usually one write of 300 (a cap of 200 wrote [100, 200]); a busy machine may
    # split them where the batcher's 2 ms delay ends, but never at 200.
    assert sum(written) == 300
    assert max(written) > 200, written


async def test_a_staged_slot_task_ends_once_its_completion_is_queued_and_the_job_stays_held(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """A plain completion is left with the batcher and its slot's task ends at once (no
    task waits for the write); the job still counts as held until the write commits,
    and is let go (and reported) after it."""
    reg = JobTypeRegistry()
    step = reg.job_type("step", input=Num)
    returned = anyio.Event()

    async def handle(attempt: Attempt[Num, None]) -> None:
        returned.set()

    client = await make_client(reg)
    release = anyio.Event()
    real = client.state.complete_and_acquire

    async def gated(**kwargs: Any) -> Any:
        if kwargs["completions"]:
            await release.wait()  # the completion's write is held up here
        return await real(**kwargs)

    client.state.complete_and_acquire = gated  # type: ignore[method-assign]
    await client.start_chain(conn, step, Num(n=1))
    await conn.commit()
    worker = await workers(client=client, processors={step: handle}, max_slots=1, prefetch=0)
    try:
        with anyio.fail_after(10):
            await returned.wait()
            await worker._slots.tasks.wait()  # the slot's task ended
        assert worker.active_slots == 1  # held: its completion is not written yet
    finally:
        release.set()

    async def completed() -> bool:
        done = "SELECT count(*) FROM pgwork.jobs WHERE status = 'completed'"
        return bool(await scalar(pgwork_dsn, done) == 1)

    await eventually(completed, what="the job completed")

    async def let_go() -> bool:
        return worker.active_slots == 0

    await eventually(let_go, what="the job let go")


def test_tune_gc_freezes_the_loaded_objects_and_raises_the_young_threshold() -> None:
    """``pgwork worker`` calls it once the application is loaded (docs/performance.md):
    what exists then is no longer walked by the collector, and young objects are
    collected every 10,000 allocations instead of 700."""
    import gc

    from pgwork.worker import tune_gc

    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    try:
        tune_gc()
        assert gc.get_freeze_count() > frozen
        assert gc.get_threshold() == (10_000, before[1], before[2])
        with pytest.raises(ValueError, match="young_threshold"):
            tune_gc(young_threshold=0)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
