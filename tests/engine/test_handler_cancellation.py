"""How a handler is stopped: its timeout or an abort cancels it once, where it waits.

The worker cancels the handler's task with asyncio's own cancellation (``Task.cancel``),
not through anyio cancel scopes around it. What a handler sees:

- one ``CancelledError``, at the await it is waiting in; the cleanup it then does may
  wait in turn (a cancelled anyio scope cancelled every one of those waits again);
- nothing while it is inside a shielded anyio scope: the cancellation comes once it has
  left the scope (``Task.cancel`` on its own would go straight through the shield);
- a handler that swallows the cancellation and returns keeps its result, and the
  worker's own work for the attempt afterwards is not cancelled;
- ``attempt.deadline``, the event loop time its timeout cancels it at.

Each mechanism has a control build that takes it out and must show the difference.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    Attempt,
    JobStatus,
    JobTypeRegistry,
    LeaseLostError,
    RetryPolicy,
    create_in_process_worker,
)
from pgwork.observability import ATTEMPT_COMPLETED, ATTEMPT_STARTED, Event
from pgwork.worker import _slot
from pgwork.worker._slot import Slot

from .conftest import ClientFactory, eventually

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

NO_BACKOFF = RetryPolicy(initial=timedelta(0), maximum=timedelta(0))
TIMEOUT = timedelta(milliseconds=100)


class Num(BaseModel):
    n: int


def _cancel_on_every_turn(self: Slot) -> None:
    """The control for edge-triggered delivery: cancel the handler again on every turn
    of the event loop while it runs, as a cancelled anyio scope around it did."""
    task = self.handler_task
    if self.running and task is not None and not task.done():
        self.interrupts += 1
        task.cancel()
        task.get_loop().call_soon(_cancel_on_every_turn, self)


async def _run_one(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    handler: Any,
    *,
    mode: str = "staged",
    observers: list[Any] | None = None,
    abandon_after: timedelta = timedelta(seconds=5),
) -> Any:
    """Run one job of a type with a 100 ms timeout and one attempt through ``handler``
    in a worker; return the job once it settled."""
    reg = JobTypeRegistry()
    job_type = reg.job_type(
        "timed",
        input=Num,
        mode=mode,  # type: ignore[arg-type]
        timeout=TIMEOUT,
        abandon_after=abandon_after,
        max_attempts=1,
        retry=NO_BACKOFF,
    )
    client = await make_client(reg)
    worker = create_in_process_worker(
        client=client,
        processors={job_type: handler},
        max_slots=2,
        poll_interval=0.1,
        **({"observers": observers} if observers is not None else {}),
    )
    async with worker:
        started = await client.start_chain(conn, job_type, Num(n=1))
        await conn.commit()

        async def settled() -> bool:
            status = (await client.get_job(started.job_id)).status
            return status in (JobStatus.COMPLETED, JobStatus.FAILED)

        await eventually(settled, what="the job to settle")
        return await client.get_job(started.job_id)


def _assert_timed_out(job: Any) -> None:
    assert job.status is JobStatus.FAILED
    assert job.last_attempt_error is not None
    assert job.last_attempt_error.type == "builtins.TimeoutError"


@pytest.mark.parametrize("build", ["once", "control-every-turn"])
async def test_a_timed_out_handler_is_cancelled_once_so_its_cleanup_may_wait(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    build: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if build == "control-every-turn":
        monkeypatch.setattr(Slot, "interrupt", _cancel_on_every_turn)
    cleaned_up: list[bool] = []

    async def handler(attempt: Attempt[Num, Any]) -> None:
        try:
            await anyio.sleep(10)
        except asyncio.CancelledError:
            try:
                await anyio.sleep(0.05)  # cleanup that waits
                cleaned_up.append(True)
            except asyncio.CancelledError:
                cleaned_up.append(False)
            raise

    _assert_timed_out(await _run_one(make_client, conn, handler))
    if build == "control-every-turn":
        assert cleaned_up == [False]
        return
    assert cleaned_up == [True]


@pytest.mark.parametrize("build", ["waits-for-shield", "control-ignores-shield"])
async def test_a_handler_inside_a_shielded_anyio_scope_is_cancelled_once_it_leaves_it(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    build: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if build == "control-ignores-shield":
        monkeypatch.setattr(_slot, "in_anyio_shield", lambda task: False)
    steps: list[str] = []

    async def handler(attempt: Attempt[Num, Any]) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await anyio.sleep(0.3)  # three times the timeout
                steps.append("shielded work done")
            except asyncio.CancelledError:
                steps.append("shielded work cancelled")
                raise
        steps.append("left the shield")
        await anyio.sleep(10)
        steps.append("not cancelled at all")

    _assert_timed_out(await _run_one(make_client, conn, handler))
    if build == "control-ignores-shield":
        assert steps == ["shielded work cancelled"]
        return
    assert steps == ["shielded work done", "left the shield"]


@pytest.mark.parametrize("build", ["interrupted", "control-not-interrupted"])
@pytest.mark.parametrize("group", ["anyio", "asyncio"])
async def test_a_timed_out_handler_waiting_on_a_task_group_has_its_children_cancelled(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    build: str,
    group: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cancellation reaches the handler where it waits for its task group (anyio's
    or asyncio's), which cancels its children and passes it on: the attempt times out.
    The control never interrupts the handler: the watchdog gives up on it instead, with
    the children still running."""
    if build == "control-not-interrupted":
        monkeypatch.setattr(Slot, "interrupt", lambda self: None)
    children: list[str] = []
    release = anyio.Event()

    async def child() -> None:
        try:
            await release.wait()
            children.append("released")
        except asyncio.CancelledError:
            children.append("cancelled")
            raise

    async def handler(attempt: Attempt[Num, Any]) -> None:
        if group == "anyio":
            async with anyio.create_task_group() as tg:
                tg.start_soon(child)
                tg.start_soon(child)
        else:
            async with asyncio.TaskGroup() as atg:
                atg.create_task(child())
                atg.create_task(child())

    try:
        job = await _run_one(make_client, conn, handler, abandon_after=timedelta(milliseconds=300))
        if build == "control-not-interrupted":
            assert job.last_attempt_error is not None
            assert job.last_attempt_error.type == "pgwork.errors.HandlerAbandonedError"
            assert children == []
            return
        _assert_timed_out(job)
        assert children == ["cancelled", "cancelled"]
    finally:
        release.set()


class _CancellingsAtCompletion:
    """Records, as each attempt completes, how many cancellations of the slot's task
    are still pending (in the slot task itself: an atomic attempt reports there)."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_event(self, event: Event) -> None:
        if event.name == ATTEMPT_COMPLETED:
            task = asyncio.current_task()
            assert task is not None
            self.seen.append(task.cancelling())


@pytest.mark.parametrize("build", ["taken-back", "control-left-pending"])
async def test_a_handler_that_swallows_its_timeout_keeps_its_result_and_nothing_after_is_cancelled(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    build: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if build == "control-left-pending":
        # Deliver the cancellation without the worker knowing it did: nothing takes
        # it back once the handler ended.
        def interrupt_unrecorded(self: Slot) -> None:
            if self.running and self.handler_task is not None:
                self.handler_task.cancel()

        monkeypatch.setattr(Slot, "interrupt", interrupt_unrecorded)
    watcher = _CancellingsAtCompletion()

    async def handler(attempt: Attempt[Num, Any]) -> str:
        try:
            await anyio.sleep(10)
        except asyncio.CancelledError:
            return "swallowed"
        return "slept"

    job = await _run_one(make_client, conn, handler, mode="atomic", observers=[watcher])
    # The handler's writes and its completion committed together, after the timeout.
    assert (job.status, job.output) == (JobStatus.COMPLETED, "swallowed")
    if build == "control-left-pending":
        assert watcher.seen == [1]
        return
    assert watcher.seen == [0]


async def test_attempt_deadline_is_when_the_timeout_cancels_the_handler(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    seen: list[tuple[float, float | None]] = []

    async def handler(attempt: Attempt[Num, Any]) -> None:
        seen.append((anyio.current_time(), attempt.deadline))
        try:
            await anyio.sleep(10)
        finally:
            seen.append((anyio.current_time(), None))

    await _run_one(make_client, conn, handler)
    [(began, deadline), (cancelled_at, _)] = seen
    assert deadline is not None
    assert deadline - began == pytest.approx(TIMEOUT.total_seconds(), abs=0.02)
    # Both are read from the loop's clock (whole milliseconds on uvloop), the deadline as
    # a float sum: the same instant may differ in its last bits (CI saw 5132.364 against
    # 5132.3640000000005). A microsecond covers that, not a cancellation that came early.
    assert cancelled_at >= deadline - 1e-6


async def test_an_untimed_staged_handler_has_no_deadline(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    untimed = reg.job_type("untimed", input=Num)
    client = await make_client(reg)
    deadlines: list[float | None] = []
    done = anyio.Event()

    async def handler(attempt: Attempt[Num, Any]) -> None:
        deadlines.append(attempt.deadline)
        done.set()

    worker = create_in_process_worker(
        client=client, processors={untimed: handler}, max_slots=1, poll_interval=0.1
    )
    async with worker:
        await client.start_chain(conn, untimed, Num(n=1))
        await conn.commit()
        with anyio.fail_after(10):
            await done.wait()
    assert deadlines == [None]


async def test_an_aborted_handler_is_cancelled_where_it_waits_and_started_is_reported_once(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    """A job cancelled through the client while its handler runs: the handler gets one
    CancelledError and the attempt is not retried."""
    reg = JobTypeRegistry()
    slow = reg.job_type("slow", input=Num)
    client = await make_client(reg)
    running = anyio.Event()
    cancelled: list[int] = []
    events: list[str] = []

    class Names:
        def on_event(self, event: Event) -> None:
            if event.name == ATTEMPT_STARTED:
                events.append(event.name)

    async def handler(attempt: Attempt[Num, Any]) -> None:
        running.set()
        try:
            await anyio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(attempt.job.attempt)
            await anyio.sleep(0.01)  # may still wait: cancelled once
            raise

    worker = create_in_process_worker(
        client=client,
        processors={slow: handler},
        max_slots=1,
        poll_interval=0.1,
        heartbeat_interval=0.1,
        observers=[Names()],
    )
    async with worker:
        started = await client.start_chain(conn, slow, Num(n=1))
        await conn.commit()
        with anyio.fail_after(10):
            await running.wait()
        await client.cancel(conn, [started.job_id])
        await conn.commit()

        async def handler_cancelled() -> bool:
            return cancelled == [1]

        await eventually(handler_cancelled, what="the handler to be cancelled")
    job = await client.get_job(started.job_id)
    assert job.status is JobStatus.CANCELLED
    assert events == [ATTEMPT_STARTED]


async def _take_away(client: Any, conn: Any, job_id: Any, how: str, worker: Any) -> None:
    if how == "cancelled":
        await client.cancel(conn, [job_id])
    elif how == "completed elsewhere":
        await client.complete_job(conn, job_id, "from a webhook")
    else:  # "worker stopping": the worker still holds the job and hands it back
        await worker.stop()
        return
    await conn.commit()


@pytest.mark.parametrize("method", ["complete", "reschedule"])
@pytest.mark.parametrize("how", ["cancelled", "completed elsewhere", "worker stopping"])
async def test_finishing_an_attempt_whose_job_was_taken_away_raises_lease_lost(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], how: str, method: str
) -> None:
    """A handler that catches its cancellation and then completes or reschedules learns,
    through LeaseLostError, that the job is no longer its worker's and nothing will be
    written. A stopping worker still holds the job (it hands it back), so there the call
    raises nothing. (Controls: without the check in ``Attempt`` the calls return and
    the outcome is silently dropped, and the first two cases fail; counting a stopping
    worker's abort as a lost job fails the third.)"""
    reg = JobTypeRegistry()
    slow = reg.job_type("slow", input=Num)
    client = await make_client(reg)
    running = anyio.Event()
    finished = anyio.Event()
    raised: list[BaseException | None] = []

    async def handler(attempt: Attempt[Num, Any]) -> None:
        running.set()
        try:
            await anyio.sleep_forever()
        except asyncio.CancelledError:
            try:
                if method == "complete":
                    await attempt.complete(None)
                else:
                    await attempt.reschedule(after=timedelta(hours=1))
            except LeaseLostError as exc:
                raised.append(exc)
            else:
                raised.append(None)
            finished.set()
            raise

    worker = create_in_process_worker(
        client=client, processors={slow: handler}, max_slots=1, grace_period=0
    )
    async with worker:
        started = await client.start_chain(conn, slow, Num(n=1))
        await conn.commit()
        with anyio.fail_after(10):
            await running.wait()
        await _take_away(client, conn, started.job_id, how, worker)
        with anyio.fail_after(10):
            await finished.wait()

    [error] = raised
    if how == "worker stopping":
        assert error is None
        assert (await client.get_job(started.job_id)).status is JobStatus.PENDING
        return
    assert isinstance(error, LeaseLostError)
    assert (error.job_id, error.attempt, error.action) == (started.job_id, 1, f"{method}()")
    job = await client.get_job(started.job_id)
    expected = JobStatus.CANCELLED if how == "cancelled" else JobStatus.COMPLETED
    assert job.status is expected
