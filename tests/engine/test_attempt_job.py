"""A handler's ``attempt.job`` is the stored job: every field ``get_job`` returns."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import Attempt, Job, JobTypeRegistry, RetryPolicy

from .conftest import ClientFactory

pytestmark = pytest.mark.anyio


class Num(BaseModel):
    n: int


def differences(seen: Job[Any], stored: Job[Any]) -> dict[str, tuple[Any, Any]]:
    return {
        f.name: (getattr(seen, f.name), getattr(stored, f.name))
        for f in dataclasses.fields(Job)
        if getattr(seen, f.name) != getattr(stored, f.name)
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
