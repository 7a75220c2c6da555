"""The shipped conformance suites against the PostgreSQL adapters, plus what is
PostgreSQL's own: adopting a caller's connection, and a lock-wait probe that lets the
suite see a blocked writer instead of timing it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg import sql
from tests.adapters._notify_suite import InCallersTransactions

from pgwork import PostgresNotifyAdapter, PostgresStateAdapter
from pgwork.adapters.state import Completion
from pgwork.postgres import _atomic_group as pg_atomic_group
from pgwork.postgres import _state_worker as pg_worker_ops
from pgwork.postgres._transactions import own_connection
from pgwork.records import JobStatus
from pgwork.testing.conformance import (
    LockWaiters,
    StateAdapterConformance,
    StateHarness,
)
from pgwork.testing.conformance._state_atomic_group import AtomicGroupConformance

pytestmark = pytest.mark.anyio

DEADLINE = timedelta(seconds=30)


async def _backend_ended(dsn: str, pid: int) -> None:
    """Return once the server no longer runs backend ``pid`` (fails after 10 s)."""
    with anyio.fail_after(10):
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            while True:
                cur = await conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,))
                if not await cur.fetchall():
                    return
                await anyio.sleep(0.05)


async def _backend_runs(dsn: str, pid: int) -> bool:
    """Whether the server still runs backend ``pid``."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,))
        return bool(await cur.fetchall())


@pytest.fixture
def short_slack(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Atomic transactions bounded 300 ms past their deadlines (the bounds, cached per
    deadline, computed afresh)."""
    monkeypatch.setattr(pg_atomic_group, "ATOMIC_SLACK", timedelta(milliseconds=300))
    pg_atomic_group._idle_ms.cache_clear()
    yield
    pg_atomic_group._idle_ms.cache_clear()


def _record(monkeypatch: pytest.MonkeyPatch, group: pg_atomic_group.PgAtomicGroup) -> list[bytes]:
    """What goes to the server on ``group``'s connection from now on, one query (a
    round trip) an item: through a cursor (the group's statements and the members'
    own), or ahead of a member's first statement (what opens its savepoint)."""
    conn = group._conn
    sent: list[bytes] = []
    execute = psycopg.AsyncCursor.execute
    send = pg_atomic_group._send

    async def counted(cur: psycopg.AsyncCursor[Any], query: Any, *args: Any, **kw: Any) -> Any:
        try:
            return await execute(cur, query, *args, **kw)
        finally:  # behind what opened the member's savepoint ahead of it, if anything
            if cur.connection is conn:
                sent.append(query.encode() if isinstance(query, str) else bytes(query))

    async def sending(on: psycopg.AsyncConnection[Any], query: bytes) -> None:
        if on is conn:
            sent.append(query)
        await send(on, query)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", counted)
    monkeypatch.setattr(pg_atomic_group, "_send", sending)
    return sent


def _shape(query: bytes) -> bytes:
    """``query`` with the group's prepared completion shown as ``<complete>``."""
    head, found, tail = query.partition(b"EXECUTE pgwork_atomic_complete_")
    if not found:
        return query
    return head + b"<complete>; " + tail.partition(b"); ")[2]


async def _create_scratch(dsn: str) -> None:
    """A table for the members' own writes (the test's database is its own)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE TABLE pgwork_scratch (member text NOT NULL)")


async def _scratch(dsn: str) -> list[str]:
    """What the members wrote to the scratch table, as committed."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT member FROM pgwork_scratch ORDER BY member")
        return [row[0] for row in await cur.fetchall()]


async def _fail_lone_attempt(
    adapter: PostgresStateAdapter, lease: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    """A lone atomic attempt on ``conn`` whose handler raises (``RuntimeError``)."""
    async with adapter.atomic_transaction(lease=lease, deadline=DEADLINE) as tx:
        assert own_connection(tx) is conn
        raise RuntimeError("the handler failed")


class TestPostgresStateAdapter(StateAdapterConformance):
    @pytest.fixture
    async def state_adapter(
        self, pgwork_dsn: str, pgwork_schema: str
    ) -> AsyncIterator[PostgresStateAdapter]:
        adapter = await PostgresStateAdapter.connect(pgwork_dsn, schema=pgwork_schema, max_size=20)
        try:
            yield adapter
        finally:
            await adapter.close()

    @pytest.fixture
    def lock_waiters(self, pgwork_dsn: str) -> LockWaiters:
        async def count() -> int:
            async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as c:
                cur = await c.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
                row = await cur.fetchone()
                return int(row[0]) if row else 0

        return count

    @pytest.mark.parametrize("pipelined", [True, False], ids=["one-round-trip", "two"])
    async def test_the_server_ends_an_atomic_transaction_whose_worker_went_silent(
        self,
        state_adapter: PostgresStateAdapter,
        store: StateHarness,
        pgwork_dsn: str,
        pgwork_schema: str,
        monkeypatch: pytest.MonkeyPatch,
        pipelined: bool,
    ) -> None:
        monkeypatch.setattr(pg_atomic_group, "ATOMIC_SLACK", timedelta(milliseconds=300))
        if not pipelined:
            monkeypatch.setattr(pg_worker_ops, "_PIPELINED_BEGIN_FROM", 10**9)
        await store.seed(store.new_job())
        held = await store.acquire_one()

        async def go_silent() -> None:
            async with state_adapter.atomic_transaction(
                lease=held.lease, deadline=timedelta(milliseconds=200)
            ) as tx:
                conn = own_connection(tx)
                if pipelined and conn.info.server_version < 170000:
                    pytest.skip("one round trip needs PostgreSQL 17")
                # Frozen (SIGSTOP, a blocked event loop): the server must end it.
                await _backend_ended(pgwork_dsn, conn.info.backend_pid)
                await conn.execute("SELECT 1")

        with pytest.raises(
            (pg_errors.TransactionTimeout, pg_errors.IdleInTransactionSessionTimeout)
        ):
            await go_silent()
        # Its row lock went with it.
        async with await psycopg.AsyncConnection.connect(pgwork_dsn) as other:
            cur = await other.execute(
                sql.SQL("SELECT id FROM {} WHERE id = %s FOR UPDATE NOWAIT").format(
                    sql.Identifier(pgwork_schema, "jobs")
                ),
                (held.id,),
            )
            assert await cur.fetchall() == [(held.id,)]

    async def test_the_server_ends_a_group_whose_worker_went_silent_after_a_completion(
        self,
        state_adapter: PostgresStateAdapter,
        store: StateHarness,
        pgwork_dsn: str,
        pgwork_schema: str,
        short_slack: None,
    ) -> None:
        """A group's lane sits idle in its transaction between members, holding the
        rows of those kept that wrote: the server must be able to end it there too,
        not only while a handler runs. (Control: the group's ``BEGIN`` without its idle
        bound: the server never ends the lane.)"""
        await store.seed(store.new_job())
        held = await store.acquire_one()
        group = await state_adapter.open_atomic_group()
        tx = await group.enter(lease=held.lease, deadline=timedelta(milliseconds=200))
        conn = own_connection(tx)
        await conn.execute("SELECT 1")
        result = await group.complete(Completion(held.id, held.lease_token, "null"))
        assert result.accepted
        # Frozen before the group's commit: the server must end it, and the kept
        # member's completion with it.
        await _backend_ended(pgwork_dsn, conn.info.backend_pid)
        with pytest.raises(pg_errors.IdleInTransactionSessionTimeout):
            await group.commit()
        async with await psycopg.AsyncConnection.connect(pgwork_dsn) as other:
            cur = await other.execute(
                sql.SQL("SELECT status::text FROM {} WHERE id = %s FOR UPDATE NOWAIT").format(
                    sql.Identifier(pgwork_schema, "jobs")
                ),
                (held.id,),
            )
            assert await cur.fetchall() == [("running",)]

    async def test_a_group_whose_first_member_was_undone_stays_bounded(
        self,
        state_adapter: PostgresStateAdapter,
        store: StateHarness,
        pgwork_dsn: str,
        short_slack: None,
    ) -> None:
        """The idle bound is set with the group's ``BEGIN``, outside the members'
        savepoints: a first member that used its transaction and was rolled back does
        not take it with it, and the next member, whose entry sends nothing (the same
        deadline), is bounded all the same. (Control: the bound set in the first
        member's savepoint: the server never ends the lane.)"""
        deadline = timedelta(milliseconds=210)
        await store.seed(store.new_job(), store.new_job())
        undone, held = await store.acquire(limit=2)
        group = await state_adapter.open_atomic_group()
        conn = own_connection(await group.enter(lease=undone.lease, deadline=deadline))
        await conn.execute("SELECT 1")
        await group.undo()
        await group.enter(lease=held.lease, deadline=deadline)
        assert (await group.complete(Completion(held.id, held.lease_token, "null"))).accepted
        await _backend_ended(pgwork_dsn, conn.info.backend_pid)
        with pytest.raises(pg_errors.IdleInTransactionSessionTimeout):
            await group.commit()
        for job in (undone, held):  # nothing of the group was written
            assert (await store.job(job.id)).status is JobStatus.RUNNING

    async def test_a_longer_deadline_raises_the_groups_bound_and_a_shorter_one_keeps_it(
        self,
        state_adapter: PostgresStateAdapter,
        store: StateHarness,
        pgwork_dsn: str,
        short_slack: None,
    ) -> None:
        """A member whose deadline asks for a longer bound than the one in force raises
        it as it enters: its connection is not ended at the first member's bound while
        its handler runs. One with a shorter deadline after it leaves the bound as it
        is (the group's transaction holds the slower member's rows): the lane is ended
        at the longer bound. (Controls: an entry that never raises the bound: the slow
        member's connection is ended while it runs; one that lowers it to its own: the
        lane is ended at the last member's bound.)"""
        short, long = timedelta(milliseconds=220), timedelta(milliseconds=1900)
        await store.seed(*(store.new_job() for _ in range(3)))
        first, slow, last = await store.acquire(limit=3)
        group = await state_adapter.open_atomic_group()
        conn = own_connection(await group.enter(lease=first.lease, deadline=short))
        await conn.execute("SELECT 1")
        done = await group.complete(Completion(first.id, first.lease_token, "1"))
        assert done.accepted
        await group.enter(lease=slow.lease, deadline=long)
        await anyio.sleep(1.0)  # twice the first member's bound, under half its own
        await conn.execute("SELECT 1")
        done = await group.complete(Completion(slow.id, slow.lease_token, "2"))
        assert done.accepted
        await group.enter(lease=last.lease, deadline=short)
        assert (await group.complete(Completion(last.id, last.lease_token, "3"))).accepted
        await anyio.sleep(1.0)  # twice the last member's bound
        assert await _backend_runs(pgwork_dsn, conn.info.backend_pid)
        await _backend_ended(pgwork_dsn, conn.info.backend_pid)
        with pytest.raises(pg_errors.IdleInTransactionSessionTimeout):
            await group.commit()

    async def test_a_member_that_writes_nothing_costs_one_query_its_completion(
        self,
        state_adapter: PostgresStateAdapter,
        store: StateHarness,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """A member undone without having used its transaction, then members that never
        use it: nothing goes to the server until a completion, and each completion is
        one query. The first one's begins the group's transaction, sets its idle bound
        and opens the member's savepoint ahead of the completion; each opens the next
        member's savepoint behind it; the undone member sends nothing; the commit is
        its ``COMMIT``. (Controls: a completion that opens the member's savepoint in a
        query of its own: two queries for the first member; one that opens nothing:
        the first completion commits at once, and no ``COMMIT`` follows.)"""
        await store.seed(*(store.new_job() for _ in range(4)))
        undone, *jobs = await store.acquire(limit=4)
        group = await state_adapter.open_atomic_group()
        assert isinstance(group, pg_atomic_group.PgAtomicGroup)
        sent = _record(monkeypatch, group)
        await group.enter(lease=undone.lease, deadline=DEADLINE)
        await group.undo()
        for job in jobs:
            await group.enter(lease=job.lease, deadline=DEADLINE)
            done = await group.complete(Completion(job.id, job.lease_token, '"grouped"'))
            assert done.accepted
        await group.commit()
        # (The completion is prepared once per connection: one more query, the first
        # time only.)
        sent = [query for query in sent if not query.startswith(b"PREPARE")]
        bound = (DEADLINE + pg_atomic_group.ATOMIC_SLACK) // timedelta(milliseconds=1)
        kept_and_next = (
            b"SET CONSTRAINTS ALL IMMEDIATE; <complete>; SET CONSTRAINTS ALL DEFERRED; "
            b"RELEASE SAVEPOINT pgwork_member; SAVEPOINT pgwork_member"
        )
        assert [_shape(query) for query in sent] == [
            b"BEGIN ISOLATION LEVEL READ COMMITTED; "
            + b"SET LOCAL idle_in_transaction_session_timeout = %d; " % bound
            + b"SAVEPOINT pgwork_member; "
            + kept_and_next,
            kept_and_next,
            kept_and_next,
            b"COMMIT",
        ]
        for job in jobs:
            assert (await store.job(job.id)).output == "grouped"
        assert (await store.job(undone.id)).status is JobStatus.RUNNING

    async def test_a_member_that_uses_its_transaction_costs_its_savepoint_and_completion(
        self,
        state_adapter: PostgresStateAdapter,
        store: StateHarness,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """Two members that use their transaction, then one that does not, all with
        the same deadline. The first one's first statement is preceded by one query
        that begins the group's transaction, sets its idle bound and opens the member's
        savepoint; each completion is one query that also opens the next member's
        savepoint, so the second member's use costs nothing more, and the third one's
        completion nothing more than itself; the commit is ``COMMIT``. The bound goes
        once. (Controls: a completion that does not open the next member's savepoint:
        the second member's use sends ``SAVEPOINT`` first; an entry that sets the bound
        again.)"""
        await store.seed(*(store.new_job() for _ in range(3)))
        first, second, quiet = await store.acquire(limit=3)
        group = await state_adapter.open_atomic_group()
        assert isinstance(group, pg_atomic_group.PgAtomicGroup)
        sent = _record(monkeypatch, group)
        for job in (first, second):
            conn = own_connection(await group.enter(lease=job.lease, deadline=DEADLINE))
            await conn.execute("SELECT 1")
            done = await group.complete(Completion(job.id, job.lease_token, '"grouped"'))
            assert done.accepted
        await group.enter(lease=quiet.lease, deadline=DEADLINE)
        done = await group.complete(Completion(quiet.id, quiet.lease_token, '"grouped"'))
        assert done.accepted
        await group.commit()
        # (The completion is prepared once per connection: one more query, the first
        # time only.)
        sent = [query for query in sent if not query.startswith(b"PREPARE")]
        bound = (DEADLINE + pg_atomic_group.ATOMIC_SLACK) // timedelta(milliseconds=1)
        kept_and_next = (
            b"SET CONSTRAINTS ALL IMMEDIATE; <complete>; SET CONSTRAINTS ALL DEFERRED; "
            b"RELEASE SAVEPOINT pgwork_member; SAVEPOINT pgwork_member"
        )
        assert [_shape(query) for query in sent] == [
            b"BEGIN ISOLATION LEVEL READ COMMITTED; "
            + b"SET LOCAL idle_in_transaction_session_timeout = %d; " % bound
            + b"SAVEPOINT pgwork_member",
            b"SELECT 1",
            kept_and_next,
            b"SELECT 1",
            kept_and_next,
            kept_and_next,
            b"COMMIT",
        ]
        for job in (first, second, quiet):
            assert (await store.job(job.id)).output == "grouped"

    async def test_a_transaction_block_in_a_member_nests_in_the_members_savepoint(
        self, state_adapter: PostgresStateAdapter, store: StateHarness, pgwork_dsn: str
    ) -> None:
        """A handler's ``conn.transaction()`` as its member's first use: the member's
        savepoint is opened ahead of it, so psycopg makes the block a savepoint inside
        it rather than the outermost transaction (whose end would commit the group's
        transaction): a kept member's block commits with the group, an undone one's
        goes with it. (Control: the member's savepoint opened after its first
        operation: the first block, taken for the outermost, commits at once.)"""
        await _create_scratch(pgwork_dsn)
        await store.seed(store.new_job(), store.new_job())
        kept, undone = await store.acquire(limit=2)
        group = await state_adapter.open_atomic_group()
        for job in (kept, undone):
            conn = own_connection(await group.enter(lease=job.lease, deadline=DEADLINE))
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO pgwork_scratch (member) VALUES (%s)", (str(job.id),)
                )
            assert await _scratch(pgwork_dsn) == []  # nothing committed yet
            if job is kept:
                done = await group.complete(Completion(job.id, job.lease_token, '"kept"'))
                assert done.accepted
            else:
                await group.undo()
        await group.commit()
        assert await _scratch(pgwork_dsn) == [str(kept.id)]
        assert (await store.job(kept.id)).output == "kept"
        assert (await store.job(undone.id)).status is JobStatus.RUNNING

    async def test_a_failed_lone_attempt_leaves_a_later_groups_completion_prepared(
        self, store: StateHarness, pgwork_dsn: str, pgwork_schema: str
    ) -> None:
        """A lone atomic attempt that fails is rolled back through psycopg, which then
        deallocates every prepared statement of the session: a group that ran earlier
        on the same pooled connection left its completion prepared there, and the
        next group on it must not count on it. Its member completes in its group.
        (Control: the group trusting its completion to stay prepared for the
        connection's life: the member's completion finds none and the group is
        lost.)"""
        await store.seed(*(store.new_job() for _ in range(3)))
        first, lone, last = await store.acquire(limit=3)
        # One connection: every group and attempt below runs on it.
        one = await PostgresStateAdapter.connect(
            pgwork_dsn, schema=pgwork_schema, min_size=1, max_size=1
        )
        try:
            for job in (first, last):
                group = await one.open_atomic_group()
                conn = own_connection(await group.enter(lease=job.lease, deadline=DEADLINE))
                # psycopg prepares a statement of its own on the session.
                await conn.execute("SELECT 1", prepare=True)
                done = await group.complete(Completion(job.id, job.lease_token, "1"))
                assert done.accepted
                await group.commit()
                if job is first:
                    with pytest.raises(RuntimeError):
                        await _fail_lone_attempt(one, lone.lease, conn)
        finally:
            await one.close()
        for job in (first, last):
            assert (await store.job(job.id)).status is JobStatus.COMPLETED
        assert (await store.job(lone.id)).status is JobStatus.RUNNING

    async def test_insert_on_an_adopted_connection_commits_and_rolls_back_with_it(
        self, state_adapter: PostgresStateAdapter, store: StateHarness, pgwork_dsn: str
    ) -> None:
        kept, dropped = store.new_job(), store.new_job()
        async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
            tx = await state_adapter.adopt(conn)
            await state_adapter.insert_jobs(tx, jobs=[dropped])
            await conn.rollback()
            await state_adapter.insert_jobs(tx, jobs=[kept])
            assert not await store.exists(kept.id)
            await conn.commit()
        assert await store.exists(kept.id)
        assert not await store.exists(dropped.id)


class TestPostgresAtomicGroupWithoutPreparedStatements(AtomicGroupConformance):
    """The atomic group's suite on connections that prepare nothing (``prepare_threshold``
    None, as through a pooler in transaction mode): its statements travel as full
    text, literals written in."""

    @pytest.fixture
    async def state_adapter(
        self, pgwork_dsn: str, pgwork_schema: str
    ) -> AsyncIterator[PostgresStateAdapter]:
        adapter = await PostgresStateAdapter.connect(
            pgwork_dsn, schema=pgwork_schema, max_size=20, prepare_threshold=None
        )
        try:
            yield adapter
        finally:
            await adapter.close()

    async def test_nothing_is_prepared_on_the_groups_connection(
        self, state_adapter: PostgresStateAdapter, store: StateHarness
    ) -> None:
        """Members that used their transaction have their completions written at once,
        as text: nothing is prepared on the connection, before or after. (Control: the
        completion prepared all the same: the second member finds it.)"""
        await store.seed(store.new_job(), store.new_job())
        first, second = await store.acquire(limit=2)
        group = await state_adapter.open_atomic_group()
        for job in (first, second):
            conn = own_connection(await group.enter(lease=job.lease, deadline=DEADLINE))
            cur = await conn.execute("SELECT count(*) FROM pg_prepared_statements")
            assert await cur.fetchall() == [(0,)]  # (after the first one's completion)
            done = await group.complete(Completion(job.id, job.lease_token, '"grouped"'))
            assert done.accepted
        await group.commit()
        for job in (first, second):
            assert (await store.job(job.id)).output == "grouped"


class TestPostgresNotifyAdapter(InCallersTransactions):
    delivers_on_commit_only = True
    folds_identical_notices = True

    @pytest.fixture
    async def notify_adapter(
        self, pgwork_dsn: str, pgwork_schema: str
    ) -> AsyncIterator[PostgresNotifyAdapter]:
        adapter = PostgresNotifyAdapter(pgwork_dsn, schema=pgwork_schema)
        try:
            yield adapter
        finally:
            await adapter.close()
