"""pgwork refuses a PostgreSQL older than 13 at connect and at migrate, by name.

There is no PostgreSQL 12 here: the tests make the check read 12.17, and a real
connect to the suite's server (15 or newer) is the control.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgwork import PostgresStateAdapter, UnsupportedServerVersionError
from pgwork.postgres import _verify, migrate

PG12 = 120017


def pretend_pg12(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_verify, "server_version", lambda conn: PG12)


@pytest.mark.anyio
async def test_connect_refuses_a_server_older_than_13(
    pgwork_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pretend_pg12(monkeypatch)
    with pytest.raises(UnsupportedServerVersionError) as caught:
        await PostgresStateAdapter.connect(pgwork_dsn, verify=False)
    assert "PostgreSQL 12.17 is not supported" in str(caught.value)
    assert "PostgreSQL 13 or newer" in str(caught.value)
    assert (caught.value.server_version, caught.value.minimum) == (PG12, 130000)


def test_migrate_refuses_a_server_older_than_13_before_any_ddl(
    empty_database_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pretend_pg12(monkeypatch)
    with pytest.raises(UnsupportedServerVersionError, match=r"12\.17"):
        migrate.upgrade(empty_database_dsn)
    with psycopg.connect(empty_database_dsn) as conn:
        row = conn.execute("SELECT to_regnamespace('pgwork') IS NULL").fetchone()
    assert row == (True,)  # nothing was created


@pytest.mark.anyio
async def test_a_real_connect_passes_the_check(pgwork_dsn: str) -> None:
    state = await PostgresStateAdapter.connect(pgwork_dsn)
    try:
        async with state.pool.connection() as conn:
            version: Any = _verify.server_version(conn)
        assert version >= _verify.MIN_SERVER_VERSION
    finally:
        await state.close()
