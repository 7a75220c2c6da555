"""The shipped conformance suites against the PostgreSQL adapters, plus what is
PostgreSQL's own: adopting a caller's connection, and a lock-wait probe that lets the
suite see a blocked writer instead of timing it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg import sql

from pgwork import PostgresNotifyAdapter, PostgresStateAdapter
from pgwork.adapters.state import Completion, NextMember
from pgwork.postgres import _atomic_group as pg_atomic_group
from pgwork.postgres import _state_worker as pg_worker_ops
from pgwork.postgres._transactions import PgTransaction
from pgwork.testing.conformance import (
    LockWaiters,
    NotifyAdapterConformance,
    StateAdapterConformance,
    StateHarness,
    TransactionFactory,
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
                assert isinstance(tx, PgTransaction)
                if pipelined and tx.connection.info.server_version < 170000:
                    pytest.skip("one round trip needs PostgreSQL 17")
                # Frozen (SIGSTOP, a blocked event loop): the server must end it.
                await _backend_ended(pgwork_dsn, tx.connection.info.backend_pid)
                await tx.connection.execute("SELECT 1")

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
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """A group's lane sits idle in its transaction between members, holding the
        rows of those already kept: the server must be able to end it there too, not
        only while a handler runs. (Control: the completion pipelined with the next
        savepoint, as before, leaves the lane idle with the timer disarmed.)"""
        monkeypatch.setattr(pg_atomic_group, "ATOMIC_SLACK", timedelta(milliseconds=300))
        await store.seed(store.new_job())
        held = await store.acquire_one()
        group = await state_adapter.open_atomic_group()
        assert isinstance(group, pg_atomic_group.PgAtomicGroup)
        tx = await group.enter(lease=held.lease, deadline=timedelta(milliseconds=200))
        assert isinstance(tx, PgTransaction)
        result = await group.complete(Completion(held.id, held.lease.lease_token, "null"))
        assert result.accepted
        # Frozen before the group's commit: the server must end it, and the kept
        # member's completion with it.
        await _backend_ended(pgwork_dsn, tx.connection.info.backend_pid)
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

    @pytest.mark.parametrize("commit", [False, True], ids=["same-group", "next-group"])
    async def test_the_server_ends_a_group_whose_worker_went_silent_after_an_entry_ahead(
        self,
        state_adapter: PostgresStateAdapter,
        store: StateHarness,
        pgwork_dsn: str,
        monkeypatch: pytest.MonkeyPatch,
        commit: bool,
    ) -> None:
        """As above, with the completion carrying the next member's entry in the same
        query (and, ``commit``, the group's commit and the next group's start): the
        lane is then idle holding the rows, and must be bounded all the same.
        (Control: a Flush sent after that query, the server never ends the lane.)"""
        monkeypatch.setattr(pg_atomic_group, "ATOMIC_SLACK", timedelta(milliseconds=300))
        deadline = timedelta(milliseconds=200)
        await store.seed(store.new_job(), store.new_job())
        held, named = await store.acquire(limit=2)
        group = await state_adapter.open_atomic_group()
        tx = await group.enter(lease=held.lease, deadline=deadline)
        assert isinstance(tx, PgTransaction)
        result = await group.complete(
            Completion(held.id, held.lease.lease_token, "null"),
            then=NextMember(named.lease, deadline),
            commit=commit,
        )
        assert result.accepted
        await _backend_ended(pgwork_dsn, tx.connection.info.backend_pid)
        with pytest.raises(pg_errors.IdleInTransactionSessionTimeout):
            await group.commit()
        for job in (named,) if commit else (held, named):
            with anyio.fail_after(10):
                [again] = await state_adapter.complete(
                    None, completions=[Completion(job.id, job.lease_token, '"later"')]
                )
            assert again.accepted

    async def test_a_group_whose_first_member_was_undone_stays_bounded(
        self,
        state_adapter: PostgresStateAdapter,
        store: StateHarness,
        pgwork_dsn: str,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """The idle bound is set once per group, outside the members' savepoints: a
        first member rolled back does not take it with it, and the next member, whose
        lock sets nothing, is bounded all the same. (Control: the bound set in the
        first member's savepoint, the server never ends the lane.)"""
        monkeypatch.setattr(pg_atomic_group, "ATOMIC_SLACK", timedelta(milliseconds=300))
        pg_atomic_group._idle_ms.cache_clear()
        deadline = timedelta(milliseconds=210)
        await store.seed(store.new_job(), store.new_job())
        undone, held = await store.acquire(limit=2)
        group = await state_adapter.open_atomic_group()
        assert await group.enter(lease=undone.lease, deadline=deadline) is not None
        await group.undo()
        tx = await group.enter(lease=held.lease, deadline=deadline)
        assert isinstance(tx, PgTransaction)
        await _backend_ended(pgwork_dsn, tx.connection.info.backend_pid)
        with pytest.raises(pg_errors.IdleInTransactionSessionTimeout):
            await group.commit()
        pg_atomic_group._idle_ms.cache_clear()

    @pytest.mark.parametrize("ahead", [True, False], ids=["entered-ahead", "alone"])
    async def test_a_member_whose_deadline_differs_from_the_first_gets_its_own_bound(
        self,
        state_adapter: PostgresStateAdapter,
        store: StateHarness,
        pgwork_dsn: str,
        monkeypatch: pytest.MonkeyPatch,
        ahead: bool,
    ) -> None:
        """A member with a longer deadline than the group's first is not ended at the
        first one's bound, and one with a shorter deadline after it is ended at its
        own. (Control: a lock that sets no bound after the group's first: the second
        member's connection is ended while it runs.)"""
        monkeypatch.setattr(pg_atomic_group, "ATOMIC_SLACK", timedelta(milliseconds=300))
        pg_atomic_group._idle_ms.cache_clear()
        short, long = timedelta(milliseconds=220), timedelta(milliseconds=1900)
        await store.seed(*(store.new_job() for _ in range(3)))
        first, slow, last = await store.acquire(limit=3)
        group = await state_adapter.open_atomic_group()
        assert await group.enter(lease=first.lease, deadline=short) is not None
        then = NextMember(slow.lease, long) if ahead else None
        assert (
            await group.complete(Completion(first.id, first.lease_token, "1"), then=then)
        ).accepted
        tx = await group.enter(lease=slow.lease, deadline=long)
        assert isinstance(tx, PgTransaction)
        await anyio.sleep(1.0)  # twice the first member's bound, half its own
        then = NextMember(last.lease, short) if ahead else None
        assert (
            await group.complete(Completion(slow.id, slow.lease_token, "2"), then=then)
        ).accepted
        assert await group.enter(lease=last.lease, deadline=short) is not None
        await _backend_ended(pgwork_dsn, tx.connection.info.backend_pid)
        with pytest.raises(pg_errors.IdleInTransactionSessionTimeout):
            await group.commit()
        pg_atomic_group._idle_ms.cache_clear()

    async def test_a_group_sets_its_idle_bound_once_and_completes_roots_leanly(
        self,
        state_adapter: PostgresStateAdapter,
        store: StateHarness,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """Members with the same deadline: the bound goes once, with the group's
        ``BEGIN``, and no member's lock sets it again; a one-job chain's member
        completes through the lean statement, a later job of a chain through the
        general one. (Controls: the bound set with every lock; every member completed
        through the general statement.)"""
        await store.handed_on()
        await store.seed(store.new_job(), store.new_job())
        jobs = sorted(await store.acquire(limit=3), key=lambda job: job.chain_index)
        group = await state_adapter.open_atomic_group()
        assert isinstance(group, pg_atomic_group.PgAtomicGroup)
        sent: list[bytes] = []
        execute = psycopg.AsyncCursor.execute

        async def counted(cur: psycopg.AsyncCursor[Any], query: Any, *args: Any, **kw: Any) -> Any:
            sent.append(bytes(query))
            return await execute(cur, query, *args, **kw)

        monkeypatch.setattr(psycopg.AsyncCursor, "execute", counted)
        assert await group.enter(lease=jobs[0].lease, deadline=DEADLINE) is not None
        for job, after in zip(jobs, [*jobs[1:], None], strict=True):
            if job is not jobs[0]:
                assert await group.enter(lease=job.lease, deadline=DEADLINE) is not None
            then = None if after is None else NextMember(after.lease, DEADLINE)
            assert (
                await group.complete(Completion(job.id, job.lease_token, "0"), then=then)
            ).accepted
        await group.commit()
        sent = [query for query in sent if not query.startswith(b"PREPARE")]
        text = b"".join(sent)
        assert text.count(b"idle_in_transaction_session_timeout") == 1, sent
        assert b"set_config" not in text
        lean, general = (group._complete_root, group._complete)
        [*roots, later] = [sent[i] for i in (1, 2, 3)]  # the completions, the later job last
        for query in roots:
            assert query.startswith(lean.text((b"x", b"x", b"x")).split(b"x")[0]), query
        assert later.startswith(general.text((b"x", b"x", b"x", b"x")).split(b"x")[0]), later

    async def test_a_member_entered_ahead_costs_no_round_trip_of_its_own(
        self,
        state_adapter: PostgresStateAdapter,
        store: StateHarness,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """Three members, each completion naming the next: one query per member (the
        first's ``BEGIN`` and lock, then a completion with the next one's entry each),
        the last completion alone, the ``COMMIT``. (Control: a completion that ignores
        ``then``, so that each member enters on its own: two more queries.)"""
        await store.seed(*(store.new_job() for _ in range(3)))
        jobs = await store.acquire(limit=3)
        group = await state_adapter.open_atomic_group()
        assert await group.enter(lease=jobs[0].lease, deadline=DEADLINE) is not None
        sent: list[bytes] = []
        execute = psycopg.AsyncCursor.execute

        async def counted(cur: psycopg.AsyncCursor[Any], query: Any, *args: Any, **kw: Any) -> Any:
            sent.append(query)
            return await execute(cur, query, *args, **kw)

        monkeypatch.setattr(psycopg.AsyncCursor, "execute", counted)
        for job, after in zip(jobs, [*jobs[1:], None], strict=True):
            if job is not jobs[0]:
                assert await group.enter(lease=job.lease, deadline=DEADLINE) is not None
            then = None if after is None else NextMember(after.lease, DEADLINE)
            done = Completion(job.id, job.lease_token, '"grouped"')
            assert (await group.complete(done, then=then)).accepted
        await group.commit()
        assert len(sent) == 4, sent
        for job in jobs:
            assert (await store.job(job.id)).output == "grouped"

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
        await store.seed(store.new_job(), store.new_job())
        first, second = await store.acquire(limit=2)
        group = await state_adapter.open_atomic_group()
        tx = await group.enter(lease=first.lease, deadline=DEADLINE)
        assert isinstance(tx, PgTransaction)
        done = Completion(first.id, first.lease_token, '"grouped"')
        assert (await group.complete(done, then=NextMember(second.lease, DEADLINE))).accepted
        cur = await tx.connection.execute("SELECT count(*) FROM pg_prepared_statements")
        assert await cur.fetchall() == [(0,)]
        await group.commit()


def caller_transactions(dsn: str) -> TransactionFactory:
    """A caller's own psycopg connection: committed on clean exit, else rolled back."""

    @asynccontextmanager
    async def transaction() -> AsyncIterator[object]:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            yield conn

    return transaction


class TestPostgresNotifyAdapter(NotifyAdapterConformance):
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

    @pytest.fixture
    def notify_transaction(self, pgwork_dsn: str) -> TransactionFactory:
        return caller_transactions(pgwork_dsn)
