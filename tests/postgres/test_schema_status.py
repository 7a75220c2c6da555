"""``check`` and ``verify_schema`` tell a migrated schema from a missing or stale one."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from pgwork.errors import SchemaMissingError, SchemaOutdatedError
from pgwork.postgres import migrate
from pgwork.postgres.connect import connect


def test_check_reports_not_at_head_on_empty_database(empty_database_dsn: str) -> None:
    status = migrate.check(empty_database_dsn)

    assert status == migrate.SchemaStatus(
        schema="pgwork", current=None, head=migrate.head_revision()
    )
    assert not status.is_current


def test_check_reports_at_head_after_upgrade(empty_database_dsn: str) -> None:
    change = migrate.upgrade(empty_database_dsn)

    status = migrate.check(empty_database_dsn)

    assert change == migrate.SchemaChange(
        schema="pgwork", before=None, after=migrate.head_revision()
    )
    assert status.is_current
    assert status.current == migrate.head_revision()


def test_second_upgrade_changes_nothing(pgwork_dsn: str, pgwork_schema: str) -> None:
    change = migrate.upgrade(pgwork_dsn, schema=pgwork_schema)

    assert not change.changed
    assert change.after == migrate.head_revision()


def test_check_runs_no_ddl_on_an_empty_database(empty_database_dsn: str) -> None:
    migrate.check(empty_database_dsn)
    migrate.current_revision(empty_database_dsn)

    with migrate.open_connection(empty_database_dsn) as conn:
        schema = conn.execute(
            sa.text("SELECT count(*) FROM pg_namespace WHERE nspname = 'pgwork'")
        ).scalar_one()
    assert schema == 0


@pytest.mark.anyio
async def test_verify_schema_passes_at_head_and_leaves_connection_idle(
    pgwork_dsn: str, pgwork_schema: str
) -> None:
    conn = await connect(pgwork_dsn)
    try:
        await migrate.verify_schema(conn, pgwork_schema)

        assert conn.info.transaction_status.name == "IDLE"
    finally:
        await conn.close()


@pytest.mark.anyio
async def test_verify_schema_raises_missing_on_empty_database(empty_database_dsn: str) -> None:
    conn = await connect(empty_database_dsn, autocommit=True)
    try:
        with pytest.raises(SchemaMissingError, match="pgwork migrate") as err:
            await migrate.verify_schema(conn, "pgwork")
    finally:
        await conn.close()

    assert err.value.schema == "pgwork"


@pytest.mark.anyio
async def test_verify_schema_raises_outdated_for_another_revision(
    pgwork_dsn: str, pgwork_schema: str
) -> None:
    conn = await connect(pgwork_dsn, autocommit=True)
    try:
        await conn.execute(
            f"UPDATE \"{pgwork_schema}\".pgwork_alembic_version SET version_num = '0000'"
        )

        with pytest.raises(SchemaOutdatedError) as err:
            await migrate.verify_schema(conn, pgwork_schema)
    finally:
        await conn.close()

    assert err.value.current == "0000"
    assert err.value.expected == migrate.head_revision()
    assert not migrate.check(pgwork_dsn, schema=pgwork_schema).is_current


@pytest.mark.anyio
async def test_verify_schema_inside_an_open_transaction_keeps_it_open(
    pgwork_dsn: str, pgwork_schema: str
) -> None:
    conn = await connect(pgwork_dsn)
    try:
        async with conn.transaction():
            await conn.execute("SELECT 1")
            await migrate.verify_schema(conn, pgwork_schema)

            assert conn.info.transaction_status.name == "INTRANS"
    finally:
        await conn.close()
