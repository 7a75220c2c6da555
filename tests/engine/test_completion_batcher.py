"""The completion batcher: a completion handed to it is written even when the worker
is cancelled before the batch went out."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import JobStatus, JobTypeRegistry
from pgwork.adapters.state import Completion
from pgwork.worker._batch import CompletionBatcher

from .conftest import ClientFactory

pytestmark = pytest.mark.anyio


class Num(BaseModel):
    n: int


async def test_completions_waiting_when_the_batcher_is_cancelled_are_still_written(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    step = reg.job_type("step", input=Num)
    client = await make_client(reg)
    await client.start_chain(conn, step, Num(n=1))
    await conn.commit()
    [job] = await client.state.acquire(
        worker_id="w", leases={"step": timedelta(seconds=60)}, queues=None, limit=1
    )
    # A long delay: nothing would be written before the cancel but for the last flush.
    batcher = CompletionBatcher(client.state, max_delay=60.0)
    completion = Completion(job.id, job.lease_token, output_json="null", continuation=None)
    async with anyio.create_task_group() as group:
        group.start_soon(batcher.run_forever)
        group.start_soon(batcher.complete, completion)  # a slot, cancelled while it waits
        await anyio.sleep(0.05)
        assert batcher.waiting == 1
        group.cancel_scope.cancel()
    assert (await client.get_job(job.id)).status is JobStatus.COMPLETED
