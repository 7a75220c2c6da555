"""The state adapter's own connections read every timestamp in UTC, whatever zone the
server's session is in: psycopg converts each ``timestamptz`` it reads into the
session's zone, and only the name ``UTC`` is its fast path (``_pool.configure_session``).

Each test runs with the test database's DSN set to a session zone of its own: New
York, and ``Etc/UTC``, the zone of Debian's packages and the official container image,
which is UTC by its offset but not by its name.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgwork import PostgresStateAdapter
from pgwork.postgres import _base as base_module
from pgwork.postgres import state as state_module

from .conftest import ClientFactory, acquired_job

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["America/New_York", "Etc/UTC"])
def zone(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def pgwork_dsn(pgwork_dsn: str, zone: str) -> str:
    """The test database, every session of it opened in ``zone``."""
    return make_conninfo(pgwork_dsn, options=f"-c TimeZone={zone}")


async def _stored_created_at(conn: psycopg.AsyncConnection[Any], job_id: Any) -> datetime:
    cur = await conn.execute("SELECT created_at FROM pgwork.jobs WHERE id = %s", (job_id,))
    row = await cur.fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


async def test_an_acquired_job_and_get_job_carry_utc_timestamps(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], zone: str
) -> None:
    client, acquired = await acquired_job(make_client, conn)
    job = await client.get_job(acquired.id)
    # The caller's own connection is in the DSN's zone, as psycopg reads it.
    stored = await _stored_created_at(conn, acquired.id)
    assert stored.tzinfo == ZoneInfo(zone)

    stamps = [
        acquired.created_at,
        acquired.scheduled_at,
        acquired.started_at,
        acquired.leased_until,
        job.created_at,
        job.scheduled_at,
        job.started_at,
    ]
    assert [stamp.tzinfo if stamp else None for stamp in stamps] == [UTC] * len(stamps)
    # The same instant, only told in UTC.
    assert acquired.created_at == job.created_at == stored


async def test_control_without_the_session_setup_timestamps_come_in_the_sessions_zone(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    zone: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def leave_as_is(connection: psycopg.AsyncConnection[Any]) -> None:
        return None

    monkeypatch.setattr(state_module, "configure_session", leave_as_is)  # the pool
    monkeypatch.setattr(base_module, "configure_session", leave_as_is)  # the own line
    client, acquired = await acquired_job(make_client, conn)
    job = await client.get_job(acquired.id)
    assert acquired.created_at.tzinfo == ZoneInfo(zone)
    assert job.created_at.tzinfo == ZoneInfo(zone)
    assert acquired.created_at.tzinfo is not UTC


async def test_through_a_transaction_pooler_the_session_is_left_in_its_zone(
    pgwork_dsn: str, zone: str
) -> None:
    """``prepare_threshold=None`` is the setting for a transaction pooler, where a
    session's ``SET`` would reach a server session other clients share."""
    state = await PostgresStateAdapter.connect(pgwork_dsn, prepare_threshold=None)
    try:
        async with state.pool.connection() as pooled:
            cur = await pooled.execute("SELECT now()")
            row = await cur.fetchone()
    finally:
        await state.close()
    assert row is not None
    assert row[0].tzinfo == ZoneInfo(zone)
