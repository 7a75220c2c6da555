"""Leases a worker holds: an attempt whose outcome was written while a renewal was on its
way was not renewed, and that must not read as a lost lease; a job whose outcome could
not be written goes back to the queue with its attempt counted."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

from pgwork import JobStatus, JobTypeRegistry
from pgwork.adapters.state import Completion, Failure, Lease
from pgwork.records import AbortReason, AttemptError
from pgwork.worker._lease import renew_once
from pgwork.worker._slots import Slots

from .conftest import ClientFactory, acquired_job

pytestmark = pytest.mark.anyio


class Num(BaseModel):
    n: int


class _Holder:
    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.lease_duration = timedelta(seconds=60)
        self.lease_deadline = 0.0
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
    slots = Slots(
        state=client.state,
        worker_id="w",
        types={"step": step},
        queues=["default"],
        max_slots=1,
        prefetch=0,
        wake=lambda: None,
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
