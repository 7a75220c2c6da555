"""The completion batcher: a completion handed to it is written even when the worker
is cancelled before the batch went out."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import JobStatus
from pgwork.adapters.state import Completion
from pgwork.worker._batch import CompletionBatcher

from .conftest import ClientFactory, acquired_job

pytestmark = pytest.mark.anyio


class Num(BaseModel):
    n: int


async def test_completions_waiting_when_the_batcher_is_cancelled_are_still_written(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client, job = await acquired_job(make_client, conn)
    # A long delay: nothing would be written before the cancel but for the last flush.
    batcher = CompletionBatcher(client.state, max_delay=60.0)
    completion = Completion(job.id, job.lease_token, output_json="null", continuation=None)
    async with anyio.create_task_group() as group:
        group.start_soon(batcher.run_forever)
        group.start_soon(batcher.complete, completion)  # a slot, cancelled while it waits
        with anyio.fail_after(5):
            while batcher.waiting != 1:
                await anyio.lowlevel.checkpoint()
        group.cancel_scope.cancel()
    assert (await client.get_job(job.id)).status is JobStatus.COMPLETED


async def test_a_completion_deferred_while_its_row_is_held_and_still_held_at_stop_fails(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """A completion whose row a caller holds is deferred, not waited on; one still held
    when the batcher stops fails (its job is left to be reaped) rather than leaving its
    slot waiting for ever."""
    client, job = await acquired_job(make_client, conn)
    batcher = CompletionBatcher(client.state)
    completion = Completion(job.id, job.lease_token, output_json="null", continuation=None)
    outcome: list[BaseException | None] = []
    settled = anyio.Event()

    def written_to(pending: Any) -> None:
        outcome.append(pending.error)
        settled.set()

    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as caller:
        await caller.execute("SELECT id FROM pgwork.jobs WHERE id = %s FOR UPDATE", [job.id])
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(batcher.run_forever)
                batcher.submit(completion, None, written_to)  # a slot's, which ends at once
                while not batcher._aside:  # deferred once
                    await anyio.lowlevel.checkpoint()
                group.cancel_scope.cancel()
            await settled.wait()
        await caller.rollback()
    assert [type(e) for e in outcome] == [RuntimeError]
    assert (await client.get_job(job.id)).status is JobStatus.RUNNING
