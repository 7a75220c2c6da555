"""What the client and the worker emit to observers, and stopping fast."""

from __future__ import annotations

import contextvars
import logging
from datetime import timedelta
from typing import Any

import anyio
import anyio.lowlevel
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    Attempt,
    ChainStart,
    JobStatus,
    JobTypeRegistry,
    PostgresStateAdapter,
    RetryPolicy,
    create_client,
    create_in_process_worker,
)
from pgwork.observability import (
    ATTEMPT_ABORTED,
    ATTEMPT_COMPLETED,
    ATTEMPT_FAILED,
    ATTEMPT_RETRIED,
    ATTEMPT_STARTED,
    JOB_ENQUEUED,
    WORKER_STARTED,
    WORKER_STOPPED,
    Event,
    LoggingObserver,
)

from .conftest import ClientFactory, eventually

pytestmark = pytest.mark.anyio


class Num(BaseModel):
    n: int


class Recorder:
    """An observer keeping every event; ``wait_for`` blocks until one arrives."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._arrived = anyio.Event()

    def on_event(self, event: Event) -> None:
        self.events.append(event)
        self._arrived.set()
        self._arrived = anyio.Event()

    def named(self, name: str) -> list[Event]:
        return [e for e in self.events if e.name == name]

    async def wait_for(self, name: str, count: int = 1) -> list[Event]:
        with anyio.fail_after(20):
            while len(self.named(name)) < count:
                await self._arrived.wait()
        return self.named(name)


def _registry() -> tuple[JobTypeRegistry, Any, Any]:
    reg = JobTypeRegistry()
    ok = reg.job_type("ok", input=Num, output=Num)
    fast = RetryPolicy(initial=timedelta(milliseconds=10))
    flaky = reg.job_type("flaky", input=Num, output=Num, max_attempts=2, retry=fast)
    return reg, ok, flaky


async def test_a_completed_attempt_emits_enqueued_started_completed(
    pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg, ok, _ = _registry()
    recorder = Recorder()
    state = await PostgresStateAdapter.connect(pgwork_dsn)
    client = create_client(state_adapter=state, registry=reg, observers=[recorder])

    async def handle(attempt: Attempt[Num, Num]) -> Num:
        return Num(n=attempt.job.input.n + 1)

    try:
        started = await client.start_chain(conn, ok, Num(n=1))
        await conn.commit()
        worker = create_in_process_worker(client=client, processors={ok: handle})
        async with worker:
            await recorder.wait_for(ATTEMPT_COMPLETED)
    finally:
        await client.close()

    names = [e.name for e in recorder.events]
    assert names == [
        JOB_ENQUEUED,
        WORKER_STARTED,
        ATTEMPT_STARTED,
        ATTEMPT_COMPLETED,
        WORKER_STOPPED,
    ]
    enqueued, _, began, completed, stopped = recorder.events
    assert enqueued["job_id"] == started.job_id
    assert enqueued["deduplicated"] is False
    assert began["job_type"] == "ok"
    assert began["attempt"] == 1
    assert began["mode"] == "staged"
    assert began["queued_s"] >= 0
    assert completed["outcome"] == "completed"
    assert completed["duration_s"] >= 0
    assert completed["lease_token"] == began["lease_token"]
    assert stopped["worker_id"] == worker.worker_id
    assert stopped["error"] is None


async def test_a_failing_job_emits_retried_then_failed(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg, _, flaky = _registry()
    recorder = Recorder()
    client = await make_client(reg)

    async def handle(attempt: Attempt[Num, Num]) -> Num:
        raise ValueError(f"boom {attempt.job.attempt}")

    await client.start_chain(conn, flaky, Num(n=1))
    await conn.commit()
    await workers(client=client, processors={flaky: handle}, observers=[recorder])

    (failed,) = await recorder.wait_for(ATTEMPT_FAILED)
    (retried,) = recorder.named(ATTEMPT_RETRIED)
    assert retried["attempt"] == 1
    assert retried["error_type"] == "builtins.ValueError"
    assert retried["error_message"] == "boom 1"
    assert retried["retry_in_s"] == pytest.approx(0.01)
    assert failed["attempt"] == 2
    assert failed["settled"] is True


async def test_observers_empty_emits_nothing_and_a_raising_observer_breaks_nothing(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    reg, ok, _ = _registry()
    client = await make_client(reg)

    class Broken:
        def on_event(self, event: Event) -> None:
            raise RuntimeError("observer bug")

    recorder = Recorder()

    async def handle(attempt: Attempt[Num, Num]) -> Num:
        return attempt.job.input

    started = await client.start_chain(conn, ok, Num(n=3))
    await conn.commit()
    with caplog.at_level(logging.ERROR, logger="pgwork.observability"):
        await workers(client=client, processors={ok: handle}, observers=[Broken(), recorder])
        await recorder.wait_for(ATTEMPT_COMPLETED)

    assert (await client.get_job(started.job_id)).status is JobStatus.COMPLETED
    assert "observer bug" in caplog.text

    silent = create_in_process_worker(client=client, processors={ok: handle}, observers=[])
    assert not silent._events


async def test_logging_observer_is_the_default_and_logs_structured_fields(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    reg, ok, _ = _registry()
    client = await make_client(reg)
    assert [type(o) for o in client.observers] == [LoggingObserver]
    recorder = Recorder()

    async def handle(attempt: Attempt[Num, Num]) -> Num:
        return attempt.job.input

    with caplog.at_level(logging.DEBUG, logger="pgwork.events"):
        started = await client.start_chain(conn, ok, Num(n=3))
        await conn.commit()
        await workers(
            client=client, processors={ok: handle}, observers=[*client.observers, recorder]
        )
        await recorder.wait_for(ATTEMPT_COMPLETED)

    records = {r.event: r for r in caplog.records if r.name == "pgwork.events"}  # type: ignore[attr-defined]
    assert records[JOB_ENQUEUED].levelno == logging.DEBUG
    assert records[JOB_ENQUEUED].job_id == started.job_id  # type: ignore[attr-defined]
    assert records[WORKER_STARTED].levelno == logging.INFO
    done = records[ATTEMPT_COMPLETED]
    assert done.job_type == "ok"  # type: ignore[attr-defined]
    assert done.getMessage().startswith("pgwork attempt.completed job_id=")


async def test_stop_with_zero_grace_aborts_running_attempts_and_releases_their_jobs(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg, ok, _ = _registry()
    client = await make_client(reg)
    recorder = Recorder()
    entered = anyio.Event()

    async def handle(attempt: Attempt[Num, Num]) -> Num:
        entered.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    started = await client.start_chain(conn, ok, Num(n=1))
    await conn.commit()
    worker = await workers(
        client=client, processors={ok: handle}, grace_period=60, observers=[recorder]
    )
    with anyio.fail_after(20):
        await entered.wait()
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.stop)  # graceful: would wait 60 s
            await anyio.lowlevel.checkpoint()
            await worker.stop(grace_period=0)

    (aborted,) = recorder.named(ATTEMPT_ABORTED)
    assert aborted["reason"] == "worker_stopping"
    assert aborted["released"] is True
    job = await client.get_job(started.job_id)
    assert job.status is JobStatus.PENDING

    async def attempt_not_burned() -> bool:
        return (await client.get_job(started.job_id)).attempt == 0

    await eventually(attempt_not_burned, what="released job keeps its attempt count")


class Choosy(Recorder):
    """Says which events it wants; the others must not even reach ``on_event``."""

    def __init__(self, *wanted: str) -> None:
        super().__init__()
        self.wanted = set(wanted)

    def wants(self, name: str) -> bool:
        return name in self.wanted


async def test_events_no_observer_wants_are_not_delivered_and_the_logger_level_decides(
    pgwork_dsn: str, conn: psycopg.AsyncConnection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    reg, ok, _ = _registry()
    choosy = Choosy(ATTEMPT_COMPLETED, WORKER_STOPPED)
    state = await PostgresStateAdapter.connect(pgwork_dsn)
    client = create_client(state_adapter=state, registry=reg, observers=[choosy])

    async def handle(attempt: Attempt[Num, Num]) -> Num:
        return attempt.job.input

    try:
        await client.start_chain(conn, ok, Num(n=1))
        await conn.commit()
        async with create_in_process_worker(client=client, processors={ok: handle}):
            await choosy.wait_for(ATTEMPT_COMPLETED)
    finally:
        await client.close()
    assert [e.name for e in choosy.events] == [ATTEMPT_COMPLETED, WORKER_STOPPED]

    observer = LoggingObserver()
    caplog.set_level(logging.INFO, logger="pgwork.events")
    assert not observer.wants(ATTEMPT_STARTED)  # DEBUG
    assert observer.wants(ATTEMPT_FAILED)
    assert observer.wants(ATTEMPT_ABORTED)  # a released abort logs at INFO
    caplog.set_level(logging.DEBUG, logger="pgwork.events")
    assert observer.wants(ATTEMPT_STARTED)


class ContextSetter:
    """An observer that makes something current for the attempt, as a tracing observer
    makes its span current: set at the attempt's start, reset with its token at the end.
    Resetting from another context than the one that set it raises (``ValueError``)."""

    current: contextvars.ContextVar[str | None] = contextvars.ContextVar(
        "pgwork_test_attempt", default=None
    )

    def __init__(self) -> None:
        self.tokens: dict[Any, contextvars.Token[str | None]] = {}
        self.errors: list[BaseException] = []
        self.reset = 0

    def on_event(self, event: Event) -> None:
        key = (event.fields.get("job_id"), event.fields.get("lease_token"))
        if event.name == ATTEMPT_STARTED:
            self.tokens[key] = self.current.set(str(event["job_id"]))
        elif event.name == ATTEMPT_COMPLETED:
            try:
                self.current.reset(self.tokens.pop(key))
            except ValueError as exc:
                self.errors.append(exc)
            else:
                self.reset += 1


async def test_an_attempt_ends_in_the_context_it_started_in(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    """A plain staged completion is reported after its slot's task ended (once the
    batcher wrote it), still in that task's context: an observer's context variable set
    at the start is reset at the end without error. Control: reporting it in the
    batcher's context makes every reset fail."""
    reg, ok, _ = _registry()
    setter = ContextSetter()
    recorder = Recorder()
    client = await make_client(reg)

    async def handle(attempt: Attempt[Num, Num]) -> Num:
        assert ContextSetter.current.get() == str(attempt.job.id)
        return attempt.job.input

    await client.start_chains(conn, [ChainStart(ok, Num(n=n)) for n in range(20)])
    await conn.commit()
    await workers(client=client, processors={ok: handle}, observers=[setter, recorder], max_slots=5)
    await recorder.wait_for(ATTEMPT_COMPLETED, 20)
    assert setter.errors == []
    assert setter.reset == 20
