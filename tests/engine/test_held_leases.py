"""Leases a worker holds: an attempt whose outcome was written while a renewal was on its
way was not renewed, and that must not read as a lost lease; a job whose outcome could
not be written goes back to the queue with its attempt counted."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    JobStatus,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
)
from pgwork.adapters.state import Completion, Failure, Lease
from pgwork.observability.emitter import Emitter
from pgwork.records import AbortReason, AttemptError
from pgwork.worker._batch import CompletionBatcher
from pgwork.worker._bell import Bell
from pgwork.worker._runner import SlotRunner
from pgwork.worker._side.lease import renew_once
from pgwork.worker._slots import Slots
from pgwork.worker._steps import AttemptSteps

from .conftest import ClientFactory, acquired_job, eventually

pytestmark = pytest.mark.anyio


class Num(BaseModel):
    n: int


class _Holder:
    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.lease_duration = timedelta(seconds=60)
        self.lease_deadline = 0.0
        self.settling = False
        self.aborted: list[AbortReason] = []

    def renewed(self, deadline: float) -> None:
        self.lease_deadline = deadline

    def abort(self, reason: AbortReason) -> None:
        self.aborted.append(reason)


async def _completed_behind_the_renewers_back(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> tuple[Any, _Holder]:
    client, job = await acquired_job(make_client, conn)
    holder = _Holder(job.lease)
    await client.state.complete(
        None,
        completions=[Completion(job.id, job.lease_token, output_json="null", continuation=None)],
    )
    return client, holder


async def test_an_attempt_settled_during_the_renewal_is_not_aborted(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client, holder = await _completed_behind_the_renewers_back(make_client, conn)
    # The worker no longer lists the attempt among its lease holders.
    await renew_once(client.state, [holder], holding=lambda: [])
    assert holder.aborted == []


async def test_a_lease_lost_while_still_held_aborts_the_attempt(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client, holder = await _completed_behind_the_renewers_back(make_client, conn)
    await renew_once(client.state, [holder], holding=lambda: [holder])
    assert holder.aborted == [AbortReason.COMPLETED_ELSEWHERE]


async def _slots_holding_one_job(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> tuple[Any, Any, Slots]:
    """A client, one ``step`` job acquired by worker ``w`` and that worker's ``Slots``."""
    reg = JobTypeRegistry()
    step = reg.job_type("step", input=Num)
    client = await make_client(reg)
    await client.start_chain(conn, step, Num(n=1))
    await conn.commit()
    [job] = await client.state.acquire(worker_id="w", leases=LEASES, queues=None, limit=1)
    runner = SlotRunner(
        steps=AttemptSteps(
            client=client,
            worker_id="w",
            handlers={},
            batcher=CompletionBatcher(client.state),
            events=Emitter([]),
            rng=random.Random(0),
            abandon_after=5.0,
        )
    )
    slots = Slots(
        runner=runner,
        worker_id="w",
        types={"step": step},
        queues=["default"],
        max_slots=1,
        prefetch=0,
        bell=Bell(),
    )
    return client, job, slots


LEASES = {"step": timedelta(seconds=60)}
WRITE_ERROR = AttemptError(type="builtins.OSError", message="connection lost")


@pytest.mark.parametrize("last", [False, True])
async def test_an_attempt_that_could_not_be_settled_counts_and_fails_at_its_last(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], last: bool
) -> None:
    """The handler did run: settling the attempt later must not give it back, or a job
    whose outcome can never be written would run for ever. Its failure is written: the
    job is retried, or at its last attempt fails for good, with the error recorded.
    (Control: the job handed back to the queue, counted but never failed.)"""
    client, job, slots = await _slots_holding_one_job(make_client, conn)
    retry_after = None if last else timedelta(0)
    slots.unsettled.append(Failure(job.id, job.lease_token, WRITE_ERROR, retry_after))
    await slots.hand_back_unsettled()
    assert slots.unsettled == []
    back = await client.get_job(job.id)
    assert back.status is (JobStatus.FAILED if last else JobStatus.PENDING)
    assert back.attempt == 1
    assert back.leased_by is None
    assert back.last_attempt_error == WRITE_ERROR
    if not last:
        [again] = await client.state.acquire(worker_id="w", leases=LEASES, queues=None, limit=1)
        assert again.attempt == 2


async def test_a_job_whose_handler_never_started_goes_back_uncounted(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client, job, slots = await _slots_holding_one_job(make_client, conn)
    slots.unsettled.append(job.lease)
    await slots.hand_back_unsettled()
    back = await client.get_job(job.id)
    assert back.status is JobStatus.PENDING
    assert back.attempt == 0


async def test_a_completion_that_waits_longer_than_its_lease_keeps_the_job(
    pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    """A staged handler returned, and its completion cannot be written for longer than
    the job's lease (here: the worker's only pooled connection is busy elsewhere, as
    after an outage while the pool refills). The lease is renewed meanwhile (renewals
    have a connection of their own), so no reaper takes the job, and the job runs once.
    (Control: a worker that stops renewing a lease once its handler returned loses the
    job to the reaper, and the job runs twice.)"""
    reg = JobTypeRegistry()
    step = reg.job_type("step", input=Num, lease=timedelta(seconds=1.5))
    state = await PostgresStateAdapter.connect(pgwork_dsn, min_size=1, max_size=1)
    client = create_client(
        state_adapter=state, notify_adapter=PostgresNotifyAdapter(pgwork_dsn), registry=reg
    )
    reaper = await PostgresStateAdapter.connect(pgwork_dsn)
    runs: list[int] = []
    started, go = anyio.Event(), anyio.Event()

    async def handle(attempt: Any) -> None:
        runs.append(attempt.job.attempt)
        started.set()
        await go.wait()

    try:
        chain = await client.start_chain(conn, step, Num(n=1))
        await conn.commit()
        worker = create_in_process_worker(
            client=client, processors={step: handle}, max_slots=1, poll_interval=0.2
        )
        await worker.start()
        try:
            with anyio.fail_after(20):
                await started.wait()
            async with state.pool.connection():  # the worker's only pooled connection
                go.set()  # the handler returns; its completion waits for a connection
                # Past the lease as it was when the handler returned, twice over.
                await anyio.sleep(3.0)
                assert await reaper.reap(type_names=["step"], exclude_worker="reaper") == []

            async def completed() -> bool:
                return (await client.get_job(chain.job_id)).status is JobStatus.COMPLETED

            await eventually(completed, timeout=20, what="the completion to be written")
        finally:
            await worker.stop(grace_period=1)
        assert runs == [1]
    finally:
        await client.close()
        await reaper.close()
