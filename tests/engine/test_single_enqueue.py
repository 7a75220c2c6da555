"""The single ``start_chain``'s own path: its statements, its kept cursor.

A job runnable now is inserted by one statement of its own: ``INSERT_PLAIN_ROOT`` (eight
parameters, no result row) for a new chain without trace or logging context, else
``INSERT_PLAIN_JOB``. On a caller's psycopg connection it runs on a cursor kept on the
connection. These tests hold both to the row a batch of one writes, to one cursor per
connection, and to a connection that is still freed once the caller drops it.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

from pgwork import ChainStart, JobTypeRegistry, PostgresStateAdapter
from pgwork.postgres import _callers

from .conftest import ClientFactory, scalar

pytestmark = pytest.mark.anyio


class Payload(BaseModel):
    data: dict[str, Any]


def registry() -> JobTypeRegistry:
    reg = JobTypeRegistry()
    reg.job_type("work", input=Payload, priority=3, max_attempts=4, queue="q \"'\\")
    return reg


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The queries psycopg's async cursors execute from now on."""
    queries: list[bytes] = []
    real = psycopg.AsyncCursor.execute

    async def spy(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        queries.append(query)
        return await real(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", spy)
    return queries


async def test_a_new_chain_without_context_takes_the_root_statement(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], sent: list[bytes]
) -> None:
    client = await make_client(registry())
    state = client.state
    assert isinstance(state, PostgresStateAdapter)
    work = client.registry.get("work")
    sent.clear()  # what making the client ran
    await client.start_chain(conn, work, Payload(data={}))
    await client.start_chain(conn, work, Payload(data={}), context={"tenant": "t"})
    await conn.commit()
    assert sent == [
        state.statements.enqueue.insert_plain_root,
        state.statements.enqueue.insert_plain_job,
    ]


@pytest.mark.parametrize("options", [{}, {"queue": "other", "priority": -2, "max_attempts": 1}])
async def test_the_root_statement_writes_the_row_a_batch_of_one_writes(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    pgwork_dsn: str,
    options: dict[str, Any],
) -> None:
    client = await make_client(registry())
    work = client.registry.get("work")
    data = {"x": [1, "é", None], "q": "\"'\\"}
    single = await client.start_chain(conn, work, Payload(data=data), **options)
    [batched] = await client.start_chains(conn, [ChainStart(work, Payload(data=data), **options)])
    await conn.commit()
    assert (single.id, single.deduplicated, single.status) == (
        single.job_id,
        batched.deduplicated,
        batched.status,
    )
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as c:
        cur = await c.execute(
            "SELECT to_jsonb(j) - 'id' - 'chain_id' - 'created_at' - 'scheduled_at',"
            " scheduled_at = created_at, id = chain_id"
            " FROM pgwork.jobs AS j WHERE id = ANY(%s) ORDER BY id",
            ([single.id, batched.id],),
        )
        (one, one_due, one_root), (other, other_due, other_root) = await cur.fetchall()
    assert one == other
    assert (one_due, other_due, one_root, other_root) == (True, True, True, True)
    assert one["input"] == {"data": data}
    assert (one["status"], one["chain_status"], one["chain_index"]) == ("pending", "active", 0)
    assert (one["queue"], one["priority"], one["max_attempts"]) == (
        options.get("queue", "q \"'\\"),
        options.get("priority", 3),
        options.get("max_attempts", 4),
    )


async def test_single_enqueues_on_one_connection_share_one_cursor(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await make_client(registry())
    work = client.registry.get("work")
    made: list[Any] = []
    real = psycopg.AsyncConnection.cursor

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        cursor = real(self, *args, **kwargs)
        made.append(cursor)
        return cursor

    monkeypatch.setattr(psycopg.AsyncConnection, "cursor", counting)
    for i in range(3):
        await client.start_chain(conn, work, Payload(data={"i": i}))
        await conn.commit()
    assert len(made) == 1
    # A cursor someone closed is replaced, and the enqueue still works.
    await made[0].close()
    await client.start_chain(conn, work, Payload(data={"i": 3}))
    await conn.commit()
    assert len(made) == 2
    assert await scalar_on(conn, "SELECT count(*) FROM pgwork.jobs") == 4


async def scalar_on(conn: psycopg.AsyncConnection[Any], query: str) -> Any:
    cur = await conn.execute(query)
    row = await cur.fetchone()
    await conn.commit()
    assert row is not None
    return row[0]


async def test_a_connection_that_enqueued_is_freed_once_dropped(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    work = client.registry.get("work")
    caller = await psycopg.AsyncConnection.connect(pgwork_dsn)
    await client.start_chain(caller, work, Payload(data={}))
    await caller.commit()
    await caller.close()
    gone = weakref.ref(caller)
    del caller
    gc.collect()
    assert gone() is None
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs") == 1


def test_a_connection_that_takes_no_attribute_gets_a_new_cursor_each_time() -> None:
    class Slotted:
        __slots__ = ()

        def cursor(self) -> object:
            return object.__new__(_Open)

    first = _callers.kept_cursor(Slotted())  # type: ignore[arg-type]
    assert _callers.kept_cursor(Slotted()) is not first  # type: ignore[arg-type]


class _Open:
    closed = False


async def test_single_sync_enqueues_on_one_connection_share_one_cursor(
    make_client: ClientFactory, pgwork_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await make_client(registry())
    work = client.registry.get("work")
    made: list[Any] = []
    real = psycopg.Connection.cursor

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        cursor = real(self, *args, **kwargs)
        made.append(cursor)
        return cursor

    with psycopg.connect(pgwork_dsn) as caller:
        monkeypatch.setattr(psycopg.Connection, "cursor", counting)
        for i in range(3):
            client.start_chain_sync(caller, work, Payload(data={"i": i}))
            caller.commit()
        monkeypatch.undo()
    assert len(made) == 1
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs") == 3
