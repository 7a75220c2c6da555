"""Listings and counts: filters, keyset pagination, blocked jobs, per-queue numbers."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    BlockerEdge,
    BlockerStatus,
    ChainStatus,
    Client,
    ConfigurationError,
    Continue,
    InvalidCursorError,
    Job,
    JobStatus,
    JobTypeRegistry,
    PostgresStateAdapter,
)
from pgwork._ids import first_id_at
from pgwork.adapters.state import LISTED_BLOCKERS, PageKey
from pgwork.client._queries import encode_cursor
from pgwork.postgres._history import HISTORY_WIDTHS_S
from pgwork.postgres.sql import render
from pgwork.testing import uuid7_sql

from .conftest import ClientFactory

pytestmark = pytest.mark.anyio


class Email(BaseModel):
    to: str


class Report(BaseModel):
    name: str


def registry() -> JobTypeRegistry:
    reg = JobTypeRegistry()
    reg.job_type("email", input=Email, output=Email, continue_with=["email.followup"])
    reg.job_type("email.followup", input=Email, entry=False)
    reg.job_type("report", input=Report, queue="reports")
    return reg


async def execute(dsn: str, query: str, params: Any = None) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        await c.execute(query, params)


async def start_batch(client: Client, dsn: str, type_name: str, n: int) -> list[UUID]:
    """``n`` chains in one transaction: one ``created_at`` for all (ties on purpose)."""
    job_type = client.registry.get(type_name)
    model = job_type.input_model
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        started = [
            await client.start_chain(
                conn, job_type, model(**({"to": f"{i}@x"} if model is Email else {"name": str(i)}))
            )
            for i in range(n)
        ]
        await conn.commit()
    return [s.id for s in started]


async def set_status(dsn: str, ids: list[UUID], status: str) -> None:
    """Put root jobs (and their chains) in ``status`` as the engine would have."""
    chain = "active" if status in ("pending", "running", "blocked") else status
    await execute(
        dsn,
        """
        UPDATE pgwork.jobs
        SET status = %(s)s::pgwork.job_status, chain_status = %(c)s::pgwork.chain_status,
            completed_at = CASE WHEN %(c)s <> 'active' THEN now() END,
            chain_completed_at = CASE WHEN %(c)s <> 'active' THEN now() END,
            leased_until = CASE WHEN %(s)s = 'running' THEN now() + interval '1 minute' END,
            leased_by = CASE WHEN %(s)s = 'running' THEN 'test-worker' END
        WHERE id = ANY(%(ids)s)
        """,
        {"s": status, "c": chain, "ids": ids},
    )


def newest_first(jobs: list[Job[Any]]) -> list[UUID]:
    return [j.id for j in sorted(jobs, key=lambda j: (j.created_at, j.id), reverse=True)]


async def all_pages(client: Client, **kwargs: Any) -> tuple[list[UUID], int]:
    ids: list[UUID] = []
    pages = 0
    cursor = None
    while True:
        page = await client.list_jobs(cursor=cursor, **kwargs)
        pages += 1
        ids.extend(j.id for j in page.items)
        if page.next_cursor is None:
            return ids, pages
        cursor = page.next_cursor


# --- list_jobs -------------------------------------------------------------------------


async def test_pages_walk_every_job_newest_first_once_across_tied_timestamps(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    for _ in range(3):
        await start_batch(client, pgwork_dsn, "email", 7)
    everything = (await client.list_jobs(limit=100)).items
    assert len(everything) == 21
    assert [j.id for j in everything] == newest_first(list(everything))

    ids, pages = await all_pages(client, limit=4)

    assert ids == [j.id for j in everything]
    assert pages == 6


async def test_a_page_that_ends_exactly_at_the_last_job_has_no_next_cursor(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    await start_batch(client, pgwork_dsn, "email", 6)

    first = await client.list_jobs(limit=3)
    second = await client.list_jobs(limit=3, cursor=first.next_cursor)

    assert first.next_cursor is not None
    assert len(second.items) == 3
    assert second.next_cursor is None


async def test_paging_is_stable_while_new_jobs_are_enqueued(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    before = await start_batch(client, pgwork_dsn, "email", 5)
    before += await start_batch(client, pgwork_dsn, "email", 5)

    seen: list[UUID] = []
    page = await client.list_jobs(limit=3)
    seen.extend(j.id for j in page.items)
    while page.next_cursor is not None:
        await start_batch(client, pgwork_dsn, "email", 2)  # newer than every cursor
        page = await client.list_jobs(limit=3, cursor=page.next_cursor)
        seen.extend(j.id for j in page.items)

    assert len(seen) == len(set(seen)) == 10
    assert set(seen) == set(before)


async def test_list_jobs_filters_by_type_queue_status_chain_and_creation_time(
    make_client: ClientFactory, pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    emails = await start_batch(client, pgwork_dsn, "email", 4)
    reports = await start_batch(client, pgwork_dsn, "report", 3)
    await execute(
        pgwork_dsn,
        "UPDATE pgwork.jobs SET created_at = created_at - interval '1 hour' WHERE id = ANY(%s)",
        [reports],
    )
    await set_status(pgwork_dsn, emails[:2], "failed")
    email = client.registry.get("email")
    followup = client.registry.get("email.followup")
    await client.complete_job(
        conn, emails[3], Email(to="done@x"), continue_with=Continue(followup, Email(to="f@x"))
    )
    await conn.commit()
    cutoff = datetime.now(UTC) - timedelta(minutes=30)

    async def ids(**filters: Any) -> set[UUID]:
        return {j.id for j in (await client.list_jobs(limit=100, **filters)).items}

    assert await ids(type_name="report") == set(reports)
    assert await ids(queue="reports") == set(reports)
    assert await ids(queue=email.queue, status=JobStatus.FAILED) == set(emails[:2])
    assert await ids(type_name="email", status=JobStatus.PENDING) == {emails[2]}
    assert await ids(status=JobStatus.COMPLETED) == {emails[3]}
    chain_jobs = await ids(chain_id=emails[3])
    assert len(chain_jobs) == 2
    assert emails[3] in chain_jobs
    assert await ids(type_name="email.followup") == chain_jobs - {emails[3]}
    assert await ids(created_before=cutoff) == set(reports)
    assert await ids(created_after=cutoff, type_name="report") == set()
    assert len(await ids(created_after=cutoff)) == 5
    assert await ids(type_name="nobody") == set()


async def test_listed_jobs_are_decoded_to_their_models(
    make_client: ClientFactory, pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    (first,) = await start_batch(client, pgwork_dsn, "email", 1)
    await client.complete_job(conn, first, Email(to="out@x"))
    await conn.commit()

    (job,) = (await client.list_jobs()).items

    assert job.input == Email(to="0@x")
    assert job.output == Email(to="out@x")


async def test_listings_see_the_callers_uncommitted_jobs_when_given_its_transaction(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    started = await client.start_chain(conn, client.registry.get("email"), Email(to="a@x"))

    inside = await client.list_jobs(tx=conn)
    chains_inside = await client.list_chains(tx=conn)
    outside = await client.list_jobs()

    assert [j.id for j in inside.items] == [started.id]
    assert [c.id for c in chains_inside.items] == [started.id]
    assert outside.items == ()
    await conn.rollback()


@pytest.mark.parametrize(
    "cursor",
    ["", "not a cursor", "ajEyMzQ", "ai4xMi5ub3QtYS11dWlk", "YS4xMi5iYWQ=", "x" * 40],
    ids=["empty", "spaces", "no-fields", "bad-uuid", "unknown-listing", "junk"],
)
async def test_a_cursor_pgwork_did_not_hand_out_is_refused(
    make_client: ClientFactory, cursor: str
) -> None:
    client = await make_client(registry())

    with pytest.raises(InvalidCursorError) as caught:
        await client.list_jobs(cursor=cursor)

    assert isinstance(caught.value, ConfigurationError)
    assert caught.value.cursor == cursor


async def test_a_cursor_of_one_listing_is_refused_by_another(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    await start_batch(client, pgwork_dsn, "email", 3)
    chains_cursor = (await client.list_chains(limit=1)).next_cursor
    assert chains_cursor is not None

    with pytest.raises(InvalidCursorError, match="list_chains, not list_jobs"):
        await client.list_jobs(cursor=chains_cursor)
    with pytest.raises(InvalidCursorError, match="list_chains, not list_blocked_jobs"):
        await client.list_blocked_jobs(cursor=chains_cursor)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"limit": 0},
        {"limit": 1001},
        {"created_after": datetime(2024, 1, 1)},  # naive on purpose
        {"status": "stuck"},
    ],
    ids=["limit-0", "limit-too-big", "naive-datetime", "unknown-status"],
)
async def test_list_jobs_refuses_arguments_that_cannot_work(
    make_client: ClientFactory, kwargs: dict[str, Any]
) -> None:
    client = await make_client(registry())

    with pytest.raises(ConfigurationError):
        await client.list_jobs(**kwargs)


# --- list_chains -----------------------------------------------------------------------


async def test_list_chains_filters_by_type_and_status_and_pages_newest_first(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    emails = await start_batch(client, pgwork_dsn, "email", 5)
    reports = await start_batch(client, pgwork_dsn, "report", 4)
    emails += await start_batch(client, pgwork_dsn, "email", 3)
    await set_status(pgwork_dsn, emails[:2], "completed")
    await set_status(pgwork_dsn, [reports[0]], "failed")
    await set_status(pgwork_dsn, [reports[1]], "cancelled")

    async def walk(**filters: Any) -> list[UUID]:
        ids: list[UUID] = []
        cursor = None
        while True:
            page = await client.list_chains(limit=2, cursor=cursor, **filters)
            ids.extend(c.id for c in page.items)
            if page.next_cursor is None:
                return ids
            cursor = page.next_cursor

    everything = await walk()
    expected_all = newest_first(
        [j for j in (await client.list_jobs(limit=100)).items if j.is_chain_root]
    )
    assert everything == expected_all
    assert len(everything) == 12
    assert set(await walk(type_name="email")) == set(emails)
    assert set(await walk(status=ChainStatus.ACTIVE)) == set(emails[2:] + reports[2:])
    assert await walk(type_name="report", status=ChainStatus.FAILED) == [reports[0]]
    assert await walk(type_name="report", status="cancelled") == [reports[1]]
    assert await walk(type_name="email", status=ChainStatus.FAILED) == []
    assert await walk(type_name="nobody") == []


async def test_listed_chains_carry_their_newest_job_and_decoded_input(
    make_client: ClientFactory, pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    (first,) = await start_batch(client, pgwork_dsn, "email", 1)
    followup = client.registry.get("email.followup")
    await client.complete_job(conn, first, continue_with=Continue(followup, Email(to="f@x")))
    await conn.commit()

    (chain,) = (await client.list_chains()).items

    assert chain.id == first
    assert chain.status is ChainStatus.ACTIVE
    assert chain.input == Email(to="0@x")
    assert chain.current_job.type_name == "email.followup"
    assert chain.current_job.input == Email(to="f@x")
    assert chain == await client.get_chain(first)


async def test_list_chains_bounds_creation_time_exclusively(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    old = await start_batch(client, pgwork_dsn, "report", 2)
    new = await start_batch(client, pgwork_dsn, "report", 2)
    await execute(
        pgwork_dsn,
        "UPDATE pgwork.jobs SET created_at = now() - interval '2 days' WHERE id = ANY(%s)",
        [old],
    )
    (boundary,) = (await client.list_chains(type_name="report", limit=1)).items

    after = await client.list_chains(created_after=datetime.now(UTC) - timedelta(days=1))
    before = await client.list_chains(created_before=datetime.now(UTC) - timedelta(days=1))
    strictly = await client.list_chains(created_after=boundary.created_at)

    assert {c.id for c in after.items} == set(new)
    assert {c.id for c in before.items} == set(old)
    assert strictly.items == ()


# --- blocked jobs ----------------------------------------------------------------------


async def test_blocked_jobs_are_listed_with_their_blockers_status_in_order(
    make_client: ClientFactory, pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    email, report = client.registry.get("email"), client.registry.get("report")
    first = await client.start_chain(conn, email, Email(to="b1@x"))
    second = await client.start_chain(conn, report, Report(name="b2"))
    waiting = await client.start_chain(conn, report, Report(name="w"), blockers=[second, first])
    other = await client.start_chain(conn, email, Email(to="w2@x"), blockers=[first])
    await client.start_chain(conn, email, Email(to="free@x"))
    await conn.commit()
    await set_status(pgwork_dsn, [second.id], "completed")
    await execute(pgwork_dsn, "DELETE FROM pgwork.jobs WHERE id = %s", [first.id])

    page = await client.list_blocked_jobs(limit=1)
    rest = await client.list_blocked_jobs(limit=1, cursor=page.next_cursor)
    listed = {item.job.id: item for item in page.items + rest.items}

    assert rest.next_cursor is None
    assert set(listed) == {waiting.id, other.id}
    assert listed[waiting.id].job.input == Report(name="w")
    assert listed[waiting.id].job.status is JobStatus.BLOCKED
    assert listed[waiting.id].blockers == (
        BlockerStatus(second.id, ChainStatus.COMPLETED),
        BlockerStatus(first.id, None),  # deleted meanwhile
    )
    assert listed[other.id].blockers == (BlockerStatus(first.id, None),)


async def test_a_blocked_jobs_blockers_page_by_position_from_the_client(
    make_client: ClientFactory, pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    """The listing shows the first ``LISTED_BLOCKERS`` and says there are more, with the
    job's counts; ``list_blockers`` pages through all of them; a cursor of another job's
    blockers, or of another listing, is refused."""
    client = await make_client(registry())
    email, report = client.registry.get("email"), client.registry.get("report")
    chains = [await client.start_chain(conn, email, Email(to=f"{n}@x")) for n in range(23)]
    declared = list(reversed(chains))
    waiting = await client.start_chain(conn, report, Report(name="w"), blockers=declared)
    other = await client.start_chain(conn, report, Report(name="o"), blockers=chains[:2])
    await conn.commit()
    await set_status(pgwork_dsn, [chains[0].id], "completed")

    by_id = {item.job.id: item for item in (await client.list_blocked_jobs()).items}
    shown = by_id[waiting.id]
    assert [b.chain_id for b in shown.blockers] == [c.id for c in declared[:LISTED_BLOCKERS]]
    assert shown.more_blockers
    assert (shown.blockers_needed, shown.blockers_met, shown.blockers_open) == (23, 0, 23)
    assert not by_id[other.id].more_blockers

    edges: list[BlockerEdge] = []
    cursor = None
    while True:
        page = await client.list_blockers(waiting.id, limit=5, cursor=cursor)
        edges.extend(page.items)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert [(e.position, e.chain_id) for e in edges] == list(enumerate(c.id for c in declared))
    assert edges[-1].status is ChainStatus.COMPLETED  # set by hand: ended, not settled
    assert {e.status for e in edges[:-1]} == {ChainStatus.ACTIVE}

    first = await client.list_blockers(waiting.id, limit=5)
    assert first.next_cursor is not None
    with pytest.raises(InvalidCursorError, match="another job's blockers"):
        await client.list_blockers(other.id, cursor=first.next_cursor)
    blocked_cursor = (await client.list_blocked_jobs(limit=1)).next_cursor
    with pytest.raises(InvalidCursorError, match="list_blocked_jobs, not list_blockers"):
        await client.list_blockers(waiting.id, cursor=blocked_cursor)
    assert (await client.list_blockers(UUID(int=5))).items == ()


# --- counts ----------------------------------------------------------------------------


async def test_count_jobs_gives_each_queues_unfinished_work_and_pause_state(
    make_client: ClientFactory, pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    email, report = client.registry.get("email"), client.registry.get("report")
    ready = await start_batch(client, pgwork_dsn, "email", 6)
    await client.start_chain(conn, email, Email(to="later@x"), schedule=timedelta(hours=1))
    blocker = await client.start_chain(conn, report, Report(name="r"))
    await client.start_chain(conn, report, Report(name="w"), blockers=[blocker])
    await conn.commit()
    await set_status(pgwork_dsn, ready[:1], "running")
    await set_status(pgwork_dsn, ready[1:3], "failed")
    await set_status(pgwork_dsn, ready[3:4], "completed")
    await execute(
        pgwork_dsn,
        "UPDATE pgwork.jobs SET scheduled_at = now() - interval '5 minutes' WHERE id = %s",
        [ready[4]],
    )
    await client.pause_queue("idle")

    counts = {c.queue: c for c in await client.count_jobs()}

    assert list(counts) == sorted(counts) == ["default", "idle", "reports"]
    default = counts["default"]
    assert (default.ready, default.scheduled, default.running, default.failed) == (2, 1, 1, 2)
    assert default.blocked == 0
    assert default.depth == 3
    assert not default.paused
    assert default.oldest_ready_age is not None
    assert default.oldest_ready_age >= timedelta(minutes=5)
    assert default.oldest_ready_at == (await client.get_job(ready[4])).scheduled_at
    reports = counts["reports"]
    assert (reports.ready, reports.blocked, reports.failed) == (1, 1, 0)
    idle = counts["idle"]
    assert idle.paused
    assert (idle.depth, idle.running, idle.oldest_ready_at, idle.oldest_ready_age) == (
        0,
        0,
        None,
        None,
    )


# --- plans -----------------------------------------------------------------------------


# ~5k rows as the engine writes them: mostly finished one-job chains, some continuations,
# a few hundred pending / running / blocked / failed, in two queues and four types.
LOAD = f"""
INSERT INTO pgwork.jobs (
    id, type_name, chain_id, chain_type_name, chain_index, input, status, queue,
    priority, max_attempts, created_at, scheduled_at, chain_status, completed_at,
    chain_completed_at, leased_until
)
SELECT u, t, u, t, 0, jsonb_build_object('n', g), s::pgwork.job_status, q, 0, 5,
       now() - (5000 - g) * interval '1 minute', now() - (5000 - g) * interval '1 minute',
       CASE WHEN s IN ('pending', 'running', 'blocked') THEN 'active' ELSE s END
           ::pgwork.chain_status,
       CASE WHEN s IN ('completed', 'failed', 'cancelled') THEN now() END,
       CASE WHEN s IN ('completed', 'failed', 'cancelled') THEN now() END,
       CASE WHEN s = 'running' THEN now() + interval '1 minute' END
FROM (
    SELECT g, {uuid7_sql("now() - (5000 - g) * interval '1 minute'")} AS u,
           (ARRAY['email', 'resize', 'report', 'sync'])[1 + g % 4] AS t,
           CASE WHEN g % 10 = 0 THEN 'mail' ELSE 'default' END AS q,
           CASE WHEN g % 50 = 1 THEN 'failed' WHEN g % 50 = 2 THEN 'blocked'
                WHEN g % 50 = 3 THEN 'running' WHEN g % 20 = 5 THEN 'pending'
                WHEN g % 97 = 7 THEN 'cancelled' ELSE 'completed' END AS s
    FROM generate_series(0, 4499) AS g
) AS rows;
INSERT INTO pgwork.jobs (
    id, type_name, chain_id, chain_type_name, chain_index, input, status, queue,
    max_attempts, created_at, scheduled_at, completed_at
)
SELECT {uuid7_sql("r.created_at + interval '1 second'")}, r.type_name || '.next', r.id,
       r.type_name, 1, '{{}}', 'completed',
       r.queue, 5, r.created_at + interval '1 second', r.created_at, now()
FROM pgwork.jobs AS r
WHERE r.status = 'completed' AND r.chain_index = 0
LIMIT 500;
INSERT INTO pgwork.job_blockers (job_id, blocker_chain_id, position)
SELECT d.id, b.id, 0
FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM pgwork.jobs
      WHERE status = 'blocked') AS d
JOIN (SELECT id, row_number() OVER (ORDER BY id) AS n FROM pgwork.jobs
      WHERE status = 'completed' AND chain_index = 0) AS b ON b.n = d.n;
ANALYZE pgwork.jobs;
ANALYZE pgwork.job_blockers;
"""


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(_nodes(child))
    return found


@pytest.fixture
async def loaded_client(make_client: ClientFactory, pgwork_dsn: str) -> Client:
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as c:
        await c.execute(LOAD)
    return await make_client(registry())


async def _plan_of(
    client: Client, dsn: str, monkeypatch: pytest.MonkeyPatch, call: Any
) -> list[dict[str, Any]]:
    """Plan of the statement the adapter sends for ``call``, with the same parameters."""
    sent: list[tuple[bytes, Any]] = []

    async def capture(self: Any, tx: Any, query: bytes, params: Any) -> list[Any]:
        sent.append((query, params))
        return []

    monkeypatch.setattr(PostgresStateAdapter, "_read", capture)
    await call(client)
    monkeypatch.undo()
    ((query, params),) = sent
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        cur = await c.execute(b"EXPLAIN (FORMAT JSON) " + query, params, prepare=False)
        row = await cur.fetchone()
    assert row is not None
    document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return _nodes(document[0]["Plan"])


def _scans_of_jobs(nodes: list[dict[str, Any]]) -> list[str]:
    return [n["Node Type"] for n in nodes if n.get("Relation Name") == "jobs"]


def _indexes(nodes: list[dict[str, Any]]) -> set[str]:
    return {n["Index Name"] for n in nodes if "Index Name" in n}


# A cursor two days back, halfway through LOAD's rows (job listings page by id).
MIDWAY = PageKey(datetime.now(UTC), first_id_at(datetime.now(UTC) - timedelta(days=2)))

LIST_JOBS_WITH_AN_INDEX = {
    "chain": ({"chain_id": UUID(int=7)}, "jobs_chain_idx"),
    # Failed jobs of one type are a range of attention's index, or read newest first
    # from the failed jobs' index, checking the type: either reads failed jobs only.
    "failed-of-type": (
        {"status": JobStatus.FAILED, "type_name": "email"},
        ("jobs_attention_idx", "jobs_failed_idx"),
    ),
    "failed": ({"status": JobStatus.FAILED}, "jobs_failed_idx"),
    "blocked": ({"status": JobStatus.BLOCKED}, "jobs_attention_idx"),
    "running": ({"status": JobStatus.RUNNING}, "jobs_lease_expiry_idx"),
    "pending-in-queue": ({"status": JobStatus.PENDING, "queue": "mail"}, "jobs_acquire_idx"),
}


@pytest.mark.parametrize(
    ("filters", "index"), LIST_JOBS_WITH_AN_INDEX.values(), ids=LIST_JOBS_WITH_AN_INDEX.keys()
)
@pytest.mark.parametrize("paged", [False, True], ids=["first-page", "next-page"])
async def test_list_jobs_reads_through_an_index(
    loaded_client: Client,
    pgwork_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    filters: dict[str, Any],
    index: str | tuple[str, ...],
    paged: bool,
) -> None:
    cursor = encode_cursor("j", MIDWAY) if paged else None

    nodes = await _plan_of(
        loaded_client,
        pgwork_dsn,
        monkeypatch,
        lambda c: c.list_jobs(cursor=cursor, **filters),
    )

    assert "Seq Scan" not in _scans_of_jobs(nodes), nodes
    assert _indexes(nodes) & ({index} if isinstance(index, str) else set(index)), nodes


# These walk jobs newest first with no partial index to narrow them: the primary key,
# read backwards (ids are UUIDv7), from the cursor when there is one; ``created_after``
# bounds the range read.
LIST_JOBS_WITHOUT_AN_INDEX = {
    "unfiltered": {},
    "of-type": {"type_name": "email"},
    "in-queue": {"queue": "mail"},
    "completed": {"status": JobStatus.COMPLETED},
    "created-after": {"created_after": datetime.now(UTC) - timedelta(hours=3)},
}


@pytest.mark.parametrize(
    "filters", LIST_JOBS_WITHOUT_AN_INDEX.values(), ids=LIST_JOBS_WITHOUT_AN_INDEX.keys()
)
@pytest.mark.parametrize("paged", [False, True], ids=["first-page", "next-page"])
async def test_list_jobs_newest_first_reads_the_primary_key_backwards(
    loaded_client: Client,
    pgwork_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    filters: Any,
    paged: bool,
) -> None:
    cursor = encode_cursor("j", MIDWAY) if paged else None

    nodes = await _plan_of(
        loaded_client, pgwork_dsn, monkeypatch, lambda c: c.list_jobs(cursor=cursor, **filters)
    )

    scans = [n for n in nodes if n.get("Relation Name") == "jobs"]
    assert [n["Node Type"] for n in scans] == ["Index Scan"], nodes
    assert (scans[0]["Index Name"], scans[0]["Scan Direction"]) == ("jobs_pkey", "Backward")
    assert "Sort" not in {n["Node Type"] for n in nodes}, nodes


async def test_created_after_finds_a_job_whose_enqueuer_clock_ran_behind(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    """The filter reads ids from an hour before ``created_after``: a job enqueued by a
    machine whose clock is half an hour behind the database's is still found."""
    client = await make_client(registry())
    [on_time] = await start_batch(client, pgwork_dsn, "email", 1)
    since = (await client.get_job(on_time)).created_at
    behind = UUID(int=first_id_at(datetime.now(UTC) - timedelta(minutes=30)).int | 1)
    await execute(
        pgwork_dsn,
        """
        INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, input, status,
                                 max_attempts, chain_status)
        VALUES (%(id)s, 'email', %(id)s, 'email', '{"to": "late@x"}', 'pending', 3, 'active')
        """,
        {"id": behind},
    )

    found = await client.list_jobs(created_after=since - timedelta(microseconds=1))

    assert [j.id for j in found.items] == [on_time, behind]


async def test_list_jobs_created_after_reads_only_ids_from_an_hour_before(
    loaded_client: Client, pgwork_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    since = datetime.now(UTC) - timedelta(hours=3)

    nodes = await _plan_of(
        loaded_client, pgwork_dsn, monkeypatch, lambda c: c.list_jobs(created_after=since)
    )

    (scan,) = (n for n in nodes if n.get("Relation Name") == "jobs")
    assert scan["Index Name"] == "jobs_pkey", scan
    assert "id >=" in scan["Index Cond"], scan


LIST_CHAINS_FILTERS = {
    "unfiltered": {},
    "of-type": {"type_name": "email"},
    "with-status": {"status": ChainStatus.FAILED},
    "of-type-with-status": {"type_name": "sync", "status": ChainStatus.COMPLETED},
    "created-after": {"created_after": datetime.now(UTC) - timedelta(days=1)},
}


@pytest.mark.parametrize("filters", LIST_CHAINS_FILTERS.values(), ids=LIST_CHAINS_FILTERS.keys())
@pytest.mark.parametrize("paged", [False, True], ids=["first-page", "next-page"])
async def test_list_chains_reads_through_the_chains_index(
    loaded_client: Client,
    pgwork_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    filters: dict[str, Any],
    paged: bool,
) -> None:
    cursor = encode_cursor("c", PageKey(datetime.now(UTC), UUID(int=0))) if paged else None

    nodes = await _plan_of(
        loaded_client,
        pgwork_dsn,
        monkeypatch,
        lambda c: c.list_chains(cursor=cursor, **filters),
    )

    assert "Seq Scan" not in _scans_of_jobs(nodes), nodes
    assert "jobs_chains_idx" in _indexes(nodes), nodes


@pytest.mark.parametrize(
    "call",
    [lambda c: c.list_blocked_jobs(), lambda c: c.count_jobs()],
    ids=["list_blocked_jobs", "count_jobs"],
)
async def test_blocked_listing_and_counts_read_only_unfinished_jobs_index_entries(
    loaded_client: Client, pgwork_dsn: str, monkeypatch: pytest.MonkeyPatch, call: Any
) -> None:
    nodes = await _plan_of(loaded_client, pgwork_dsn, monkeypatch, call)

    scans = _scans_of_jobs(nodes)
    assert scans
    assert "Seq Scan" not in scans, nodes


SOME_IDS = [UUID(int=1), UUID(int=2)]
DELETION_STATEMENTS = {
    "lock_chains": ({"ids": SOME_IDS}, "jobs_pkey"),
    "find_dependants": ({"ids": SOME_IDS, "excluded": SOME_IDS}, "jobs_pkey"),
    "delete_chains": ({"ids": SOME_IDS}, "jobs_chain_idx"),
    "lock_expired_chains": (
        {
            "type_names": ["email", "sync"],
            "endings": ["completed", "failed"],
            "seconds": [3600.0, 60.0],
            "limit": 1000,
        },
        "jobs_chains_idx",
    ),
    "delete_expired_chains": ({"ids": SOME_IDS, "widths": HISTORY_WIDTHS_S}, "jobs_chain_idx"),
}
# A retention batch: a thousand ids, an eighth of the table's rows, still read by index
# (the roots by primary key, their continuations in jobs_chain_idx); a condition that
# ORs the two (as delete_chains's) is read as a scan of the whole table from a hundred.
BATCH_IDS = [UUID(int=n) for n in range(1, 1001)]
DELETION_STATEMENTS["delete_expired_chains-batch"] = (
    {"ids": BATCH_IDS, "widths": HISTORY_WIDTHS_S},
    "jobs_pkey",
)


@pytest.mark.parametrize(
    ("name", "params", "index"),
    [(name, *rest) for name, rest in DELETION_STATEMENTS.items()],
    ids=DELETION_STATEMENTS.keys(),
)
async def test_deletion_and_retention_statements_read_through_an_index(
    loaded_client: Client, pgwork_dsn: str, name: str, params: dict[str, Any], index: str
) -> None:
    statement = getattr(render("pgwork").queries, name.split("-")[0])
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as c:
        cur = await c.execute(b"EXPLAIN (FORMAT JSON) " + statement, params, prepare=False)
        row = await cur.fetchone()
    assert row is not None
    document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    nodes = _nodes(document[0]["Plan"])

    assert "Seq Scan" not in _scans_of_jobs(nodes), nodes
    assert index in _indexes(nodes), nodes
