"""Prefetch: a worker with short handlers keeps its next jobs acquired while its slots
are busy, so the next acquire overlaps the running handlers. Never more handlers than
slots; prefetched jobs are leased, renewed, started in queue order, and handed back on
stop without burning an attempt."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, NamedTuple

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import Attempt, ChainStart, Client, JobStatus, JobType, JobTypeRegistry, StartedChain
from pgwork.worker._admission import SHORT_HANDLER_S, Admission

from .conftest import ClientFactory, eventually, scalar

pytestmark = pytest.mark.anyio


class Num(BaseModel):
    n: int


class _Steps(NamedTuple):
    """A client with one job type, ``step``, and the chains it started."""

    client: Client
    step: JobType[Num, None]
    started: list[StartedChain[Num, None]]


async def _steps(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    count: int,
    *,
    lease: timedelta = timedelta(seconds=60),  # the job type's default
    by_priority: bool = False,
) -> _Steps:
    """Enqueue and commit ``count`` ``step`` jobs, ``Num(n=0..count-1)`` (with
    ``priority=n`` when ``by_priority``)."""
    reg = JobTypeRegistry()
    step = reg.job_type("step", input=Num, lease=lease)
    client = await make_client(reg)
    starts = [ChainStart(step, Num(n=n), priority=n if by_priority else None) for n in range(count)]
    started = await client.start_chains(conn, starts)
    await conn.commit()
    return _Steps(client, step, list(started))


RUNNING = "SELECT count(*) FROM pgwork.jobs WHERE status = 'running'"


class _Gate:
    """A handler that records each job, and holds job 0 until ``release`` is set."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.concurrent = 0
        self.most_concurrent = 0
        self.first_running = anyio.Event()
        self.release = anyio.Event()

    async def __call__(self, attempt: Attempt[Num, None]) -> None:
        self.concurrent += 1
        self.most_concurrent = max(self.most_concurrent, self.concurrent)
        try:
            self.seen.append(attempt.job.input.n)
            if attempt.job.input.n == 0:
                self.first_running.set()
                await self.release.wait()
        finally:
            self.concurrent -= 1


async def _one_running_two_prefetched(gate: _Gate, dsn: str) -> None:
    """Wait until job 0's handler runs and two more jobs are leased beside it."""
    with anyio.fail_after(20):
        await gate.first_running.wait()

    async def three_leased() -> bool:
        return bool(await scalar(dsn, RUNNING) == 3)

    await eventually(three_leased, what="two jobs prefetched beside the running one")


async def _completed(dsn: str, count: int) -> None:
    """Wait until ``count`` jobs are completed."""

    async def all_done() -> bool:
        done = "SELECT count(*) FROM pgwork.jobs WHERE status = 'completed'"
        return bool(await scalar(dsn, done) == count)

    await eventually(all_done, what=f"{count} jobs completed")


async def test_a_busy_slot_keeps_its_next_jobs_acquired_and_runs_them_in_order(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    client, step, _ = await _steps(make_client, conn, 6)
    gate = _Gate()

    await workers(client=client, processors={step: gate}, max_slots=1, prefetch=2)
    # One handler runs; two more jobs are leased to the worker, waiting for its slot.
    await _one_running_two_prefetched(gate, pgwork_dsn)
    assert gate.seen == [0]
    gate.release.set()

    await _completed(pgwork_dsn, 6)
    assert gate.seen == [0, 1, 2, 3, 4, 5]
    assert gate.most_concurrent == 1


async def test_a_single_slot_runs_its_jobs_strictly_in_queue_order(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    jobs = 12
    client, step, _ = await _steps(make_client, conn, jobs, by_priority=True)
    seen: list[int] = []

    async def handle(attempt: Attempt[Num, None]) -> None:
        seen.append(attempt.job.input.n)

    # Every other acquire answers late, after its statement committed. Were a second
    # acquire sent meanwhile (a slot freed), it would skip the jobs the first leased,
    # take the next ones and come back first: one slot, one acquire at a time.
    real = client.state.complete_and_acquire
    calls = 0

    async def every_other_late(**kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        late = calls % 2 == 0
        answer = await real(**kwargs)
        if late:
            await anyio.sleep(0.1)
        return answer

    client.state.complete_and_acquire = every_other_late  # type: ignore[method-assign]
    await workers(client=client, processors={step: handle}, max_slots=1, prefetch=1)

    await _completed(pgwork_dsn, jobs)
    assert seen == list(range(jobs))


async def test_stop_hands_prefetched_jobs_back_without_burning_an_attempt(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    from pgwork import create_in_process_worker

    client, step, started = await _steps(make_client, conn, 3)
    gate = _Gate()
    worker = create_in_process_worker(
        client=client, processors={step: gate}, max_slots=1, prefetch=2, poll_interval=0.2
    )
    stop = await worker.start()
    await _one_running_two_prefetched(gate, pgwork_dsn)

    async def prefetched_handed_back() -> bool:
        return bool(await scalar(pgwork_dsn, RUNNING) == 1)

    async with anyio.create_task_group() as group:
        group.start_soon(stop)
        # The stop has handed the two waiting jobs back; the running one finishes
        # within the grace period.
        await eventually(prefetched_handed_back, what="the prefetched jobs handed back")
        gate.release.set()

    first, *prefetched = [await client.get_job(s.job_id) for s in started]
    assert first.status is JobStatus.COMPLETED
    for job in prefetched:
        assert job.status is JobStatus.PENDING
        assert job.attempt == 0
        assert job.leased_by is None
    assert gate.seen == [0]


async def test_prefetched_jobs_keep_their_leases_while_they_wait(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    client, step, started = await _steps(make_client, conn, 2, lease=timedelta(seconds=1))
    gate = _Gate()
    await workers(client=client, processors={step: gate}, max_slots=1, prefetch=1)
    with anyio.fail_after(20):
        await gate.first_running.wait()
    # A second worker reaps any expired lease; the waiting job's lease must not expire.
    await workers(client=client, processors={step: gate}, max_slots=1, prefetch=0)
    acquires: list[int] = []
    real = client.state.complete_and_acquire

    async def counting(**kwargs: Any) -> Any:
        results, acquired = await real(**kwargs)
        acquires.append(len(acquired))
        return results, acquired

    client.state.complete_and_acquire = counting  # type: ignore[method-assign]
    await anyio.sleep(2.5)  # time passing is the point: more than twice the lease
    # Every acquire counts, empty ones included: neither worker may spin while it waits
    # (an earlier build re-acquired ~550 times a second here and the test still passed).
    assert len(acquires) <= 6, f"{len(acquires)} acquires in 2.5 s, {acquires.count(0)} empty"
    waiting = await client.get_job(started[1].job_id)
    assert waiting.status is JobStatus.RUNNING
    assert waiting.attempt == 1
    still_leased = "SELECT leased_until > now() FROM pgwork.jobs WHERE id = %s"
    assert await scalar(pgwork_dsn, still_leased, started[1].job_id)
    gate.release.set()

    async def both_done() -> bool:
        done = "SELECT count(*) FROM pgwork.jobs WHERE status = 'completed' AND attempt = 1"
        return bool(await scalar(pgwork_dsn, done) == 2)

    await eventually(both_done, what="both jobs completed on their first attempt")


# --- the automatic setting (pure bookkeeping, no database) ----------------------------


class _Slot:
    def __init__(self, started: float) -> None:
        self.started = started


def test_automatic_prefetch_follows_the_handlers_recent_duration() -> None:
    admission: Admission[_Slot] = Admission(max_slots=2, prefetch=None)
    # Nothing seen yet: no prefetch, so a worker whose first jobs are slow holds none.
    assert not admission.prefetching
    assert admission.room() == 2
    for _ in range(30):  # short handlers
        slot = _Slot(started=0.0)
        admission.arrived(slot)
        admission.freed(slot, now=SHORT_HANDLER_S / 10)
    assert admission.prefetching
    assert admission.room() == 4
    for _ in range(30):  # then long ones
        slot = _Slot(started=0.0)
        admission.arrived(slot)
        admission.freed(slot, now=SHORT_HANDLER_S * 10)
    assert not admission.prefetching
    assert admission.room() == 2


def test_jobs_beyond_the_slots_wait_and_start_as_slots_free() -> None:
    admission: Admission[_Slot] = Admission(max_slots=2, prefetch=3)
    slots = [_Slot(started=0.0) for _ in range(5)]
    started = [slot for slot in slots if admission.arrived(slot)]
    assert started == slots[:2]
    assert list(admission.queued) == slots[2:]
    assert admission.room() == 0
    assert admission.freed(slots[0], now=1.0) is slots[2]
    assert admission.take_queued() == slots[3:]
    assert admission.room() == 2 + 3 - 2


@pytest.mark.parametrize("prefetch", [0, 4])
def test_an_explicit_prefetch_ignores_handler_durations(prefetch: int) -> None:
    admission: Admission[_Slot] = Admission(max_slots=2, prefetch=prefetch)
    slot = _Slot(started=0.0)
    admission.arrived(slot)
    admission.freed(slot, now=100.0)
    assert admission.prefetching is (prefetch > 0)
    assert admission.room() == 2 + prefetch


async def test_a_prefetched_job_cancelled_while_it_waits_never_starts(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    client, step, started = await _steps(make_client, conn, 3)
    gate = _Gate()
    worker = await workers(client=client, processors={step: gate}, max_slots=1, prefetch=2)
    await _one_running_two_prefetched(gate, pgwork_dsn)
    await client.cancel(conn, [started[1].id])
    await conn.commit()

    async def abort_heard() -> bool:
        waiting = [s for s in worker._slots.held if s.acquired.id == started[1].id]
        return all(s.pending_abort is not None for s in waiting)

    await eventually(abort_heard, what="the abort notice to reach the worker")
    gate.release.set()

    async def last_done() -> bool:
        return (await client.get_job(started[2].job_id)).status is JobStatus.COMPLETED

    await eventually(last_done, what="the job after the cancelled one completed")
    assert gate.seen == [0, 2]
    assert (await client.get_job(started[1].job_id)).status is JobStatus.CANCELLED


class _Ranked:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.started = 0.0


def test_waiting_jobs_start_in_rank_order_not_arrival_order() -> None:
    """A job of a more important queue (a retry fallen due, say) acquired while slower
    jobs already wait for a slot starts before them."""
    admission: Admission[_Ranked] = Admission(max_slots=1, prefetch=3, rank=lambda s: s.rank)
    running, slow_a, slow_b, urgent = _Ranked(1), _Ranked(1), _Ranked(1), _Ranked(0)
    launched = [slot for slot in (running, slow_a, slow_b, urgent) if admission.arrived(slot)]
    assert launched == [running]
    for _ in range(3):
        following = admission.freed(launched[-1], now=0.001)
        assert following is not None
        launched.append(following)
    assert launched == [running, urgent, slow_a, slow_b]
