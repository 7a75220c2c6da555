"""pgwork's own transactions run at READ COMMITTED, the level their statements are
written for, on a database whose ``default_transaction_isolation`` is higher.

Dedup's lock-then-look needs it (a dedup key is refused above READ COMMITTED), so an
atomic handler enqueueing with a dedup key through its attempt's connection, or a cron
tick fired in the state adapter's own transaction, depends on it.
"""

from __future__ import annotations

from typing import Any

import psycopg
import psycopg.sql
import pytest
from pydantic import BaseModel

from pgwork import Attempt, JobTypeRegistry
from pgwork.postgres import _base as base_module
from pgwork.postgres import state as state_module

from .conftest import ClientFactory, scalar

pytestmark = pytest.mark.anyio


class Num(BaseModel):
    n: int


async def _default_repeatable_read(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        await c.execute(
            psycopg.sql.SQL(
                "ALTER DATABASE {} SET default_transaction_isolation = 'repeatable read'"
            ).format(psycopg.sql.Identifier(c.info.dbname))
        )


async def test_the_state_adapters_own_transactions_are_read_committed(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    await _default_repeatable_read(pgwork_dsn)
    client = await make_client(JobTypeRegistry())
    async with client.state.transaction() as tx:
        cur = await tx.connection.execute("SHOW transaction_isolation")  # type: ignore[attr-defined]
        assert await cur.fetchone() == ("read committed",)


@pytest.mark.parametrize("group", [1, 3])
async def test_an_atomic_handler_enqueues_with_a_dedup_key_on_a_repeatable_read_database(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    pgwork_dsn: str,
    group: int,
) -> None:
    await _default_repeatable_read(pgwork_dsn)
    reg = JobTypeRegistry()
    pay = reg.job_type("pay", input=Num, output=str, mode="atomic")
    receipt = reg.job_type("receipt", input=Num)
    client = await make_client(reg)

    async def handle(attempt: Attempt[Num, str]) -> str:
        cur = await attempt.connection.execute("SHOW transaction_isolation")
        (level,) = await cur.fetchone()
        await client.start_chain(
            attempt.connection, receipt, attempt.job.input, dedup=f"receipt-{attempt.job.input.n}"
        )
        return str(level)

    await workers(client=client, processors={pay: handle}, atomic_group=group)
    started = [await client.start_chain(conn, pay, Num(n=n)) for n in range(3)]
    await conn.commit()
    for chain in started:
        assert await client.await_chain(chain.id, timeout=30) == "read committed"
    receipts = "SELECT count(*) FROM pgwork.jobs WHERE type_name = 'receipt'"
    assert await scalar(pgwork_dsn, receipts) == 3


async def test_the_state_adapters_own_connections_are_read_committed(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    """Each of the adapter's autocommit statements is a transaction at the session's
    default level: at REPEATABLE READ an UPDATE meeting a row changed after its snapshot
    fails instead of re-checking it, so the pool and the heartbeat's own line are set
    to READ COMMITTED as they open."""
    await _default_repeatable_read(pgwork_dsn)
    client = await make_client(JobTypeRegistry())
    assert await _levels(client.state) == ["read committed", "read committed"]


async def test_control_without_the_session_setup_the_database_default_applies(
    make_client: ClientFactory, pgwork_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def leave_as_is(connection: psycopg.AsyncConnection[Any]) -> None:
        return None

    monkeypatch.setattr(state_module, "configure_session", leave_as_is)  # the pool
    monkeypatch.setattr(base_module, "configure_session", leave_as_is)  # the own line
    await _default_repeatable_read(pgwork_dsn)
    client = await make_client(JobTypeRegistry())
    assert await _levels(client.state) == ["repeatable read", "repeatable read"]


async def _levels(state: Any) -> list[str]:
    levels = []
    async with state._pooled() as pooled:
        cur = await pooled.execute("SHOW transaction_isolation")
        levels.append((await cur.fetchone())[0])
    async with state._own_line() as line:
        cur = await line.execute("SHOW transaction_isolation")
        levels.append((await cur.fetchone())[0])
    return levels
