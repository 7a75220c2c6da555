"""Cancelling or deleting a chain whose current job is running: the caller does not
wait for the handler, and once it committed no job of the chain starts an attempt —
not even the next job the running one hands on to, whether the hand-on commits after
the cancel or just before it."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import ChainStatus, Continue, JobTypeRegistry
from pgwork._continuations import continuation_job
from pgwork.adapters.state import Completion

from .conftest import ClientFactory, eventually, scalar

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


class Num(BaseModel):
    n: int


def _registry(mode: str) -> tuple[JobTypeRegistry, Any, Any]:
    reg = JobTypeRegistry()
    second = reg.job_type("second", input=Num, output=Num, entry=False)
    first = reg.job_type("first", input=Num, output=Num, continue_with=[second], mode=mode)
    return reg, first, second


async def _chain_rows(dsn: str, chain_id: Any) -> list[str]:
    rows = await scalar(
        dsn,
        "SELECT coalesce(array_agg(status::text ORDER BY chain_index), '{}')"
        " FROM pgwork.jobs WHERE chain_id = %s",
        chain_id,
    )
    return list(rows)


@pytest.mark.parametrize("op", ["cancel", "delete"])
@pytest.mark.parametrize("mode", ["staged", "atomic"])
async def test_a_caller_ends_a_running_chain_without_waiting_and_nothing_of_it_runs_after(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    pgwork_dsn: str,
    mode: str,
    op: str,
) -> None:
    reg, first, second = _registry(mode)
    client = await make_client(reg)
    running, release, ended = anyio.Event(), anyio.Event(), anyio.Event()
    seconds_run: list[int] = []

    async def handle_first(attempt: Any) -> Continue[Any]:
        running.set()
        with contextlib.suppress(asyncio.CancelledError):  # hands on anyway: the
            await release.wait()  # worker must not write it
        ended.set()
        return Continue(second, Num(n=attempt.job.input.n + 1))

    async def handle_second(attempt: Any) -> Num:
        seconds_run.append(attempt.job.input.n)
        return attempt.job.input  # type: ignore[no-any-return]

    await workers(client=client, processors={first: handle_first, second: handle_second})
    chain = await client.start_chain(conn, first, Num(n=1))
    await conn.commit()
    with anyio.fail_after(10):
        await running.wait()

    # The caller does not wait for the handler: it is still blocked when this returns.
    with anyio.fail_after(5):
        if op == "cancel":
            assert await client.cancel(conn, [chain.id]) == [chain.id]
        else:
            assert await client.delete_chains(conn, [chain.id]) == 1
        await conn.commit()
    release.set()
    with anyio.fail_after(10):
        await ended.wait()

    # A later chain runs through the same worker: by then the first job's outcome (a
    # hand-on the worker must refuse) has been dealt with.
    marker = await client.start_chain(conn, first, Num(n=100))
    await conn.commit()
    with anyio.fail_after(15):
        await client.await_chain(marker.id, timeout=15)
    assert seconds_run == [101]
    if op == "cancel":
        assert await _chain_rows(pgwork_dsn, chain.id) == ["cancelled"]
        assert (await client.get_chain(chain.id)).status is ChainStatus.CANCELLED
    else:
        assert await _chain_rows(pgwork_dsn, chain.id) == []


async def _a_backend_waits_on_a_lock(dsn: str) -> bool:
    """Whether some backend of this database waits on a row lock (the caller)."""
    return bool(
        await scalar(
            dsn,
            "SELECT count(*) > 0 FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
    )


@pytest.mark.parametrize("index", [0, 1], ids=["root-hands-on", "later-job-hands-on"])
@pytest.mark.parametrize("op", ["cancel", "delete"])
async def test_a_cancel_behind_an_uncommitted_hand_on_ends_its_continuation_too(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    pgwork_dsn: str,
    op: str,
    index: int,
) -> None:
    """The hand-on's transaction (an atomic attempt's, with its continuation) has
    written and not committed when the cancel starts; it commits while the cancel
    waits. The cancel must see the continuation and end it too."""
    reg = JobTypeRegistry()
    last = reg.job_type("last", input=Num, output=Num, entry=False)
    step = reg.job_type("step", input=Num, output=Num, entry=False, continue_with=[last])
    root = reg.job_type("root", input=Num, output=Num, continue_with=[step], mode="atomic")
    client = await make_client(reg)
    leases = {name: timedelta(seconds=60) for name in ("root", "step", "last")}
    chain = await client.start_chain(conn, root, Num(n=1))
    await conn.commit()
    [job] = await client.state.acquire(worker_id="w", leases=leases, queues=None, limit=1)
    if index == 1:
        # The root hands on to ``step`` (committed), which is the job that hands on.
        [handed] = await client.state.complete(
            None,
            completions=[
                Completion(
                    job.id,
                    job.lease_token,
                    '{"n": 1}',
                    _continuation(client, job, step, 1),
                )
            ],
        )
        assert handed.accepted
        [job] = await client.state.acquire(worker_id="w", leases=leases, queues=None, limit=1)
    target = last if index == 1 else step
    caller_done = anyio.Event()

    async def end_chain() -> None:
        if op == "cancel":
            await client.cancel(conn, [chain.id])
        else:
            await client.delete_chains(conn, [chain.id])
        await conn.commit()
        caller_done.set()

    async with (
        anyio.create_task_group() as tg,
        client.state.atomic_transaction(lease=job.lease, deadline=timedelta(seconds=30)) as tx,
    ):
        assert tx is not None
        [done] = await client.state.complete(
            tx,
            completions=[
                Completion(
                    job.id, job.lease_token, '{"n": 2}', _continuation(client, job, target, 2)
                )
            ],
        )
        assert done.accepted
        tg.start_soon(end_chain)
        await eventually(
            lambda: _a_backend_waits_on_a_lock(pgwork_dsn),
            timeout=10,
            what="the caller to wait on the hand-on's locks",
        )
        assert not caller_done.is_set()
        # (the hand-on commits as its block ends, while the caller waits)
    rows = await _chain_rows(pgwork_dsn, chain.id)
    if op == "cancel":
        assert rows[-1] == "cancelled", rows
        assert "pending" not in rows, rows
        assert (await client.get_chain(chain.id)).status is ChainStatus.CANCELLED
    else:
        assert rows == []
    assert await client.state.acquire(worker_id="w", leases=leases, queues=None, limit=5) == []


def _continuation(client: Any, job: Any, target: Any, n: int) -> Any:
    """The NewJob a worker's ``Continue(target, Num(n=n))`` makes of ``job``."""
    return continuation_job(
        client.registry,
        client.registry.get(job.type_name),
        job,
        Continue(target, Num(n=n)),
        max_bytes=client.max_payload_bytes,
    )
