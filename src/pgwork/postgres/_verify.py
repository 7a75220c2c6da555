"""Checking, when a client or worker starts, that its schema is at this pgwork's head.

Plain psycopg against Alembic's version table: the engine never imports Alembic or
SQLAlchemy (``migrate.py`` does, for ``pgwork migrate`` and ``pgwork check``).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from pgwork.errors import SchemaMissingError, SchemaOutdatedError
from pgwork.postgres._names import HEAD_REVISION, VERSION_TABLE, validate_schema_name

__all__ = ["verify_schema"]


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
        cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", [table.as_string(conn)])
        row = await cur.fetchone()
        if row is None or not row[0]:
            raise SchemaMissingError(schema)
        cur = await conn.execute(sql.SQL("SELECT version_num FROM {}").format(table))
        found = sorted(r[0] for r in await cur.fetchall())
    finally:
        if was_idle and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            await conn.rollback()
    if found != [expected]:
        raise SchemaOutdatedError(schema, ",".join(found) or None, expected)
