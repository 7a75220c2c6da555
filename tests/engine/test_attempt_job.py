"""A handler's ``attempt.job`` is the stored job: every field ``get_job`` returns."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import Attempt, Continue, Job, JobStatus, JobTypeRegistry, RetryPolicy

from .conftest import ClientFactory

pytestmark = pytest.mark.anyio


class Num(BaseModel):
    n: int


# What a handler's ``attempt.job`` leaves out by design (records.Job says why): the
# acquire does not read the attempt history; ``get_job`` does.
NOT_ACQUIRED = {"attempt_history"}


def differences(seen: Job[Any], stored: Job[Any]) -> dict[str, tuple[Any, Any]]:
    return {
        f.name: (getattr(seen, f.name), getattr(stored, f.name))
        for f in dataclasses.fields(Job)
        if f.name not in NOT_ACQUIRED and getattr(seen, f.name) != getattr(stored, f.name)
    }


async def test_attempt_job_matches_get_job_on_a_first_attempt_and_on_a_retry(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], workers: Any
) -> None:
    reg = JobTypeRegistry()
    flaky = reg.job_type("flaky", input=Num, retry=RetryPolicy(initial=timedelta(0)))
    client = await make_client(reg)
    await client.start_chain(conn, flaky, Num(n=7), dedup="order-7")
    await conn.commit()
    pairs: list[tuple[Job[Any], Job[Any]]] = []
    done = anyio.Event()

    async def handler(attempt: Attempt[Num, Any]) -> None:
        pairs.append((attempt.job, await client.get_job(attempt.job.id)))
        if attempt.job.attempt == 1:
            raise RuntimeError("first attempt fails")
        done.set()

    await workers(client=client, processors={flaky: handler})
    with anyio.fail_after(20):
        await done.wait()
    (first, first_stored), (retry, retry_stored) = pairs
    assert differences(first, first_stored) == {}
    assert differences(retry, retry_stored) == {}
    # The fields that were missing before, checked by value, not only by equality.
    assert first.dedup_key == retry.dedup_key == "order-7"
    assert first.started_at is not None
    assert retry.started_at == first.started_at
    assert first.last_attempt_at is None
    assert retry.last_attempt_at is not None
    assert retry.last_attempt_error is not None
    assert retry.last_attempt_error.message == "first attempt fails"
    assert retry.attempt_history == ()
    assert [a.attempt for a in retry_stored.attempt_history] == [1]


async def test_attempt_job_of_a_scheduled_continuation_has_every_field_in_its_place(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], workers: Any
) -> None:
    """The worker builds ``attempt.job`` field by field from the acquired row: on a
    job whose fields mostly differ from one another (a continuation: its own id, type,
    index; scheduled after it was created; a priority, a queue, a context), a value
    put in the wrong field shows as a difference from ``get_job``."""
    reg = JobTypeRegistry()
    second = reg.job_type("second", input=Num, entry=False, queue="q-second", priority=4)
    first = reg.job_type("first", input=Num, continue_with=[second], max_attempts=6)
    client = await make_client(reg)
    await client.start_chain(conn, first, Num(n=1), dedup="chain-1", context={"tenant": "t"})
    await conn.commit()
    seen: list[tuple[Job[Any], Job[Any]]] = []
    done = anyio.Event()

    async def hand_on(attempt: Attempt[Num, Any]) -> Any:
        return Continue(second, Num(n=2), after=timedelta(milliseconds=300))

    async def check(attempt: Attempt[Num, Any]) -> None:
        seen.append((attempt.job, await client.get_job(attempt.job.id)))
        done.set()

    await workers(client=client, processors={first: hand_on, second: check})
    with anyio.fail_after(20):
        await done.wait()
    [(job, stored)] = seen
    assert differences(job, stored) == {}
    assert job.id != job.chain_id
    assert (job.type_name, job.chain_type_name, job.chain_index) == ("second", "first", 1)
    assert (job.queue, job.priority, job.attempt) == ("q-second", 4, 1)
    assert job.scheduled_at > job.created_at
    assert job.started_at is not None
    assert job.started_at >= job.scheduled_at
    assert job.leased_until is not None
    assert job.leased_until > job.started_at
    assert job.context == {"tenant": "t"}
    assert job.status is JobStatus.RUNNING
    assert job.output is None
    assert job.completed_at is None
