"""A caller's transaction that holds one job's row (cancelling it, completing it, or
just reading it ``FOR UPDATE``) delays at most that job: the worker's lease renewal and
its turn statement skip the row instead of waiting on it, and the other jobs it runs
keep their leases and complete once each."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import ChainStatus, Continue, JobStatus, JobTypeRegistry
from pgwork._continuations import continuation_job
from pgwork.adapters.state import Completion
from pgwork.records import AbortReason

from .conftest import ClientFactory, eventually, scalar

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

JOBS = 6
LEASE = timedelta(seconds=1.5)


class Num(BaseModel):
    n: int


async def _all_renewed_past(dsn: str, ids: list[Any], moment: Any) -> bool:
    """Whether every job of ``ids`` is running with a lease renewed to end after
    ``moment``."""
    count = await scalar(
        dsn,
        "SELECT count(*) FROM pgwork.jobs"
        " WHERE id = ANY(%s) AND status = 'running' AND leased_until > %s",
        ids,
        moment,
    )
    return bool(count == len(ids))


async def _count(dsn: str, ids: list[Any], status: str) -> int:
    return int(
        await scalar(
            dsn, "SELECT count(*) FROM pgwork.jobs WHERE id = ANY(%s) AND status = %s", ids, status
        )
    )


@pytest.mark.parametrize("hold", ["select_for_update", "uncommitted_cancel"])
async def test_a_caller_holding_one_running_job_delays_no_other_job(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    workers: Any,
    pgwork_dsn: str,
    hold: str,
) -> None:
    reg = JobTypeRegistry()
    step = reg.job_type("step", input=Num, lease=LEASE)
    client = await make_client(reg)
    chains = [await client.start_chain(conn, step, Num(n=i)) for i in range(JOBS)]
    await conn.commit()
    ids = [c.job_id for c in chains]
    held, others = ids[0], ids[1:]

    runs: Counter[int] = Counter()
    aborted: list[tuple[int, AbortReason]] = []
    all_started = anyio.Event()
    release = anyio.Event()

    async def handle(attempt: Any) -> None:
        runs[attempt.job.input.n] += 1
        if len(runs) == JOBS:
            all_started.set()
        try:
            await release.wait()
        finally:
            if attempt.abort_reason is not None:
                aborted.append((attempt.job.input.n, attempt.abort_reason))

    await workers(client=client, processors={step: handle}, max_slots=JOBS, prefetch=0)
    with anyio.fail_after(20):
        await all_started.wait()

    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as caller:
        if hold == "select_for_update":
            await caller.execute("SELECT id FROM pgwork.jobs WHERE id = %s FOR UPDATE", [held])
        else:
            await client.cancel(caller, [chains[0].id])
        locked_at = await scalar(pgwork_dsn, "SELECT clock_timestamp()")
        # The other leases go on being renewed while the row is held, for two lease
        # durations: a renewal that waited on the held row would renew none of them.
        await eventually(
            lambda: _all_renewed_past(pgwork_dsn, others, locked_at + 2 * LEASE),
            timeout=15,
            what="the other leases to be renewed while one row is held",
        )
        # Every handler returns, the held job's too: the other completions are written
        # while the row is still held (the held job's is deferred, not waited on).
        release.set()
        await eventually(
            lambda: _count_is(pgwork_dsn, others, "completed", len(others)),
            timeout=15,
            what="the other jobs to complete while one row is held",
        )
        assert await _count(pgwork_dsn, [held], "running") == 1
        if hold == "select_for_update":
            await caller.rollback()
        else:
            await caller.commit()

    final = "completed" if hold == "select_for_update" else "cancelled"
    await eventually(
        lambda: _count_is(pgwork_dsn, [held], final, 1), timeout=15, what=f"the held job {final}"
    )
    assert runs == Counter(range(JOBS))  # every job ran once
    assert all(n == 0 for n, _ in aborted), aborted  # no other attempt was aborted


async def _count_is(dsn: str, ids: list[Any], status: str, expected: int) -> bool:
    return await _count(dsn, ids, status) == expected


async def test_a_caller_holding_a_chain_root_delays_only_the_end_of_that_chain(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    workers: Any,
    pgwork_dsn: str,
) -> None:
    """The last job of a chain writes its end on the chain's root row. A caller holding
    that row (enqueueing a job blocked on the chain locks it, as does deleting it)
    defers that completion only: the rest of the worker's batch is written."""
    reg = JobTypeRegistry()
    last = reg.job_type("last", input=Num, entry=False, lease=LEASE)
    first = reg.job_type("first", input=Num, continue_with=[last], lease=LEASE)
    step = reg.job_type("step", input=Num, lease=LEASE)
    client = await make_client(reg)
    chain = await client.start_chain(conn, first, Num(n=0))
    others = [(await client.start_chain(conn, step, Num(n=i))).job_id for i in range(1, JOBS)]
    await conn.commit()

    runs: Counter[int] = Counter()
    all_started = anyio.Event()
    release = anyio.Event()

    async def handle_first(attempt: Any) -> Continue[Any]:
        return Continue(last, Num(n=0))

    async def handle(attempt: Any) -> None:
        runs[attempt.job.input.n] += 1
        if len(runs) == JOBS:
            all_started.set()
        await release.wait()

    await workers(
        client=client,
        processors={first: handle_first, last: handle, step: handle},
        max_slots=JOBS,
        prefetch=0,
    )
    with anyio.fail_after(20):
        await all_started.wait()
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as caller:
        await caller.execute("SELECT id FROM pgwork.jobs WHERE id = %s FOR UPDATE", [chain.id])
        release.set()
        await eventually(
            lambda: _count_is(pgwork_dsn, others, "completed", len(others)),
            timeout=15,
            what="the other jobs to complete while the chain's root is held",
        )
        assert (await client.get_chain(chain.id)).status is ChainStatus.ACTIVE
        await caller.rollback()
    with anyio.fail_after(15):
        await client.await_chain(chain.id, timeout=15)
    assert runs == Counter(range(JOBS))


async def test_the_reaper_skips_a_job_whose_chain_root_a_caller_holds(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """Reaping a job past its attempts fails its chain on the root row. While a caller
    holds that row the reaper does not wait for it: the job is left for a later reap,
    which fails it and its chain once the caller lets go."""
    reg = JobTypeRegistry()
    last = reg.job_type("last", input=Num, entry=False, max_attempts=1)
    first = reg.job_type("first", input=Num, continue_with=[last])
    client = await make_client(reg)
    chain = await client.start_chain(conn, first, Num(n=0))
    await conn.commit()
    leases = {"first": timedelta(seconds=60), "last": timedelta(milliseconds=1)}
    [root] = await client.state.acquire(worker_id="w", leases=leases, queues=None, limit=1)
    [handed] = await client.state.complete(
        None,
        completions=[
            Completion(
                root.id,
                root.lease_token,
                "null",
                continuation_job(
                    client.registry, first, root, Continue(last, Num(n=1)), max_bytes=1 << 20
                ),
            )
        ],
    )
    assert handed.accepted
    [job] = await client.state.acquire(worker_id="w", leases=leases, queues=None, limit=1)
    await eventually(
        lambda: _lease_expired(pgwork_dsn, job.id), timeout=5, what="the lease to expire"
    )
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as caller:
        await caller.execute("SELECT id FROM pgwork.jobs WHERE id = %s FOR UPDATE", [chain.id])
        with anyio.fail_after(5):
            held = await client.state.reap(type_names=["last"], exclude_worker="reaper")
        assert held == []
        await caller.rollback()
    [reaped] = await client.state.reap(type_names=["last"], exclude_worker="reaper")
    assert (reaped.job_id, reaped.status) == (job.id, JobStatus.FAILED)
    assert (await client.get_chain(chain.id)).status is ChainStatus.FAILED


async def test_the_reaper_skips_a_job_whose_worker_waits_in_line_for_its_row(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """A worker waiting in line for a held row (``renew_in_line``) first takes the job's
    lease-line lock. A reaper leaves that job alone even once the row is free and the
    lease has run out: the moment a caller lets go of the row, the waiting worker, not
    a reaper, gets the job. (Control: a reaper that does not test the lease line
    takes the job here.)"""
    reg = JobTypeRegistry()
    step = reg.job_type("step", input=Num)
    client = await make_client(reg)
    await client.start_chain(conn, step, Num(n=0))
    await conn.commit()
    leases = {"step": timedelta(milliseconds=1)}
    [job] = await client.state.acquire(worker_id="w", leases=leases, queues=None, limit=1)
    await eventually(
        lambda: _lease_expired(pgwork_dsn, job.id), timeout=5, what="the lease to expire"
    )
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as line:
        await line.execute(
            client.state.statements.leases.take_lease_line, {"id": job.id, "wait_ms": "1000"}
        )
        assert await client.state.reap(type_names=["step"], exclude_worker="reaper") == []
        await line.rollback()
    [reaped] = await client.state.reap(type_names=["step"], exclude_worker="reaper")
    assert reaped.job_id == job.id


async def _lease_expired(dsn: str, job_id: Any) -> bool:
    return bool(
        await scalar(dsn, "SELECT leased_until < now() FROM pgwork.jobs WHERE id = %s", job_id)
    )


async def test_jobs_whose_leases_ran_out_while_a_caller_held_them_stay_with_their_worker(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    workers: Any,
    pgwork_dsn: str,
) -> None:
    """A caller holds running jobs' rows past the jobs' leases: the worker cannot renew
    them meanwhile, so the leases run out in the table. When the caller lets go, the
    worker running the jobs must get each row before any reaper (it waits in line for
    them, and reapers skip a job whose worker waits in line), and each job runs once.
    (Controls: without the waiter, the worker renews at its next tick and a reaper
    that looks the moment the caller commits takes every job; with the waiter but a
    reaper that does not skip the jobs waited for, it takes some of them in about one
    run of five.)"""
    reg = JobTypeRegistry()
    step = reg.job_type("step", input=Num, lease=LEASE)
    client = await make_client(reg)
    chains = [await client.start_chain(conn, step, Num(n=i)) for i in range(JOBS)]
    await conn.commit()
    ids = [c.job_id for c in chains]
    runs: Counter[tuple[int, int]] = Counter()
    all_started = anyio.Event()
    release = anyio.Event()

    async def handle(attempt: Any) -> None:
        runs[attempt.job.input.n, attempt.job.attempt] += 1
        if len(runs) == JOBS:
            all_started.set()
        await release.wait()

    await workers(client=client, processors={step: handle}, max_slots=JOBS, prefetch=0)
    with anyio.fail_after(20):
        await all_started.wait()
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as caller:
        await caller.execute("SELECT id FROM pgwork.jobs WHERE id = ANY(%s) FOR UPDATE", [ids])
        await eventually(
            lambda: _all_expired(pgwork_dsn, ids), timeout=15, what="the leases to run out"
        )
        await caller.commit()
    # A reaper that looks at once: the leases ran out, and nothing holds the rows.
    assert await client.state.reap(type_names=["step"], exclude_worker="r", limit=JOBS) == []
    released_at = await scalar(pgwork_dsn, "SELECT clock_timestamp()")
    await eventually(
        lambda: _all_renewed_past(pgwork_dsn, ids, released_at),
        timeout=15,
        what="the worker to renew the leases once the caller let go",
    )
    release.set()
    await eventually(
        lambda: _count_is(pgwork_dsn, ids, "completed", JOBS),
        timeout=15,
        what="the jobs to complete",
    )
    assert runs == Counter((n, 1) for n in range(JOBS))  # each ran once, at attempt 1


async def _all_expired(dsn: str, ids: list[Any]) -> bool:
    count = await scalar(
        dsn, "SELECT count(*) FROM pgwork.jobs WHERE id = ANY(%s) AND leased_until < now()", ids
    )
    return bool(count == len(ids))
