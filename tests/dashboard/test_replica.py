"""A read-only dashboard serves every page from a streaming replica (docs/scaling.md,
"Past one PostgreSQL"): a hot standby of a private cluster, built with pg_basebackup,
refuses every write and every row lock, so a page that needed the primary fails here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from uuid import UUID

import anyio
import httpx
import psycopg
import pytest
from tests.dashboard._support import breaks, echo, registry, run_until_settled, start, waits
from tests.faults._cluster import PrivateCluster

from pgwork import (
    Client,
    PgworkError,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
)
from pgwork.dashboard import allow_any, create_dashboard
from pgwork.testing import create_migrated_database, database_dsn

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]


@dataclass(frozen=True)
class Pair:
    primary: str
    replica: str


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    """A primary with pgwork's schema and its hot standby, streaming."""
    primary = PrivateCluster()
    replica = PrivateCluster()
    try:
        primary.init()
        primary.start()
        primary.wait_ready()
        dsn = create_migrated_database(primary.admin_dsn, "app")
        replica.clone_of(primary)
        replica.start()
        replica.wait_ready()
        yield Pair(dsn, database_dsn(replica.admin_dsn, "app"))
    finally:
        replica.destroy()
        primary.destroy()


async def _caught_up(pair: Pair) -> None:
    """Wait until the replica has replayed everything the primary wrote so far."""
    async with await psycopg.AsyncConnection.connect(pair.primary, autocommit=True) as conn:
        cur = await conn.execute("SELECT pg_current_wal_lsn()::text")
        row = await cur.fetchone()
    assert row is not None
    async with await psycopg.AsyncConnection.connect(pair.replica, autocommit=True) as conn:
        for _ in range(600):
            cur = await conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [row[0]])
            replayed = await cur.fetchone()
            if replayed is not None and replayed[0]:
                return
            await anyio.sleep(0.05)
    raise AssertionError("the replica did not catch up in 30 s")


async def _client(dsn: str) -> Client:
    return create_client(
        state_adapter=await PostgresStateAdapter.connect(dsn, max_size=4),
        notify_adapter=PostgresNotifyAdapter(dsn),
        registry=registry,
        observers=[],
    )


@pytest.fixture
async def seeded(pair: Pair) -> AsyncIterator[dict[str, str]]:
    """Chains of every kind the pages show, written on the primary and replayed."""
    client = await _client(pair.primary)
    try:
        done = await start(client, pair.primary, echo, "done")
        failed = await start(client, pair.primary, breaks, "failed")
        await run_until_settled(client, [done.job_id, failed.job_id])
        pending = await start(client, pair.primary, waits, "pending")
        await _caught_up(pair)
        yield {
            "done": str(done.id),
            "failed": str(failed.job_id),
            "pending": str(pending.id),
        }
    finally:
        await client.close()


async def test_a_read_only_dashboard_serves_every_page_from_a_hot_standby(
    pair: Pair, seeded: dict[str, str]
) -> None:
    client = await _client(pair.replica)
    try:
        app = create_dashboard(client, authorize=allow_any, read_only=True)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as http:
            paths = [
                "/",
                "/chains",
                "/chains?status=failed",
                f"/chains/{seeded['done']}",
                f"/chains/{seeded['pending']}",
                f"/jobs/{seeded['failed']}",
                "/jobs?status=ready",
                "/jobs?status=failed&order=newest",
                "/workers",
                "/failed",
                "/queues",
                "/errors",
                "/waiting",
                "/limits",
                "/schedules",
                "/history",
                f"/search?id={seeded['failed'][:8]}",
            ]
            answers = {path: (await http.get(path)).status_code for path in paths}
    finally:
        await client.close()
    assert answers == dict.fromkeys(paths, 200)


async def test_control_the_standby_refuses_what_needs_the_primary(
    pair: Pair, seeded: dict[str, str]
) -> None:
    """The pages above pass because they only read: the same client on the standby
    cannot cancel a chain."""
    client = await _client(pair.replica)
    try:
        async with await psycopg.AsyncConnection.connect(pair.replica) as conn:
            with pytest.raises((PgworkError, psycopg.Error), match=r"read-only|recovery"):
                await client.cancel(conn, [UUID(seeded["pending"])])
    finally:
        await client.close()
