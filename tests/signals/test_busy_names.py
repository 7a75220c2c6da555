"""A match waits for no other match of its names.

A name whose lock another transaction holds (another worker's match) is returned
``busy``, nothing of it paired, whether the match's probe found it held or its
transaction did (the lock taken in between); the other names of the match are paired
all the same. Asked again once that transaction ended, the name is paired: the holder
may have begun before the signal was committed, so a busy name is never dropped. The
sweep, the backstop, waits for the lock instead, and pairs the name once it is free.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from uuid import UUID, uuid4

import anyio
import psycopg
import pytest
from tests.engine.conftest import eventually, scalar

from pgwork.postgres.sql.signals import SIGNAL_LOCK
from pgwork.postgres.state import PostgresStateAdapter

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def _pair_to_be(dsn: str, name: str) -> UUID:
    """A step waiting for ``name`` (blocked) and a signal to it, not yet matched: the
    step's id."""
    step, root = uuid4(), uuid4()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, status,"
            " max_attempts, chain_status) VALUES (%s, 'order', %s, 'order', 'completed',"
            " 1, 'active')",
            (root, root),
        )
        await conn.execute(
            "INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, chain_index,"
            " status, max_attempts, wait_signal) VALUES (%s, 'ship', %s,"
            " 'order', 1, 'blocked', 1, %s)",
            (step, root, name),
        )
        await conn.execute(
            "INSERT INTO pgwork.signals (id, name, payload) VALUES (%s, %s, '{}')",
            (uuid4(), name),
        )
    return step


@asynccontextmanager
async def _held(dsn: str, name: str) -> AsyncIterator[None]:
    """Another match of ``name`` under way: a transaction holding the name's lock."""
    async with await psycopg.AsyncConnection.connect(dsn) as holder:
        await holder.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (SIGNAL_LOCK, name))
        yield
        await holder.rollback()


@pytest.fixture
async def state(pgwork_dsn: str) -> AsyncIterator[PostgresStateAdapter]:
    adapter = await PostgresStateAdapter.connect(pgwork_dsn)
    yield adapter
    await adapter.close()


@pytest.mark.parametrize("held", ["before-the-probe", "between-probe-and-transaction"])
async def test_a_match_returns_a_held_name_busy_and_pairs_it_when_asked_again(
    pgwork_dsn: str,
    state: PostgresStateAdapter,
    held: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    busy_step = await _pair_to_be(pgwork_dsn, "payment:held")
    free_step = await _pair_to_be(pgwork_dsn, "payment:free")
    async with anyio.create_task_group() as group:
        holding = anyio.Event()
        release = anyio.Event()

        async def hold() -> None:
            async with _held(pgwork_dsn, "payment:held"):
                holding.set()
                await release.wait()

        if held == "before-the-probe":
            group.start_soon(hold)
            await holding.wait()
        else:
            locked = PostgresStateAdapter._match_locked

            async def after_the_probe(self_: Any, *args: Any, **kwargs: Any) -> Any:
                group.start_soon(hold)
                await holding.wait()
                return await locked(self_, *args, **kwargs)

            monkeypatch.setattr(PostgresStateAdapter, "_match_locked", after_the_probe)
        match = await state.match_signals(names=["payment:held", "payment:free"])
        monkeypatch.undo()
        assert match.busy == ("payment:held",)
        assert [d.job_id for d in match.delivered] == [free_step]
        status = "SELECT status::text FROM pgwork.jobs WHERE id = %s"
        assert await scalar(pgwork_dsn, status, busy_step) == "blocked"
        release.set()
    again = await state.match_signals(names=["payment:held"])
    assert (again.busy, [d.job_id for d in again.delivered]) == ((), [busy_step])


async def test_the_sweep_waits_for_a_held_name_and_pairs_it(
    pgwork_dsn: str, state: PostgresStateAdapter
) -> None:
    step = await _pair_to_be(pgwork_dsn, "payment:held")
    swept: list[Any] = []
    async with anyio.create_task_group() as group, _held(pgwork_dsn, "payment:held"):

        async def sweep() -> None:
            swept.append(await state.sweep_signals(limit=10))

        group.start_soon(sweep)

        async def waiting_for_the_lock() -> bool:
            query = (
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND classid = %s"
            )
            return bool(await scalar(pgwork_dsn, query, SIGNAL_LOCK))

        await eventually(waiting_for_the_lock, what="the sweep waiting for the name's lock")
        assert swept == []
    [match] = swept
    assert (match.busy, [d.job_id for d in match.delivered]) == ((), [step])
