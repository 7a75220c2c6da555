"""Checking, when a client or worker starts, that its schema is at this pgwork's head.

Plain psycopg against Alembic's version table: the engine never imports Alembic or
SQLAlchemy (``migrate.py`` does, for ``pgwork migrate`` and ``pgwork check``).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from pgwork.errors import SchemaMissingError, SchemaOutdatedError, UnsupportedServerVersionError
from pgwork.postgres._names import (
    HEAD_REVISION,
    LEGACY_VERSION_TABLE,
    VERSION_TABLE,
    validate_schema_name,
)

__all__ = ["MIN_SERVER_VERSION", "check_server_version", "server_version", "verify_schema"]

# PostgreSQL 13 made gen_random_uuid() built in; every lease token comes from it. On 12
# the schema migrates but every acquire fails, so an older server is refused up front.
# Tested on 15 and 18; supported: 13 to 18.
MIN_SERVER_VERSION = 130000


def server_version(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> int:
    """The server's version number as libpq reports it (``150004`` for 15.4)."""
    return int(conn.info.server_version)


def check_server_version(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Raise ``UnsupportedServerVersionError`` if the server is older than pgwork needs."""
    version = server_version(conn)
    if version < MIN_SERVER_VERSION:
        raise UnsupportedServerVersionError(version, MIN_SERVER_VERSION)


async def verify_schema(conn: psycopg.AsyncConnection[Any], schema: str) -> None:
    """Raise unless ``schema`` is migrated to exactly this pgwork's head revision.

    Cheap enough to call whenever a worker or client starts: a catalog lookup and a
    one-row read. A connection that was idle outside a transaction is left that way.
    """
    schema = validate_schema_name(schema)
    expected = HEAD_REVISION
    table = sql.Identifier(schema, VERSION_TABLE)
    was_idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    try:
        if not await _exists(conn, table):
            # Installed by a pgwork that kept its revision in Alembic's default table:
            # outdated (``pgwork migrate`` moves it), not missing.
            legacy = sql.Identifier(schema, LEGACY_VERSION_TABLE)
            if await _exists(conn, legacy) and await _exists(conn, sql.Identifier(schema, "jobs")):
                raise SchemaOutdatedError(schema, f"(in {LEGACY_VERSION_TABLE})", expected)
            raise SchemaMissingError(schema)
        cur = await conn.execute(sql.SQL("SELECT version_num FROM {}").format(table))
        found = sorted(r[0] for r in await cur.fetchall())
    finally:
        if was_idle and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            await conn.rollback()
    if found != [expected]:
        raise SchemaOutdatedError(schema, ",".join(found) or None, expected)


async def _exists(conn: psycopg.AsyncConnection[Any], table: sql.Identifier) -> bool:
    cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", [table.as_string(conn)])
    row = await cur.fetchone()
    return row is not None and bool(row[0])
