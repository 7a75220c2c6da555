"""Atomic outcomes the database refuses to write: the attempt counts, the job fails
for good at ``max_attempts`` with the write error recorded, and the other members of
its group are not made to pay for it.

Two ways a handler's outcome cannot be written, each deterministic: a handler that
catches a database error and returns normally (its transaction is aborted, so nothing
more can be written in it), and a ``DEFERRABLE INITIALLY DEFERRED`` foreign key that
fails at COMMIT. Every attempt that started must emit exactly one settlement event
(the OpenTelemetry observer keeps a span and an active gauge open until it does)."""

from __future__ import annotations

import contextlib
import uuid
from collections import Counter, defaultdict
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors
from pydantic import BaseModel

from pgwork import (
    Attempt,
    ChainStart,
    JobStatus,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    RetryPolicy,
    create_client,
)
from pgwork.adapters.state import Completion
from pgwork.observability import (
    ATTEMPT_ABORTED,
    ATTEMPT_COMPLETED,
    ATTEMPT_FAILED,
    ATTEMPT_RETRIED,
    ATTEMPT_STARTED,
    LEASE_LOST,
    Event,
)

from .conftest import ClientFactory, eventually

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

MAX_ATTEMPTS = 3
GROUP = 8
BAD = 3  # the input of the job whose outcome cannot be written

_SETTLED = (ATTEMPT_COMPLETED, ATTEMPT_FAILED, ATTEMPT_RETRIED, ATTEMPT_ABORTED, LEASE_LOST)


class Num(BaseModel):
    n: int


class Settlements:
    """Counts, per attempt (job id and lease token), the attempt's start and its
    settlement events. A lost lease reported after an abort for lost ownership is the
    same settlement told twice (``action="renewal"``), not a second one."""

    def __init__(self) -> None:
        self.started: Counter[tuple[Any, Any]] = Counter()
        self.settled: dict[tuple[Any, Any], list[str]] = defaultdict(list)

    def on_event(self, event: Event) -> None:
        key = (event.fields.get("job_id"), event.fields.get("lease_token"))
        if event.name == ATTEMPT_STARTED:
            self.started[key] += 1
        elif event.name in _SETTLED:
            if event.name == LEASE_LOST and event.fields.get("action") == "renewal":
                return
            self.settled[key].append(event.name)

    def unbalanced(self) -> dict[tuple[Any, Any], tuple[int, list[str]]]:
        keys = set(self.started) | set(self.settled)
        return {
            key: (self.started[key], self.settled[key])
            for key in keys
            if self.started[key] != 1 or len(self.settled[key]) != 1
        }


async def _tables(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute("CREATE TABLE effects (n int NOT NULL)")
    await conn.execute("CREATE TABLE taken (k int PRIMARY KEY)")
    await conn.execute("INSERT INTO taken VALUES (1)")
    await conn.execute("CREATE TABLE parents (id int PRIMARY KEY)")
    await conn.execute(
        "CREATE TABLE children (parent int REFERENCES parents DEFERRABLE INITIALLY DEFERRED)"
    )
    await conn.commit()


async def _unwritable(attempt: Attempt[Num, Any], how: str) -> None:
    """What the bad job's handler does: leave its transaction unable to commit."""
    conn = attempt.connection
    if how == "swallowed":
        # Returns normally; its transaction is aborted.
        with contextlib.suppress(pg_errors.UniqueViolation):
            await conn.execute("INSERT INTO taken VALUES (1)")
    else:
        await conn.execute("INSERT INTO children VALUES (999)")  # no such parent


def _write_error(how: str) -> str:
    return "InFailedSqlTransaction" if how == "swallowed" else "ForeignKeyViolation"


async def _run(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    *,
    how: str,
    count: int,
    atomic_group: int,
    worker_count: int = 1,
) -> tuple[Any, list[Any], Counter[int], Settlements]:
    """Run ``count`` atomic jobs (the one with input ``BAD`` unwritable) on
    ``worker_count`` workers until each is final; return the client, the chains, the
    handler calls per input and the settlement counts."""
    await _tables(conn)
    reg = JobTypeRegistry()
    pay = reg.job_type(
        "pay",
        input=Num,
        mode="atomic",
        max_attempts=MAX_ATTEMPTS,
        retry=RetryPolicy(initial=timedelta(0), maximum=timedelta(0)),
    )
    client = await make_client(reg)
    calls: Counter[int] = Counter()
    settlements = Settlements()

    async def handle(attempt: Attempt[Num, Any]) -> None:
        n = attempt.job.input.n
        calls[n] += 1
        await attempt.connection.execute("INSERT INTO effects VALUES (%s)", (n,))
        if n == BAD:
            await _unwritable(attempt, how)

    inputs = [BAD] if count == 1 else list(range(count))
    started = await client.start_chains(conn, [ChainStart(pay, Num(n=n)) for n in inputs])
    await conn.commit()
    for _ in range(worker_count):
        await workers(
            client=client,
            processors={pay: handle},
            poll_interval=0.05,
            max_slots=GROUP,
            atomic_group=atomic_group,
            atomic_group_wait=0.2,
            observers=[settlements],
        )

    async def all_final() -> bool:
        jobs = [await client.get_job(s.job_id) for s in started]
        return all(job.status in (JobStatus.COMPLETED, JobStatus.FAILED) for job in jobs)

    await eventually(all_final, timeout=40, what="every job final")
    # Settled after the job became final in the database: give the reports a moment.
    await eventually(_balanced(settlements), timeout=10, what="every attempt settled")
    return client, started, calls, settlements


def _balanced(settlements: Settlements) -> Any:
    async def check() -> bool:
        return not settlements.unbalanced()

    return check


async def _assert_bad_job_failed(client: Any, started: list[Any], how: str) -> None:
    [bad] = [s for s in started if (await client.get_job(s.job_id)).input.n == BAD]
    job = await client.get_job(bad.job_id)
    assert job.status is JobStatus.FAILED
    assert job.attempt == MAX_ATTEMPTS
    assert job.last_attempt_error is not None
    assert _write_error(how) in job.last_attempt_error.type


@pytest.mark.parametrize("how", ["swallowed", "deferred"])
async def test_an_unwritable_atomic_outcome_fails_the_job_at_max_attempts(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], how: str
) -> None:
    client, started, calls, settlements = await _run(
        make_client, workers, conn, how=how, count=1, atomic_group=1
    )
    await _assert_bad_job_failed(client, started, how)
    assert calls[BAD] == MAX_ATTEMPTS
    assert sum(settlements.started.values()) == MAX_ATTEMPTS
    assert not settlements.unbalanced()
    # Each failure was written as the attempt settled, not left for later.
    names = sorted(name for names in settlements.settled.values() for name in names)
    assert names == sorted([ATTEMPT_RETRIED] * (MAX_ATTEMPTS - 1) + [ATTEMPT_FAILED])
    effects = await conn.execute("SELECT count(*) FROM effects")
    assert (await effects.fetchone()) == (0,)


@pytest.mark.parametrize("worker_count", [1, 2])
@pytest.mark.parametrize("how", ["swallowed", "deferred"])
async def test_an_unwritable_member_fails_alone_and_costs_its_group_nothing(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    how: str,
    worker_count: int,
) -> None:
    """The bad member is rolled back to its savepoint before its completion (a deferred
    check is made to fire there, not at the group's COMMIT), fails alone, counted, and
    the group commits: every other member's handler runs once, on one worker or two.
    (Control, for ``deferred``: the completion without its deferred check. The group's
    COMMIT fails, its members run again alone, and the bad job's grouped attempt goes
    uncounted: one handler call too many.)"""
    client, started, calls, settlements = await _run(
        make_client,
        workers,
        conn,
        how=how,
        count=GROUP,
        atomic_group=GROUP,
        worker_count=worker_count,
    )
    await _assert_bad_job_failed(client, started, how)
    good = [s for s in started if (await client.get_job(s.job_id)).input.n != BAD]
    for chain in good:
        assert (await client.get_job(chain.job_id)).status is JobStatus.COMPLETED
    assert calls[BAD] == MAX_ATTEMPTS, calls
    assert all(calls[n] == 1 for n in range(GROUP) if n != BAD), calls
    cur = await conn.execute("SELECT n, count(*) FROM effects GROUP BY n ORDER BY n")
    assert await cur.fetchall() == [(n, 1) for n in range(GROUP) if n != BAD]
    assert not settlements.unbalanced()
    assert sum(settlements.started.values()) == MAX_ATTEMPTS + GROUP - 1


# Rounds of (a completion that fails, then one that must be written) on one connection.
ROUNDS = 4


@pytest.mark.parametrize("how", ["swallowed", "refused"])
async def test_a_failed_atomic_completion_leaves_its_connection_usable(
    pgwork_dsn: str, conn: psycopg.AsyncConnection[Any], how: str
) -> None:
    """The completion and its COMMIT travel in one pipeline. A statement psycopg
    prepares there counts as prepared before the server answers: were the server to
    skip or refuse its Parse (the handler left the transaction aborted; the completion
    before the COMMIT was refused on purpose), the connection would keep a name its
    session lacks, and every later atomic completion on it would fail with
    ``InvalidSqlStatementName``. One pooled connection runs every attempt; psycopg
    prepares a statement from its second run on (``prepare_threshold=1``)."""
    await _tables(conn)
    reg = JobTypeRegistry()
    pay = reg.job_type("pay", input=Num, mode="atomic")
    state = await PostgresStateAdapter.connect(
        pgwork_dsn, min_size=1, max_size=1, prepare_threshold=1
    )
    client = create_client(
        state_adapter=state, notify_adapter=PostgresNotifyAdapter(pgwork_dsn), registry=reg
    )
    leases = {"pay": timedelta(seconds=60)}
    deadline = timedelta(seconds=30)
    try:
        await client.start_chains(conn, [ChainStart(pay, Num(n=n)) for n in range(2 * ROUNDS)])
        await conn.commit()
        for _ in range(ROUNDS):
            [bad] = await state.acquire(worker_id="w", leases=leases, queues=None, limit=1)
            if how == "swallowed":
                with pytest.raises(pg_errors.InFailedSqlTransaction):
                    await _complete_unwritable(state, bad, deadline)
            else:
                async with state.atomic_transaction(lease=bad.lease, deadline=deadline) as tx:
                    assert tx is not None
                    # Another token: refused, as for a lease taken over meanwhile.
                    refused = await state.complete_atomic(
                        tx, completion=Completion(bad.id, uuid.uuid4(), "null")
                    )
                assert not refused.accepted
            [good] = await state.acquire(worker_id="w", leases=leases, queues=None, limit=1)
            async with state.atomic_transaction(lease=good.lease, deadline=deadline) as tx:
                assert tx is not None
                done = await state.complete_atomic(
                    tx, completion=Completion(good.id, good.lease_token, "null")
                )
            assert done.accepted
            assert (await client.get_job(good.id)).status is JobStatus.COMPLETED
    finally:
        await client.close()


async def _complete_unwritable(state: Any, job: Any, deadline: timedelta) -> None:
    """Complete ``job`` in a transaction left as a handler that swallows a database
    error leaves it: aborted."""
    async with state.atomic_transaction(lease=job.lease, deadline=deadline) as tx:
        assert tx is not None
        with contextlib.suppress(pg_errors.UniqueViolation):
            await tx.connection.execute("INSERT INTO taken VALUES (1)")
        await state.complete_atomic(tx, completion=Completion(job.id, job.lease_token, "null"))
