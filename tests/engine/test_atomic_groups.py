"""Atomic attempts committed in groups (``atomic_group``): effects once, a failing
member rolled back alone, and a lone job not held past the group's wait.

Each handler writes an effect row with the id of the transaction it ran in
(``txid_current()``), so a test sees which attempts shared a commit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any
from uuid import uuid4

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
from pgwork.adapters.state import Lease, NextMember
from pgwork.observability import ATTEMPT_FAILED, Event
from pgwork.postgres import _atomic_group
from pgwork.worker import _atomic_group as worker_groups
from pgwork.worker._runner import SlotRunner

from .conftest import ClientFactory, eventually, scalar

pytestmark = pytest.mark.anyio

JOBS = 40
DAY = timedelta(days=1)


class Num(BaseModel):
    n: int


async def _all_completed(client: Any, started: Sequence[Any]) -> None:
    """Wait until every chain ``started`` has its job completed."""

    async def all_done() -> bool:
        jobs = [await client.get_job(s.job_id) for s in started]
        return all(job.status is JobStatus.COMPLETED for job in jobs)

    await eventually(all_done, what="every job completed")


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

    started = await client.start_chains(conn, [ChainStart(pay, Num(n=n)) for n in range(JOBS)])
    await conn.commit()
    await workers(
        client=client,
        processors={pay: handle},
        poll_interval=0.05,
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
    in a transaction of its own, right after the rollback, as pgwork did until
    session 14."""
    if build == "control-on-its-own":
        monkeypatch.setattr(SlotRunner, "_failure_of", lambda self, slot, attempt, error: None)
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
        state=client.state, notify=client.notify, size=8, wait=0.01, max_slots=8
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
            await anyio.sleep(1.0)  # ten times the wait: its mean alone outlasts it
        await attempt.connection.execute(
            "INSERT INTO effects VALUES (%s, txid_current())", (attempt.job.input.n,)
        )

    jobs = 60
    started = await client.start_chains(conn, [ChainStart(pay, Num(n=n)) for n in range(jobs)])
    await conn.commit()
    await workers(
        client=client,
        processors={pay: handle},
        poll_interval=0.05,
        max_slots=1,
        atomic_group=32,
        atomic_group_wait=0.05,
    )

    await _all_completed(client, started)
    cur = await conn.execute("SELECT count(*), count(DISTINCT xid) FROM effects")
    row = await cur.fetchone()
    await conn.commit()
    assert row is not None
    effects, transactions = row
    assert effects == jobs
    assert transactions <= jobs // 2, transactions


async def test_a_cancelled_member_holding_the_groups_timer_hands_it_to_another(
    make_client: ClientFactory,
) -> None:
    """Of a group's kept members waiting for its commit, one holds a timer for the due
    time and the others wait to be woken. If that one is cancelled and cannot commit
    (here its lane stays busy longer than it tries), another waiting member takes the
    timer and commits the group once the lane is free. (Control: a cancelled timer
    holder that does not wake the others leaves them waiting for ever.)"""
    client = await make_client(JobTypeRegistry())
    groups = worker_groups.AtomicGroups(
        state=client.state, notify=client.notify, size=8, wait=0.05, lanes=1
    )
    lane = groups._lanes[0]
    group = lane.group = worker_groups._Group(await client.state.open_atomic_group())
    group.due = time.monotonic() + groups.wait
    busy = object()
    await lane.take(busy)
    first = anyio.CancelScope()

    async def first_member() -> None:
        with first:
            await groups._committed(lane, group)

    async with anyio.create_task_group() as tg:
        tg.start_soon(first_member)
        await anyio.sleep(0.01)
        assert group.timed
        tg.start_soon(groups._committed, lane, group)
        await anyio.sleep(0.01)
        first.cancel()
        await anyio.sleep(groups.wait + 5.0 + 0.3)  # its commit gave up on the lane
        assert not group.done.is_set()
        lane.give(busy)
        with anyio.fail_after(5):
            await group.done.wait()
    assert group.error is None
    assert lane.group is None


async def test_a_member_starts_the_entry_of_the_one_waiting_for_its_lane(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One lane, two slots: while a member's handler runs, the next job waits for the
    lane, and the member's completion names it (``then``), so that its entry travels
    with that completion; the completion that fills a group carries its commit too
    (``commit``), and the next group begins with the entry. Each handler returns once
    the next member waits (the last one at once). (Controls: a lane that never names
    its next member: no completion carries an entry; a group committed on its own:
    no completion carries a commit.)"""
    await conn.execute("CREATE TABLE effects (n int, xid bigint)")
    await conn.commit()
    reg = JobTypeRegistry()
    pay = reg.job_type("pay", input=Num, mode="atomic")
    client = await make_client(reg)
    jobs = 6
    lanes: set[Any] = set()
    queued = [anyio.Event()]  # set when a member queues for a busy lane
    take = worker_groups._Lane.take

    async def noted_take(self: Any, owner: object, entry: Any = None) -> None:
        lanes.add(self)
        if entry is not None and self.owner is not None:
            queued[0].set()  # (it is in the queue before anyone wakes)
        await take(self, owner, entry)

    monkeypatch.setattr(worker_groups._Lane, "take", noted_take)
    sent: list[tuple[bool, bool]] = []  # (with an entry, with the commit)
    complete = _atomic_group.PgAtomicGroup.complete

    async def noted(self: Any, completion: Any, *, then: Any = None, commit: bool = False) -> Any:
        sent.append((then is not None, commit))
        return await complete(self, completion, then=then, commit=commit)

    monkeypatch.setattr(_atomic_group.PgAtomicGroup, "complete", noted)
    started = 0

    async def handle(attempt: Attempt[Num, Any]) -> None:
        nonlocal started
        started += 1
        await attempt.connection.execute(
            "INSERT INTO effects VALUES (%s, txid_current())", (attempt.job.input.n,)
        )
        if started < jobs:
            with anyio.fail_after(10):
                await queued[0].wait()
            queued[0] = anyio.Event()

    chains = await client.start_chains(conn, [ChainStart(pay, Num(n=n)) for n in range(jobs)])
    await conn.commit()
    await workers(
        client=client,
        processors={pay: handle},
        poll_interval=0.05,
        max_slots=2,  # one lane
        atomic_group=jobs // 2,  # two groups, each committed when full
        atomic_group_wait=60.0,
    )
    await _all_completed(client, chains)
    assert len(lanes) == 1
    cur = await conn.execute("SELECT count(DISTINCT n), count(*), count(DISTINCT xid) FROM effects")
    assert await cur.fetchone() == (jobs, jobs, 2)
    await conn.commit()
    # Each but the last names the next; the third and sixth fill their groups.
    entry, commit = (True, False), (True, True)
    assert sent == [entry, entry, commit, entry, entry, (False, True)], sent


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
    # One cancelled while it waits no longer counts, nor is it named as next, even
    # before it has run to take itself off the queue.
    fourth = asyncio.ensure_future(lane.take(object(), NextMember(Lease(uuid4(), uuid4()), DAY)))
    await asyncio.sleep(0)
    assert lane.waiting == 1
    assert lane.next_member() is not None
    fourth.cancel()
    assert lane.waiting == 0
    assert lane.next_member() is None
    await asyncio.gather(fourth, return_exceptions=True)
    lane.give(third)
    assert lane.owner is None


async def test_a_group_due_while_its_next_member_was_entered_commits_with_that_one(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The group falls due while the second member's completion is on its way (held
    here past the due time), and that completion had entered the third member in the
    group: the group is committed with the third one's completion, not on its own
    with the third left to begin another. (Control: a due group committed at once
    after its member: a separate commit, two transactions.)"""
    await conn.execute("CREATE TABLE effects (n int, xid bigint)")
    await conn.commit()
    reg = JobTypeRegistry()
    pay = reg.job_type("pay", input=Num, mode="atomic")
    client = await make_client(reg)
    jobs, wait = 3, 1.0
    queued = [anyio.Event()]  # set when a member queues for a busy lane
    take = worker_groups._Lane.take

    async def noted_take(self: Any, owner: object, entry: Any = None) -> None:
        if entry is not None and self.owner is not None:
            queued[0].set()
        await take(self, owner, entry)

    monkeypatch.setattr(worker_groups._Lane, "take", noted_take)
    sent: list[tuple[bool, bool]] = []
    commits = 0
    complete = _atomic_group.PgAtomicGroup.complete
    commit = _atomic_group.PgAtomicGroup.commit

    async def noted(self: Any, completion: Any, *, then: Any = None, commit: bool = False) -> Any:
        sent.append((then is not None, commit))
        result = await complete(self, completion, then=then, commit=commit)
        if len(sent) == 2:
            await anyio.sleep(wait * 1.5)  # the group falls due meanwhile
        return result

    async def counted_commit(self: Any) -> None:
        nonlocal commits
        commits += 1
        await commit(self)

    monkeypatch.setattr(_atomic_group.PgAtomicGroup, "complete", noted)
    monkeypatch.setattr(_atomic_group.PgAtomicGroup, "commit", counted_commit)
    started = 0

    async def handle(attempt: Attempt[Num, Any]) -> None:
        nonlocal started
        started += 1
        await attempt.connection.execute(
            "INSERT INTO effects VALUES (%s, txid_current())", (attempt.job.input.n,)
        )
        if started < jobs:
            with anyio.fail_after(10):
                await queued[0].wait()
            queued[0] = anyio.Event()

    chains = await client.start_chains(conn, [ChainStart(pay, Num(n=n)) for n in range(jobs)])
    await conn.commit()
    await workers(
        client=client,
        processors={pay: handle},
        poll_interval=0.05,
        max_slots=2,  # one lane
        atomic_group=32,
        atomic_group_wait=wait,
    )
    await _all_completed(client, chains)
    cur = await conn.execute("SELECT count(DISTINCT n), count(DISTINCT xid) FROM effects")
    assert await cur.fetchone() == (jobs, 1)
    await conn.commit()
    assert sent == [(True, False), (True, False), (False, True)], sent
    assert commits == 0
