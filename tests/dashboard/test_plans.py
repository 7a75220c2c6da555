"""The dashboard's reads use indexes: no sequential scan of ``jobs`` on a table of
finished and unfinished jobs of several types, queues and chains, freshly analyzed.

The statements are the ones the adapter sends (captured from its ``_read``), planned
with the same parameters, like tests/engine/test_queries.py does for the listings.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import psycopg
import pytest
from bench.dashboard import load_statements

from pgwork import Client
from pgwork.errors import PgworkError
from pgwork.records import ChainStatus, JobStatus

pytestmark = pytest.mark.anyio


@pytest.fixture
async def loaded(client: Client, pgwork_dsn: str) -> Client:
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as conn:
        for statement in load_statements(jobs=30_000, schema="pgwork"):
            await conn.execute(statement)
    return client


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(_nodes(child))
    return found


async def plans_of(
    client: Client,
    dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    call: Callable[[Client], Awaitable[Any]],
) -> list[list[dict[str, Any]]]:
    """Plans of every statement ``call`` sends, with the parameters it sent."""
    sent: list[tuple[bytes, Any]] = []
    execute = psycopg.AsyncCursor.execute

    async def recording(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
        if isinstance(query, bytes) and query.lstrip().upper().startswith((b"SELECT", b"WITH")):
            sent.append((query, params))
        return await execute(self, query, params, **kwargs)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", recording)
    try:
        await call(client)
    except PgworkError:  # not found: the statements ran all the same
        pass
    finally:
        monkeypatch.undo()
    assert sent
    plans = []
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for query, params in sent:
            cur = await conn.execute(b"EXPLAIN (FORMAT JSON) " + query, params, prepare=False)
            row = await cur.fetchone()
            assert row is not None
            document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
            plans.append(_nodes(document[0]["Plan"]))
    return plans


SOME = UUID(int=12345)

READS: dict[str, Callable[[Client], Awaitable[Any]]] = {
    "overview-counts": lambda c: c.count_jobs(),
    "overview-activity": lambda c: c.recent_activity(),
    "chains": lambda c: c.list_chains(limit=50),
    "chains-by-status": lambda c: c.list_chains(status=ChainStatus.FAILED, limit=50),
    "chains-by-type": lambda c: c.list_chains(type_name="bench.email", limit=50),
    "chains-by-dedup-key": lambda c: c.list_chains(dedup_key="key-77", limit=50),
    "chain": lambda c: c.get_chain(SOME),
    "chain-jobs": lambda c: c.list_chain_jobs(SOME),
    "chain-links": lambda c: c.chain_links(SOME),
    "job": lambda c: c.get_job(SOME),
    "failed": lambda c: c.list_jobs(status=JobStatus.FAILED, limit=50),
}


@pytest.mark.parametrize("read", READS.values(), ids=READS.keys())
async def test_dashboard_reads_never_scan_the_jobs_table(
    loaded: Client, pgwork_dsn: str, monkeypatch: pytest.MonkeyPatch, read: Any
) -> None:
    plans = await plans_of(loaded, pgwork_dsn, monkeypatch, read)

    for nodes in plans:
        on_jobs = [n["Node Type"] for n in nodes if n.get("Relation Name") == "jobs"]
        assert on_jobs, nodes
        assert "Seq Scan" not in on_jobs, nodes


async def test_control_without_the_ended_jobs_index_the_activity_read_scans_the_table(
    loaded: Client, pgwork_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last hour is one range of jobs_ended_idx (migration 0007); without it no
    index has the end time of completed jobs, and the read scans the table."""
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as conn:
        await conn.execute("DROP INDEX pgwork.jobs_ended_idx")

    plans = await plans_of(loaded, pgwork_dsn, monkeypatch, READS["overview-activity"])

    scans = [n["Node Type"] for nodes in plans for n in nodes if n.get("Relation Name") == "jobs"]
    assert "Seq Scan" in scans


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_the_last_hour_of_a_million_jobs_is_one_range_of_the_ended_jobs_index(
    client: Client, pgwork_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as conn:
        for statement in load_statements(jobs=1_000_000, schema="pgwork"):
            await conn.execute(statement)

    plans = await plans_of(client, pgwork_dsn, monkeypatch, READS["overview-activity"])

    on_jobs = [n for nodes in plans for n in nodes if n.get("Relation Name") == "jobs"]
    assert [n["Node Type"] for n in on_jobs] in (["Index Scan"], ["Index Only Scan"]), on_jobs
    assert on_jobs[0]["Index Name"] == "jobs_ended_idx"
    assert on_jobs[0]["Scan Direction"] == "Backward"
