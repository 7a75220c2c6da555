"""The work pages' reads at a million jobs: each uses an index, never a sequential scan
of ``jobs``, and reads a bounded number of rows, whatever the table's size; the
workers page receives a few jobs per worker, however many they run.

The statements are the ones the adapter sends (captured like tests/dashboard/
test_plans.py does), run under ``EXPLAIN ANALYZE`` with the same parameters; the rows
each plan node over ``jobs`` produced or filtered out are added up. The table is
loaded with ``generate_series`` (``pgwork.testing.sample_statements``: a week of
history, 4% pending, half of them scheduled, 0.1% running, 1% failed, four queues,
eight types).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import psycopg
import pytest

from pgwork import Client, PostgresStateAdapter, create_client
from pgwork.client._work import EXAMINED
from pgwork.dashboard import allow_any, create_dashboard
from pgwork.dashboard._work_pages import JOBS_PER_WORKER
from pgwork.job_types import JobTypeRegistry
from pgwork.testing import sample_statements, temporary_database

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

JOBS = 1_000_000
FAILED = JOBS // 100
RUNNING = JOBS // 1000
# The load's workers: four busy ones holding the running jobs, two stopped.
WORKERS, BUSY = 6, 4


@pytest.fixture(scope="module")
def million_dsn(pg_server_dsn: str, pgwork_template_database: str) -> Iterator[str]:
    with temporary_database(pg_server_dsn, template=pgwork_template_database) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in sample_statements(jobs=JOBS, schema="pgwork"):
                conn.execute(statement)
        yield dsn


@pytest.fixture
async def million(million_dsn: str) -> AsyncIterator[Client]:
    state = await PostgresStateAdapter.connect(million_dsn, max_size=2)
    client = create_client(state_adapter=state, registry=JobTypeRegistry(), observers=[])
    try:
        yield client
    finally:
        await client.close()


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(_nodes(child))
    return found


async def plans_of(
    client: Client, dsn: str, monkeypatch: pytest.MonkeyPatch, call: Callable[[Client], Any]
) -> list[list[dict[str, Any]]]:
    """Executed plans of every statement ``call`` sends, with the parameters it sent."""
    sent: list[tuple[bytes, Any]] = []
    execute = psycopg.AsyncCursor.execute

    async def recording(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        if isinstance(query, bytes) and query.lstrip().upper().startswith((b"SELECT", b"WITH")):
            sent.append((query, params))
        return await execute(self, query, params, **kwargs)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", recording)
    try:
        await call(client)
    finally:
        monkeypatch.setattr(psycopg.AsyncCursor, "execute", execute)
    assert sent
    plans = []
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for query, params in sent:
            cur = await conn.execute(
                b"EXPLAIN (ANALYZE, FORMAT JSON) " + query, params, prepare=False
            )
            row = await cur.fetchone()
            assert row is not None
            document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
            plans.append(_nodes(document[0]["Plan"]))
    return plans


def rows_read(nodes: list[dict[str, Any]]) -> int:
    """Rows the plan's nodes over ``jobs`` returned or threw away, over all loops."""
    total = 0
    for n in nodes:
        if n.get("Relation Name") == "jobs":
            loops = n.get("Actual Loops", 1)
            removed = n.get("Rows Removed by Filter", 0) + n.get("Rows Removed by Index Recheck", 0)
            total += (n.get("Actual Rows", 0) + removed) * loops
    return total


async def _second_page(c: Client) -> Any:
    first = await c.list_work(status="ready", limit=50)
    assert first.next_cursor
    return await c.list_work(status="ready", limit=50, cursor=first.next_cursor)


async def _some_prefix(c: Client) -> Any:
    newest = (await c.list_work(status="ready", oldest_first=False, limit=1)).items[0]
    return await c.find_by_id_prefix(newest.id.hex[:16])


async def _input_search_further(c: Client) -> Any:
    first = await c.find_by_input("sample.email", "email", "nobody@example.com")
    assert first.next_cursor
    return await c.find_by_input(
        "sample.email", "email", "nobody@example.com", cursor=first.next_cursor
    )


# Each read and the most rows it may read: a page's worth per lane (four queues, eight
# failed types) for the listings; every running job (at most the workers' slots); every
# failed job for a filter on the error and for the error groups (failed jobs are few).
READS: dict[str, tuple[Callable[[Client], Awaitable[Any]], int]] = {
    "ready": (lambda c: c.list_work(status="ready"), 1_000),
    "ready-newest": (lambda c: c.list_work(status="ready", oldest_first=False), 1_000),
    "ready-in-queue": (lambda c: c.list_work(status="ready", queue="mail"), 500),
    "ready-next-page": (_second_page, 2_000),
    # Every scheduled job of the load is due at one instant (now + 1 hour): jobs due at
    # the same instant are sorted by id together (the index ends at scheduled_at), so
    # each lane reads its whole tie group; the bound is checked against that group below.
    "scheduled": (lambda c: c.list_work(status="scheduled"), 1_000),
    "scheduled-newest": (lambda c: c.list_work(status="scheduled", oldest_first=False), 1_000),
    "running": (lambda c: c.list_work(status="running"), 2 * RUNNING),
    "running-by-worker": (
        lambda c: c.list_work(status="running", leased_by="sample-worker-1"),
        2 * RUNNING,
    ),
    "running-per-worker": (lambda c: c.running_by_worker(), 2 * RUNNING),
    "failed": (lambda c: c.list_work(status="failed"), 1_000),
    "failed-newest": (lambda c: c.list_work(status="failed", oldest_first=False), 1_000),
    "failed-by-error": (
        lambda c: c.list_work(status="failed", error_type="TimeoutError", error_message="x"),
        FAILED + 1_000,
    ),
    "pending-types": (lambda c: c.pending_types(sample=100), 1_000),
    "error-groups": (lambda c: c.error_groups(), FAILED + 1_000),
    "id-prefix": (_some_prefix, 1_000),
    # The newest 10,000 jobs (and one more, to tell whether older ones remain), then
    # the matches by primary key.
    "input-field": (lambda c: c.find_by_input("sample.email", "n", JOBS - 8), EXAMINED + 200),
    "input-field-none": (
        lambda c: c.find_by_input("sample.email", "email", "nobody@example.com"),
        EXAMINED + 200,
    ),
    "input-field-further": (_input_search_further, EXAMINED + 200),
}


@pytest.mark.timeout(900)
async def test_work_reads_use_indexes_and_read_bounded_rows_at_a_million_jobs(
    million: Client, million_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await psycopg.AsyncConnection.connect(million_dsn) as conn:
        cur = await conn.execute(
            "SELECT count(DISTINCT (queue, priority)), max(n) FROM (SELECT queue, priority,"
            " count(*) AS n FROM pgwork.jobs WHERE status = 'pending'"
            " AND scheduled_at > now() GROUP BY queue, priority, scheduled_at) AS ties"
        )
        lanes, tie = await cur.fetchone() or (0, 0)
    bounds = {name: bound for name, (_, bound) in READS.items()}
    for name in ("scheduled", "scheduled-newest"):
        assert tie > 50  # the load has such ties
        bounds[name] = lanes * (tie + 51) + 100
    read_by: dict[str, int] = {}
    for name, (read, _) in READS.items():
        for nodes in await plans_of(million, million_dsn, monkeypatch, read):
            on_jobs = [n["Node Type"] for n in nodes if n.get("Relation Name") == "jobs"]
            assert on_jobs, (name, nodes)
            assert "Seq Scan" not in on_jobs, (name, nodes)
            read_by[name] = max(read_by.get(name, 0), rows_read(nodes))
    over = {name: n for name, n in read_by.items() if n > bounds[name]}
    assert over == {}, read_by


async def _workers_page(c: Client) -> None:
    app = create_dashboard(c, authorize=allow_any)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        assert (await http.get("/workers")).status_code == 200


@pytest.mark.timeout(900)
async def test_workers_page_receives_a_few_jobs_per_worker_not_every_running_job(
    million: Client, million_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load's busy workers hold a thousand running jobs; the page lists the first
    few of each and counts the rest in the database. What a plan's top node returns is
    what the dashboard decodes, row by row, on every refresh: read whole, the running
    jobs cost more than the rest of the page while workers keep the CPU busy."""
    plans = await plans_of(million, million_dsn, monkeypatch, _workers_page)

    for nodes in plans:
        assert "Seq Scan" not in [n["Node Type"] for n in nodes if n.get("Relation Name") == "jobs"]
    received = sum(nodes[0]["Actual Rows"] for nodes in plans)
    assert received <= WORKERS + BUSY * JOBS_PER_WORKER, received
    assert max(rows_read(nodes) for nodes in plans) <= 2 * RUNNING


@pytest.mark.timeout(900)
async def test_control_without_lanes_the_ready_listing_reads_every_ready_job(
    million_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read in time order straight from the pending jobs (no skip scan of the
    (queue, priority) lanes), the first page of ready jobs sorts every one of them."""
    state = await PostgresStateAdapter.connect(million_dsn, max_size=2)
    views = state.statements.work_views
    listings = {
        **views.listings,
        "ready:oldest": (
            b'SELECT j.id FROM "pgwork"."jobs" AS j'
            b" WHERE j.status = 'pending' AND j.scheduled_at <= now()"
            b" ORDER BY j.scheduled_at, j.id LIMIT %(limit)s"
        ),
    }
    state.statements = dataclasses.replace(
        state.statements, work_views=dataclasses.replace(views, listings=listings)
    )
    client = create_client(state_adapter=state, registry=JobTypeRegistry(), observers=[])
    try:
        plans = await plans_of(client, million_dsn, monkeypatch, _raw_ready)
    finally:
        await client.close()

    assert max(rows_read(nodes) for nodes in plans) > 10 * READS["ready"][1]


async def _raw_ready(c: Client) -> Any:
    with contextlib.suppress(IndexError, TypeError, ValueError):  # the control: ids only
        await c.list_work(status="ready")


@pytest.mark.timeout(900)
async def test_control_without_its_window_the_input_search_reads_every_job(
    million_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The input search is bounded by its window of the newest jobs alone: without the
    window's LIMIT, a search that matches nothing reads the whole table."""
    state = await PostgresStateAdapter.connect(million_dsn, max_size=2)
    views = state.statements.work_views
    bounded = views.input_scan
    assert b"LIMIT %(examine)s::int + 1" in bounded
    unbounded = dataclasses.replace(
        views, input_scan=bounded.replace(b"LIMIT %(examine)s::int + 1", b"")
    )
    state.statements = dataclasses.replace(state.statements, work_views=unbounded)
    client = create_client(state_adapter=state, registry=JobTypeRegistry(), observers=[])
    try:
        read = READS["input-field-none"][0]
        plans = await plans_of(client, million_dsn, monkeypatch, read)
    finally:
        await client.close()

    assert max(rows_read(nodes) for nodes in plans) > JOBS
