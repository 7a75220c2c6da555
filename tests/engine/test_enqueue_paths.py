"""Enqueue's write paths (one statement, COPY, streamed COPY) and its folded notice.

A batch of at least ``COPY_MIN_ROWS`` plain jobs is written with COPY, anything else
with one INSERT that also runs ``pg_notify``; a batch that starts with that many plain
jobs is streamed: COPY takes the jobs as the client builds them. These tests hold the
paths to the same rows and the same notices: on commit only, once per queue, never for
scheduled jobs or rolled-back work.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    ChainStart,
    ConfigurationError,
    DedupSpec,
    JobTypeRegistry,
    Notice,
    PayloadNotSerializableError,
    PayloadValidationError,
    PostgresStateAdapter,
)
from pgwork.adapters.state import NewJob
from pgwork.postgres import _enqueue
from pgwork.postgres._enqueue import COPY_MIN_ROWS

from .conftest import ClientFactory, scalar

pytestmark = pytest.mark.anyio

BIG = max(COPY_MIN_ROWS, 250)


class Payload(BaseModel):
    data: dict[str, Any]


def registry() -> JobTypeRegistry:
    reg = JobTypeRegistry()
    reg.job_type("work", input=Payload)
    return reg


def batch(client: Any, n: int, **options: Any) -> list[ChainStart[Any]]:
    work = client.registry.get("work")
    return [ChainStart(work, Payload(data={"i": i}), **options) for i in range(n)]


def plain_job() -> NewJob:
    """A new chain's first job of type ``work``, runnable now, written with COPY."""
    job_id = uuid.uuid4()
    return NewJob(
        id=job_id,
        type_name="work",
        chain_id=job_id,
        chain_type_name="work",
        chain_index=0,
        input_json='{"data": {}}',
        queue="default",
        priority=0,
        max_attempts=3,
    )


async def test_ready_notice_of_a_single_enqueue_arrives_only_after_commit(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    async with client.notify.listen() as listener:
        await client.start_chain(conn, "work", Payload(data={}))  # type: ignore[arg-type]
        assert await listener.wait(0.3) == []
        await conn.commit()
        assert await listener.wait(5.0) == [Notice(kind="ready", queue="default")]


async def test_a_copied_batch_wakes_each_of_its_queues_once_on_commit(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    items = batch(client, BIG, queue="left") + batch(client, BIG, queue="right")
    async with client.notify.listen() as listener:
        await client.start_chains(conn, items)
        assert await listener.wait(0.3) == []
        await conn.commit()
        notices = await listener.wait(5.0)
        notices += await listener.wait(0.3)
    assert sorted(n.queue or "" for n in notices) == ["left", "right"]
    assert {n.kind for n in notices} == {"ready"}
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs") == 2 * BIG


async def test_a_copied_batch_with_a_scheduled_job_announces_every_ready_queue(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    items = batch(client, BIG, queue="left") + batch(client, BIG, queue="right")
    items += batch(client, 1, queue="later", schedule=timedelta(hours=1))
    async with client.notify.listen() as listener:
        await client.start_chains(conn, items)
        await conn.commit()
        notices = await listener.wait(5.0)
        notices += await listener.wait(0.3)
    assert sorted(n.queue or "" for n in notices if n.at is None) == ["left", "right"]
    [later] = [n for n in notices if n.at is not None]
    assert later.queue == "later"
    assert later.at is not None
    assert abs(later.at - (time.time() + 3600)) < 60


async def test_rolled_back_batches_leave_no_rows_and_wake_nobody(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    async with client.notify.listen() as listener:
        await client.start_chains(conn, batch(client, BIG))  # COPY
        await client.start_chains(conn, batch(client, 3, queue="small"))  # INSERT
        await conn.rollback()
        assert await listener.wait(0.5) == []
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs") == 0


async def test_scheduled_jobs_announce_only_when_they_become_due_on_either_path(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    async with client.notify.listen() as listener:
        await client.start_chains(conn, batch(client, BIG, schedule=timedelta(hours=1)))
        await client.start_chains(conn, batch(client, 2, schedule=timedelta(hours=2)))
        await conn.commit()
        notices = await listener.wait(5.0)
        notices += await listener.wait(0.3)
    # One notice per statement and queue, with the earliest due time; nothing "now".
    assert len(notices) == 2
    assert all(n.kind == "ready" and n.at is not None for n in notices)
    assert abs(min(n.at or 0 for n in notices) - (time.time() + 3600)) < 60
    due = await scalar(
        pgwork_dsn, "SELECT count(*) FROM pgwork.jobs WHERE scheduled_at <= created_at"
    )
    assert due == 0


async def test_copy_and_statement_paths_write_identical_rows(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    state = client.state
    assert isinstance(state, PostgresStateAdapter)
    # Everything COPY's text format must escape, in every column a caller controls.
    awkward = 'tab\there, new\nline, back\\slash, "quote", NUL-free ünïcødé ✓ \u2028 \\N'

    def job(*, root: bool = True, dedup: bool = True) -> NewJob:
        job_id = uuid.uuid4()  # also in the dedup key: no job deduplicates another
        return NewJob(
            id=job_id,
            type_name="work",
            chain_id=job_id if root else uuid.uuid4(),
            chain_type_name="work",
            chain_index=0 if root else 1,
            input_json=json.dumps({"data": {"text": awkward, "n": [1, 2.5, None, True]}}),
            queue=f"q {awkward}",
            priority=-3,
            max_attempts=7,
            dedup=DedupSpec(f"key {awkward} {job_id}") if dedup else None,
            trace_context={"traceparent": awkward},
            context={"tenant": awkward},
            limit_key=f"tenant {awkward}",
        )

    # Chain roots, and later jobs of chains (continuations are inserted in batches too).
    copied = [job(root=i % 2 == 0) for i in range(2 * BIG)]
    async with state.transaction() as tx:
        await state.insert_jobs(tx, jobs=copied)
    # Without dedup keys the batch is streamed, from a generator as the client does.
    streamed = [job(root=i % 2 == 0, dedup=False) for i in range(2 * BIG)]
    async with state.transaction() as tx:
        await state.insert_jobs(tx, jobs=(j for j in streamed))
    # One job (scalar statement), and a few (array statement).
    async with state.transaction() as tx:
        await state.insert_jobs(tx, jobs=[job()])
    async with state.transaction() as tx:
        await state.insert_jobs(tx, jobs=[job(root=False)])
    async with state.transaction() as tx:
        await state.insert_jobs(tx, jobs=[job(), job(root=False)])
    # A few new chains runnable now, no dedup key (INSERT_PLAIN_JOBS).
    async with state.transaction() as tx:
        await state.insert_jobs(tx, jobs=[job(dedup=False), job(dedup=False)])
    # One plain job (no dedup key: INSERT_PLAIN_JOB), a root and a later job.
    async with state.transaction() as tx:
        await state.insert_jobs(tx, jobs=[job(dedup=False)])
    async with state.transaction() as tx:
        await state.insert_jobs(tx, jobs=[job(root=False, dedup=False)])
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as c:
        cur = await c.execute(
            "SELECT DISTINCT to_jsonb(j) - 'id' - 'chain_id' - 'created_at' - 'scheduled_at'"
            " - 'dedup_key', scheduled_at = created_at, id = chain_id FROM pgwork.jobs AS j"
            " ORDER BY 3"
        )
        rows = await cur.fetchall()
        cur = await c.execute(
            "SELECT count(*) FROM pgwork.jobs WHERE dedup_key = %s || ' ' || id",
            (f"key {awkward}",),
        )
        assert await cur.fetchone() == (2 * BIG + 4,)
        cur = await c.execute("SELECT count(*) FROM pgwork.jobs WHERE dedup_key IS NULL")
        assert await cur.fetchone() == (2 * BIG + 4,)
    assert len(rows) == 2, rows
    (later, later_due, _), (row, due_at_creation, _) = rows
    assert due_at_creation
    assert later_due
    assert (later["chain_index"], later["chain_status"]) == (1, None)
    assert {k: v for k, v in later.items() if k not in ("chain_index", "chain_status")} == {
        k: v for k, v in row.items() if k not in ("chain_index", "chain_status")
    }
    assert row["input"] == {"data": {"text": awkward, "n": [1, 2.5, None, True]}}
    assert row["queue"] == f"q {awkward}"
    assert row["trace_context"] == {"traceparent": awkward}
    assert row["context"] == {"tenant": awkward}
    assert row["limit_key"] == f"tenant {awkward}"
    assert (row["status"], row["chain_status"], row["priority"]) == ("pending", "active", -3)


async def test_bad_payload_in_a_large_batch_inserts_nothing_and_keeps_the_transaction(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    items = batch(client, BIG)
    work = client.registry.get("work")
    items[BIG // 2] = ChainStart(work, Payload(data={"ok": 1, "bad": float("nan")}))
    with pytest.raises(PayloadNotSerializableError, match=r"\$\.data\.bad"):
        await client.start_chains(conn, items)
    items[BIG // 2] = ChainStart(work, {"data": "not a dict"})
    with pytest.raises(PayloadValidationError, match=r"\$\.data"):
        await client.start_chains(conn, items)
    # A dedup key is checked up front too, even far down a batch that would stream.
    items[BIG // 2] = items[-1] = ChainStart(work, Payload(data={}), dedup="")
    with pytest.raises(ConfigurationError, match="dedup key"):
        await client.start_chains(conn, items)
    # Nothing reached the server: the caller's transaction goes on.
    await conn.execute("SELECT 1")
    await client.start_chain(conn, work, Payload(data={"after": True}))
    await conn.commit()
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs") == 1


async def test_autocommit_connections_in_a_transaction_block_enqueue_on_both_paths(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    async with (
        await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as auto,
        client.notify.listen() as listener,
    ):
        async with auto.transaction():
            await client.start_chains(auto, batch(client, BIG))
            await client.start_chain(auto, client.registry.get("work"), Payload(data={}))
        notices = await listener.wait(5.0)
    assert Notice(kind="ready", queue="default") in notices
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs") == BIG + 1


async def test_a_failing_insert_on_a_fresh_connection_raises_at_once(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    state = client.state
    assert isinstance(state, PostgresStateAdapter)
    new = plain_job()
    async with state.transaction() as tx:
        await state.insert_jobs(tx, jobs=[new])
    # The duplicate is reported by insert_jobs itself, not later at commit.
    with pytest.raises(psycopg.errors.UniqueViolation):
        await state.insert_jobs(await state.adopt(conn), jobs=[new])
    await conn.rollback()
    assert (await (await conn.execute("SELECT 1")).fetchone()) == (1,)


async def test_a_job_iterator_that_fails_while_streamed_writes_nothing(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    state = client.state

    def failing() -> Iterator[NewJob]:
        for _ in range(2 * BIG):
            yield plain_job()
        raise RuntimeError("the last job could not be built")

    with pytest.raises(RuntimeError, match="could not be built"):
        async with state.transaction() as tx:
            await state.insert_jobs(tx, jobs=failing())
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs") == 0


async def test_a_single_start_chain_writes_the_row_a_batch_of_one_writes(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """``start_chain`` of a job runnable now takes its own lean path (one statement of
    its own); ``start_chains`` of one item takes the batch's. Same options, same row."""
    client = await make_client(registry())
    work = client.registry.get("work")
    options: dict[str, Any] = {
        "queue": 'q "quoted" \\ back',
        "priority": 5,
        "max_attempts": 2,
        "context": {"tenant": "a\tb"},
        "limit_key": 'k "quoted" \\ back',
    }
    single = await client.start_chain(conn, work, Payload(data={"x": [1, "é"]}), **options)
    [batched] = await client.start_chains(
        conn, [ChainStart(work, Payload(data={"x": [1, "é"]}), **options)]
    )
    await conn.commit()
    assert (single.deduplicated, single.status) == (batched.deduplicated, batched.status)
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as c:
        cur = await c.execute(
            "SELECT to_jsonb(j) - 'id' - 'chain_id' - 'created_at' - 'scheduled_at',"
            " scheduled_at = created_at FROM pgwork.jobs AS j WHERE id = ANY(%s) ORDER BY id",
            ([single.id, batched.id],),
        )
        (one, one_due), (other, other_due) = await cur.fetchall()
    assert one == other
    assert one_due
    assert other_due
    assert (one["queue"], one["priority"], one["max_attempts"]) == (options["queue"], 5, 2)
    assert (one["chain_status"], one["status"], one["context"]) == (
        "active",
        "pending",
        {"tenant": "a\tb"},
    )
    assert one["limit_key"] == options["limit_key"]


async def test_single_enqueues_of_one_transaction_wake_their_queue_once(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    """Each ``start_chain`` announces its queue in its own statement; the notices are
    the same text, so PostgreSQL delivers one per queue on commit."""
    client = await make_client(registry())
    work = client.registry.get("work")
    async with client.notify.listen() as listener:
        for i in range(5):
            await client.start_chain(conn, work, Payload(data={"i": i}))
        await client.start_chain(conn, work, Payload(data={}), queue="other")
        await conn.commit()
        notices = await listener.wait(5.0)
        notices += await listener.wait(0.3)
    assert sorted(n.queue or "" for n in notices) == ["default", "other"]


async def test_a_small_batch_of_new_chains_runnable_now_takes_the_plain_statement(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], monkeypatch: Any
) -> None:
    # INSERT_PLAIN_JOBS leaves out the arrays such jobs do not need; anything else in
    # the batch (a schedule here) takes the general INSERT_JOBS.
    client = await make_client(registry())
    state = client.state
    assert isinstance(state, PostgresStateAdapter)
    sent: list[bytes] = []
    real = _enqueue._execute

    async def spy(c: Any, query: bytes, params: dict[str, Any]) -> None:
        sent.append(query)
        await real(c, query, params)

    monkeypatch.setattr(_enqueue, "_execute", spy)
    await client.start_chains(conn, batch(client, 100))
    await client.start_chains(
        conn, batch(client, 99) + batch(client, 1, schedule=timedelta(seconds=1))
    )
    await conn.commit()
    statements = state.statements.enqueue
    assert sent == [statements.insert_plain_jobs, statements.insert_jobs]
