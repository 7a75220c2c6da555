"""Atomic attempts committed in groups (``atomic_group``): effects once, a failing
member rolled back alone, and a lone job not held past the group's wait.

Each handler writes an effect row with the id of the transaction it ran in
(``txid_current()``), so a test sees which attempts shared a commit."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    Attempt,
    ChainStart,
    JobStatus,
    JobTypeRegistry,
    RetryPolicy,
)
from pgwork.observability import ATTEMPT_FAILED, Event
from pgwork.postgres import _atomic_group
from pgwork.worker import _atomic_group as worker_groups
from pgwork.worker._steps import AttemptSteps

from .conftest import ClientFactory, eventually, scalar

pytestmark = pytest.mark.anyio

JOBS = 40


class Num(BaseModel):
    n: int


async def _all_completed(client: Any, started: Sequence[Any]) -> None:
    """Wait until every chain ``started`` has its job completed."""

    async def all_done() -> bool:
        jobs = [await client.get_job(s.job_id) for s in started]
        return all(job.status is JobStatus.COMPLETED for job in jobs)

    await eventually(all_done, what="every job completed")


async def _start_chains(
    workers: Any,
    client: Any,
    conn: psycopg.AsyncConnection[Any],
    job_type: Any,
    handle: Any,
    count: int,
    **options: Any,
) -> tuple[list[Any], Any]:
    """Enqueue ``count`` chains of ``job_type`` (inputs 0 to ``count`` - 1), then start a
    worker for them (polling every 50 ms, with ``options``): the chains and the worker."""
    started = await client.start_chains(
        conn, [ChainStart(job_type, Num(n=n)) for n in range(count)]
    )
    await conn.commit()
    worker = await workers(
        client=client, processors={job_type: handle}, poll_interval=0.05, **options
    )
    return started, worker


async def _drain(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    *,
    atomic_group: int,
    fail_first_of: int | None = None,
) -> list[tuple[int, int, int]]:
    """Run ``JOBS`` atomic jobs (job ``fail_first_of`` raises after writing on its first
    attempt); return the effect rows (n, attempt, transaction id)."""
    await conn.execute("CREATE TABLE effects (n int, attempt int, xid bigint)")
    await conn.commit()
    reg = JobTypeRegistry()
    pay = reg.job_type(
        "pay",
        input=Num,
        mode="atomic",
        max_attempts=2,
        retry=RetryPolicy(initial=timedelta(0), maximum=timedelta(0)),
    )
    client = await make_client(reg)

    async def handle(attempt: Attempt[Num, Any]) -> None:
        await attempt.connection.execute(
            "INSERT INTO effects VALUES (%s, %s, txid_current())",
            (attempt.job.input.n, attempt.job.attempt),
        )
        if attempt.job.input.n == fail_first_of and attempt.job.attempt == 1:
            raise RuntimeError("crash after writing")

    started, _ = await _start_chains(
        workers,
        client,
        conn,
        pay,
        handle,
        JOBS,
        max_slots=8,
        atomic_group=atomic_group,
        atomic_group_wait=0.05,
    )
    await _all_completed(client, started)
    cur = await conn.execute("SELECT n, attempt, xid FROM effects ORDER BY n, attempt")
    rows = [(int(n), int(a), int(x)) for n, a, x in await cur.fetchall()]
    await conn.commit()
    return rows


async def test_grouped_attempts_commit_every_effect_once_in_fewer_transactions(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    effects = await _drain(make_client, workers, conn, atomic_group=8)
    assert [n for n, _, _ in effects] == list(range(JOBS))
    assert len({xid for _, _, xid in effects}) < JOBS


async def test_one_transaction_per_attempt_without_groups(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    """The control for the test above: ``atomic_group=1`` shares no transaction."""
    effects = await _drain(make_client, workers, conn, atomic_group=1)
    assert [n for n, _, _ in effects] == list(range(JOBS))
    assert len({xid for _, _, xid in effects}) == JOBS


async def test_a_failing_member_rolls_back_only_its_own_effect_and_is_retried(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    effects = await _drain(make_client, workers, conn, atomic_group=8, fail_first_of=5)
    assert [n for n, _, _ in effects] == list(range(JOBS))
    assert (5, 2, next(x for n, _, x in effects if n == 5)) in effects  # the retry's
    assert len({xid for _, _, xid in effects}) < JOBS


async def test_without_savepoint_rollback_a_failing_members_effect_commits(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control for the test above: a group that does not roll a failing member
    back to its savepoint commits that member's effect, and its retry adds another."""
    monkeypatch.setattr(_atomic_group, "_UNDO", b"SELECT 1")
    effects = await _drain(make_client, workers, conn, atomic_group=8, fail_first_of=5)
    assert [n for n, _, _ in effects].count(5) == 2


# A group wait long enough to see a lone member's commit held by it.
LONE_WAIT = 1.0


async def _start_alone(
    workers: Any,
    client: Any,
    conn: psycopg.AsyncConnection[Any],
    job_type: Any,
    handle: Any,
    **options: Any,
) -> Any:
    """Start a worker grouping atomic attempts by 32 with a ``LONE_WAIT`` wait, and one
    chain of ``job_type`` for it: the group's only member."""
    await workers(
        client=client,
        processors={job_type: handle},
        poll_interval=0.05,
        atomic_group=32,
        atomic_group_wait=LONE_WAIT,
        **options,
    )
    started = await client.start_chain(conn, job_type, Num(n=1))
    await conn.commit()
    return started


@pytest.mark.parametrize("build", ["batched", "control-grouped"])
async def test_a_member_that_writes_nothing_is_not_held_by_the_group_wait(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    build: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A member whose handler never used its transaction has nothing to commit but its
    completion, so it joins no group: its completion is written as a staged attempt's,
    with the worker's other completions and its next acquire, not held until the
    group's wait is over. (Control: a member taken for one that wrote: its completion
    waits for the group's commit, ``LONE_WAIT`` later.)"""
    if build == "control-grouped":
        monkeypatch.setattr(_atomic_group.PgAtomicGroup, "used", property(lambda self: True))
    reg = JobTypeRegistry()
    pay = reg.job_type("pay", input=Num, mode="atomic")
    client = await make_client(reg)
    returned: list[float] = []

    async def handle(attempt: Attempt[Num, Any]) -> int:
        returned.append(time.monotonic())
        return 7

    started = await _start_alone(workers, client, conn, pay, handle)
    await client.await_chain(started.id, timeout=30)
    completed = time.monotonic() - returned[0]
    assert (await client.get_job(started.job_id)).output == 7
    if build == "control-grouped":
        assert completed >= LONE_WAIT * 0.9
    else:
        assert completed < LONE_WAIT / 2


async def test_a_lone_job_commits_once_the_group_wait_is_over(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    pgwork_dsn: str,
) -> None:
    """Fewer jobs than the group's size: the group commits at its wait, not later (and
    not sooner: the wait is what holds it)."""
    reg = JobTypeRegistry()
    pay = reg.job_type("pay", input=Num, mode="atomic")
    client = await make_client(reg)
    returned: list[float] = []

    async def handle(attempt: Attempt[Num, Any]) -> None:
        await attempt.connection.execute("SELECT 1")  # in its group's transaction
        returned.append(time.monotonic())

    started = await _start_alone(workers, client, conn, pay, handle)
    await client.await_chain(started.id, timeout=30)
    committed = time.monotonic()
    assert len(returned) == 1
    assert LONE_WAIT * 0.9 <= committed - returned[0] <= LONE_WAIT + 2.0
    status = await scalar(pgwork_dsn, "SELECT status FROM pgwork.jobs WHERE id = %s", started.id)
    assert status == "completed"


@pytest.mark.parametrize("build", ["in-the-group", "control-on-its-own"])
async def test_a_failing_members_failure_commits_with_its_group(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    pgwork_dsn: str,
    build: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A member whose handler raises is rolled back to its savepoint and its failure is
    written in the group's transaction: it becomes visible, and is reported, only when
    the group commits (here at its wait, the job being alone). The control records it
    in a transaction of its own, right after the rollback."""
    if build == "control-on-its-own":
        monkeypatch.setattr(AttemptSteps, "failure_of", lambda self, slot, attempt, error: None)
    reg = JobTypeRegistry()
    pay = reg.job_type("pay", input=Num, mode="atomic", max_attempts=1)
    client = await make_client(reg)
    raised: list[float] = []
    reported: list[tuple[str, float]] = []

    class Failures:
        def on_event(self, event: Event) -> None:
            if event.name == ATTEMPT_FAILED:
                reported.append((event.fields["error_type"], time.monotonic()))

    async def handle(attempt: Attempt[Num, Any]) -> None:
        await attempt.connection.execute("SELECT 1")
        raised.append(time.monotonic())
        raise RuntimeError("declined")

    started = await _start_alone(workers, client, conn, pay, handle, observers=[Failures()])

    async def failed() -> bool:
        job = await client.get_job(started.job_id)
        return job.status is JobStatus.FAILED

    await eventually(failed, what="the job to fail")
    visible = time.monotonic()
    job = await client.get_job(started.job_id)
    assert job.last_attempt_error is not None
    assert job.last_attempt_error.type == "builtins.RuntimeError"
    assert len(raised) == 1
    assert [kind for kind, _ in reported] == ["builtins.RuntimeError"]
    if build == "control-on-its-own":
        assert visible - raised[0] < LONE_WAIT / 2
        return
    assert visible - raised[0] >= LONE_WAIT * 0.9
    assert reported[0][1] - raised[0] >= LONE_WAIT * 0.9


async def test_a_slow_job_type_runs_alone_once_its_handlers_outlast_the_wait(
    make_client: ClientFactory, workers: Any
) -> None:
    reg = JobTypeRegistry()
    slow = reg.job_type("slow", input=Num, mode="atomic")
    client = await make_client(reg)
    groups = worker_groups.atomic_groups(
        state=client.state,
        opener=client.state,
        notify=client.notify,
        size=8,
        wait=0.01,
        max_slots=8,
    )
    assert groups is not None
    slot: Any = type("S", (), {"job_type": slow})()
    assert groups.takes(slot)
    groups._learn("slow", 0.05)  # one slow call weighs a tenth: still grouped
    assert groups.takes(slot)
    groups._learn("slow", 0.5)
    assert not groups.takes(slot)


async def test_a_job_type_sent_alone_by_a_slow_start_comes_back_to_the_groups(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    """The first handler call is slow (a cold start), the rest quick: the type runs
    alone for a while, and its lone attempts keep its mean current, so later jobs
    share transactions again. (Control: lone attempts that do not report their
    handler's time leave the type alone for good, one transaction per job.)"""
    await conn.execute("CREATE TABLE effects (n int, xid bigint)")
    await conn.commit()
    reg = JobTypeRegistry()
    pay = reg.job_type("pay", input=Num, mode="atomic")
    client = await make_client(reg)
    calls = 0

    async def handle(attempt: Attempt[Num, Any]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            await anyio.sleep(2.0)  # ten times the wait: its mean alone outlasts it
        await attempt.connection.execute(
            "INSERT INTO effects VALUES (%s, txid_current())", (attempt.job.input.n,)
        )

    jobs = 60
    started, _ = await _start_chains(
        workers,
        client,
        conn,
        pay,
        handle,
        jobs,
        max_slots=1,
        atomic_group=32,
        # Wide enough that a quick handler's mean stays under it on a loaded machine.
        atomic_group_wait=0.2,
    )
    await _all_completed(client, started)
    cur = await conn.execute("SELECT count(*), count(DISTINCT xid) FROM effects")
    row = await cur.fetchone()
    await conn.commit()
    assert row is not None
    effects, transactions = row
    assert effects == jobs
    assert transactions <= jobs // 2, transactions


@pytest.mark.parametrize("build", ["one-waits", "control-all-wait"])
async def test_only_the_first_kept_member_of_a_group_waits_for_its_commit(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    build: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Of a group's kept members only the first waits for its commit (and commits it
    once due); the others' tasks end at once, and they are reported, and their slots
    let go, when the group ends. Three quick jobs that write, in a group whose wait is
    long: while it is open one slot task is left, and all three complete at its
    commit. (Control:
    every kept member waiting for the commit: three tasks.)"""
    if build == "control-all-wait":

        class AllWait(worker_groups._Group):
            __slots__ = ()
            waited = property(lambda self: False, lambda self, value: None)

        monkeypatch.setattr(worker_groups, "_Group", AllWait)
    reg = JobTypeRegistry()
    pay = reg.job_type("pay", input=Num, mode="atomic")
    client = await make_client(reg)
    ran: list[int] = []
    all_ran = anyio.Event()

    async def handle(attempt: Attempt[Num, Any]) -> int:
        await attempt.connection.execute("SELECT 1")  # in its group's transaction
        ran.append(attempt.job.input.n)
        if len(ran) == 3:
            all_ran.set()
        return attempt.job.input.n

    started, worker = await _start_chains(
        workers,
        client,
        conn,
        pay,
        handle,
        3,
        max_slots=2,  # one lane
        atomic_group=32,
        atomic_group_wait=LONE_WAIT,
    )
    with anyio.fail_after(10):
        await all_ran.wait()
    await anyio.sleep(LONE_WAIT / 4)
    waiting = len(worker._slots.tasks)
    await _all_completed(client, started)
    assert [(await client.get_job(s.job_id)).output for s in started] == [0, 1, 2]
    assert waiting == (3 if build == "control-all-wait" else 1)


async def test_a_member_cancelled_as_it_was_handed_the_lane_hands_it_on() -> None:
    """A lane goes to those waiting in turn; one cancelled in the moment it was handed
    the lane (before it ran again) passes it to the next, or the lane would stay taken
    by no one. (Controls: a cancelled waiter that only leaves the queue: the third one
    waits for ever; ``waiting`` as the queue's length: the fourth still counts.)"""
    lane = worker_groups._Lane()
    first, second, third = object(), object(), object()
    await lane.take(first)
    second_task = asyncio.ensure_future(lane.take(second))
    third_task = asyncio.ensure_future(lane.take(third))
    await asyncio.sleep(0)  # both queued
    assert lane.waiting == 2
    lane.give(first)
    assert lane.owner is second
    second_task.cancel()  # before it could run
    with anyio.fail_after(10):
        await third_task
    assert lane.owner is third
    assert second_task.cancelled()
    # One cancelled while it waits no longer counts, even before it has run to take
    # itself off the queue.
    fourth = asyncio.ensure_future(lane.take(object()))
    await asyncio.sleep(0)
    assert lane.waiting == 1
    fourth.cancel()
    assert lane.waiting == 0
    assert not lane.awaited
    await asyncio.gather(fourth, return_exceptions=True)
    lane.give(third)
    assert lane.owner is None


async def _open_transactions(dsn: str) -> int:
    """Backends of this database idle inside a transaction, other than the asker's."""
    count = await scalar(
        dsn,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND state LIKE 'idle in transaction%%' AND pid <> pg_backend_pid()",
    )
    return int(count)


@pytest.mark.parametrize("build", ["lazy", "control-eager"])
async def test_a_member_that_writes_nothing_holds_no_transaction_open(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    pgwork_dsn: str,
    build: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A member's savepoint, and its group's transaction, open when the member first
    uses its connection: while a handler that writes nothing runs, no transaction is
    open for it, and its completion is written with the worker's staged ones.
    (Control: a group that opens the member's savepoint as it enters: the lane sits
    idle in its transaction while the handler runs.)"""
    if build == "control-eager":
        enter = _atomic_group.PgAtomicGroup.enter

        async def eager(self: Any, **kw: Any) -> Any:
            tx: Any = await enter(self, **kw)
            await tx.connection.execute("SELECT 1")  # its first use opens it
            self._touched = False  # (and it still counts as a member that wrote nothing)
            return tx

        monkeypatch.setattr(_atomic_group.PgAtomicGroup, "enter", eager)
    reg = JobTypeRegistry()
    pay = reg.job_type("pay", input=Num, mode="atomic")
    client = await make_client(reg)
    running, release = anyio.Event(), anyio.Event()

    async def handle(attempt: Attempt[Num, Any]) -> int:
        running.set()
        await release.wait()
        return attempt.job.input.n * 10

    started = await _start_alone(workers, client, conn, pay, handle)
    with anyio.fail_after(10):
        await running.wait()
    held_open = await _open_transactions(pgwork_dsn)
    release.set()
    await client.await_chain(started.id, timeout=30)
    job = await client.get_job(started.job_id)
    assert job.status is JobStatus.COMPLETED
    assert job.output == 10
    assert held_open == (1 if build == "control-eager" else 0)


async def test_members_that_write_and_members_that_do_not_share_groups(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    """Half the handlers write, half do not: every job completes with its output, each
    writer's effect is there once, and the writers still share transactions (the
    others' completions join whichever group they were in)."""
    await conn.execute("CREATE TABLE effects (n int, xid bigint)")
    await conn.commit()
    reg = JobTypeRegistry()
    pay = reg.job_type("pay", input=Num, mode="atomic")
    client = await make_client(reg)

    async def handle(attempt: Attempt[Num, Any]) -> int:
        n = attempt.job.input.n
        if n % 2 == 0:
            await attempt.connection.execute(
                "INSERT INTO effects VALUES (%s, txid_current())", (n,)
            )
        return n

    started, _ = await _start_chains(
        workers,
        client,
        conn,
        pay,
        handle,
        JOBS,
        max_slots=8,
        atomic_group=8,
        atomic_group_wait=0.05,
    )
    await _all_completed(client, started)
    outputs = [(await client.get_job(s.job_id)).output for s in started]
    assert outputs == list(range(JOBS))
    cur = await conn.execute("SELECT n, xid FROM effects ORDER BY n")
    rows = await cur.fetchall()
    await conn.commit()
    assert [n for n, _ in rows] == list(range(0, JOBS, 2))
    assert len({xid for _, xid in rows}) < JOBS // 2


@pytest.mark.parametrize("build", ["renewed", "control-not-renewed"])
async def test_a_grouped_members_lease_is_renewed_while_its_handler_runs(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    pgwork_dsn: str,
    build: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A grouped member's row is not locked while its handler runs, so nothing but its
    lease keeps another worker's reaper off it: the worker renews it as it renews a
    staged attempt's. Here the handler outlasts its lease twice over and its lease is
    still ahead of the clock. (Control: grouped members left out of the renewals, as
    atomic attempts were while their row was locked: the lease runs out.)"""
    if build == "control-not-renewed":
        from pgwork.worker._slots import Slots

        holders = Slots.lease_holders

        def staged_only(self: Any) -> list[Any]:
            return [s for s in holders(self) if s.staged or s.attempt is None]

        monkeypatch.setattr(Slots, "lease_holders", staged_only)
    reg = JobTypeRegistry()
    pay = reg.job_type(
        "pay",
        input=Num,
        mode="atomic",
        lease=timedelta(seconds=1),
        timeout=timedelta(seconds=30),
    )
    client = await make_client(reg)
    running, release = anyio.Event(), anyio.Event()

    async def handle(attempt: Attempt[Num, Any]) -> None:
        running.set()
        await release.wait()

    started = await _start_alone(workers, client, conn, pay, handle)
    with anyio.fail_after(10):
        await running.wait()
    await anyio.sleep(2.0)
    ahead = await scalar(
        pgwork_dsn, "SELECT leased_until > now() FROM pgwork.jobs WHERE id = %s", started.job_id
    )
    release.set()
    if build == "control-not-renewed":
        assert ahead is False
        return
    assert ahead is True
    await client.await_chain(started.id, timeout=30)
    job = await client.get_job(started.job_id)
    assert job.status is JobStatus.COMPLETED
    assert job.attempt == 1


@pytest.mark.parametrize("build", ["correct", "control-abort-ignored"])
async def test_a_member_cancelled_while_it_waits_for_its_lane_never_runs(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    build: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One lane: the second job waits for it while the first one's handler runs, and is
    cancelled meanwhile. Its lease is renewed while it waits (its row is not locked),
    so the renewal finds it cancelled and aborts it before its handler starts: the
    handler never runs, and the job ends cancelled. (Control: an attempt built without
    the abort recorded while it waited: the cancelled job's handler runs.)"""
    if build == "control-abort-ignored":
        attempt = AttemptSteps.build_attempt

        def forgetful(self: Any, slot: Any, transaction: object | None) -> Any:
            slot.pending_abort = None
            return attempt(self, slot, transaction)

        monkeypatch.setattr(AttemptSteps, "build_attempt", forgetful)
    reg = JobTypeRegistry()
    pay = reg.job_type(
        "pay", input=Num, mode="atomic", lease=timedelta(seconds=0.6), timeout=timedelta(seconds=30)
    )
    client = await make_client(reg)
    ran: list[int] = []
    first_runs, release = anyio.Event(), anyio.Event()

    async def handle(attempt: Attempt[Num, Any]) -> None:
        ran.append(attempt.job.input.n)
        if attempt.job.input.n == 0:
            first_runs.set()
            await release.wait()

    first = await client.start_chain(conn, pay, Num(n=0))
    await conn.commit()
    await workers(
        client=client,
        processors={pay: handle},
        poll_interval=0.05,
        max_slots=2,  # one lane
        atomic_group=32,
        atomic_group_wait=0.01,
    )
    with anyio.fail_after(10):
        await first_runs.wait()
    second = await client.start_chain(conn, pay, Num(n=1))
    await conn.commit()

    async def waiting() -> bool:
        return (await client.get_job(second.job_id)).status is JobStatus.RUNNING

    await eventually(waiting, what="the second job taken, waiting for the lane")
    await client.cancel(conn, [second.id])
    await conn.commit()
    await anyio.sleep(0.6)  # a renewal or more, at a third of the lease
    release.set()
    await client.await_chain(first.id, timeout=30)

    async def ended() -> bool:
        return (await client.get_job(second.job_id)).status is JobStatus.CANCELLED

    await eventually(ended, what="the second job cancelled")
    await anyio.sleep(0.2)
    assert ran == ([0, 1] if build == "control-abort-ignored" else [0])


async def test_a_rolled_back_member_leaves_the_groups_completion_prepared(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """psycopg deallocates every prepared statement of a session after a ROLLBACK its
    cursor sees, once it prepared statements of its own there. A member rolled back to
    its savepoint must not take the group's prepared completion with it: the members
    after it complete in the same group, each handler called once, and the completion
    is prepared once per connection. (Control: the rollback sent through psycopg's
    cursor: the completion is prepared again after each member rolled back.)"""
    prepares: dict[int, int] = {}
    execute = psycopg.AsyncCursor.execute

    async def counted(cur: psycopg.AsyncCursor[Any], query: Any, *args: Any, **kw: Any) -> Any:
        if isinstance(query, bytes) and query.startswith(b"PREPARE pgwork_atomic_complete"):
            key = id(cur.connection)
            prepares[key] = prepares.get(key, 0) + 1
        return await execute(cur, query, *args, **kw)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", counted)
    await conn.execute("CREATE TABLE effects (n int)")
    await conn.commit()
    reg = JobTypeRegistry()
    pay = reg.job_type(
        "pay",
        input=Num,
        mode="atomic",
        max_attempts=2,
        retry=RetryPolicy(initial=timedelta(0), maximum=timedelta(0)),
    )
    client = await make_client(reg)
    calls: dict[int, int] = {}

    async def handle(attempt: Attempt[Num, Any]) -> None:
        n = attempt.job.input.n
        calls[n] = calls.get(n, 0) + 1
        # A statement psycopg prepares on the lane's connection.
        await attempt.connection.execute("SELECT 1", prepare=True)
        await attempt.connection.execute("INSERT INTO effects VALUES (%s)", (n,))
        if n % 2 == 0 and attempt.job.attempt == 1:
            raise RuntimeError("rolled back")

    # Two slots: one lane, whose members run one after another.
    started, _ = await _start_chains(
        workers, client, conn, pay, handle, 8, max_slots=2, atomic_group=8, atomic_group_wait=0.2
    )
    await _all_completed(client, started)
    assert all(calls[n] == (2 if n % 2 == 0 else 1) for n in range(8)), calls
    cur = await conn.execute("SELECT n, count(*) FROM effects GROUP BY n ORDER BY n")
    assert await cur.fetchall() == [(n, 1) for n in range(8)]
    assert prepares
    assert all(count == 1 for count in prepares.values()), prepares


async def test_every_member_of_a_group_writes_under_its_deferred_constraints(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    """A member's deferred checks fire before its completion, in its savepoint; the
    next member's constraints are deferred again, as in a transaction of its own: each
    handler inserts a child before its parent (allowed by a ``DEFERRABLE INITIALLY
    DEFERRED`` foreign key), and every job completes on its first attempt, in groups.
    (Control: the checks left immediate after the first member's completion: the
    members after it fail their child's insert and run again.)"""
    await conn.execute("CREATE TABLE parents (id int PRIMARY KEY, xid bigint)")
    await conn.execute(
        "CREATE TABLE children (parent int REFERENCES parents DEFERRABLE INITIALLY DEFERRED)"
    )
    await conn.commit()
    reg = JobTypeRegistry()
    pay = reg.job_type(
        "pay",
        input=Num,
        mode="atomic",
        max_attempts=2,
        retry=RetryPolicy(initial=timedelta(0), maximum=timedelta(0)),
    )
    client = await make_client(reg)
    calls: dict[int, int] = {}

    async def handle(attempt: Attempt[Num, Any]) -> None:
        n = attempt.job.input.n
        calls[n] = calls.get(n, 0) + 1
        await attempt.connection.execute("INSERT INTO children VALUES (%s)", (n,))
        await attempt.connection.execute("INSERT INTO parents VALUES (%s, txid_current())", (n,))

    # Two slots: one lane, whose members run one after another.
    started, _ = await _start_chains(
        workers, client, conn, pay, handle, 8, max_slots=2, atomic_group=8, atomic_group_wait=0.2
    )
    await _all_completed(client, started)
    assert all(calls[n] == 1 for n in range(8)), calls
    assert await scalar(conn.info.dsn, "SELECT count(*) FROM children") == 8
    # Grouped: fewer transactions than jobs.
    assert await scalar(conn.info.dsn, "SELECT count(DISTINCT xid) FROM parents") < 8


async def test_a_members_nested_transaction_rolled_back_leaves_its_group_whole(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    """A handler that swallows an error in a nested transaction of its own (``async
    with attempt.connection.transaction():``, the documented way) has psycopg roll
    back to its savepoint and then deallocate every prepared statement of the session,
    the group's prepared completion among them. The group prepares it again: every
    member completes in its group, each handler called once. (Control: the group
    trusting its completion to stay prepared for the connection's life: the member's
    completion finds none, the group is lost and its members run again.)"""
    await conn.execute("CREATE TABLE effects (n int)")
    await conn.execute("CREATE TABLE taken (k int PRIMARY KEY)")
    await conn.execute("INSERT INTO taken VALUES (1)")
    await conn.commit()
    reg = JobTypeRegistry()
    pay = reg.job_type(
        "pay",
        input=Num,
        mode="atomic",
        max_attempts=2,
        retry=RetryPolicy(initial=timedelta(0), maximum=timedelta(0)),
    )
    client = await make_client(reg)
    calls: dict[int, int] = {}

    async def handle(attempt: Attempt[Num, Any]) -> None:
        n = attempt.job.input.n
        calls[n] = calls.get(n, 0) + 1
        # A statement psycopg prepares on the lane's connection.
        await attempt.connection.execute("INSERT INTO effects VALUES (%s)", (n,), prepare=True)
        with contextlib.suppress(psycopg.errors.UniqueViolation):
            async with attempt.connection.transaction():
                await attempt.connection.execute("INSERT INTO taken VALUES (1)")

    # Two slots: one lane, whose members run one after another.
    started, _ = await _start_chains(
        workers, client, conn, pay, handle, 8, max_slots=2, atomic_group=8, atomic_group_wait=0.2
    )
    await _all_completed(client, started)
    assert all(calls[n] == 1 for n in range(8)), calls
    cur = await conn.execute("SELECT n, count(*) FROM effects GROUP BY n ORDER BY n")
    assert await cur.fetchall() == [(n, 1) for n in range(8)]
