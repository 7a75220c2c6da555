"""Create and drop throwaway PostgreSQL databases for tests, yours and ours.

Everything here is synchronous and speaks in plain DSN strings, so it works from any
test runner (pytest with anyio, trio, asyncio, or none). A migrated *template* database
makes each test's fresh database a cheap file-level copy instead of a migration run.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgwork.postgres import migrate
from pgwork.postgres.connect import connect_sync
from pgwork.postgres.schema import DEFAULT_SCHEMA

__all__ = [
    "create_database",
    "create_migrated_database",
    "database_dsn",
    "drop_database",
    "temporary_database",
    "unique_database_name",
]


def unique_database_name(prefix: str = "pgwork_test") -> str:
    """A name no other test session on the same server will pick: prefix, pid, random."""
    return f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"


def database_dsn(dsn: str, dbname: str) -> str:
    """Return ``dsn`` pointing at database ``dbname``, keeping its URI or key=value form."""
    if "://" not in dsn:
        return make_conninfo(dsn, dbname=dbname)
    parts = urlsplit(dsn)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "dbname"]
    return urlunsplit(
        (parts.scheme, parts.netloc, f"/{dbname}", urlencode(query, safe="/"), parts.fragment)
    )


def create_database(admin_dsn: str, name: str | None = None, *, template: str | None = None) -> str:
    """Create database ``name`` (default: a unique one) and return its DSN.

    ``template`` copies an existing database, which must have no open connections.
    Without it the database is copied from ``template0``: truly empty, whatever
    ``template1`` holds on a shared server.
    """
    name = name or unique_database_name()
    statement = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
        sql.Identifier(name), sql.Identifier(template or "template0")
    )
    with connect_sync(admin_dsn, autocommit=True) as conn:
        conn.execute(statement)
    return database_dsn(admin_dsn, name)


def drop_database(admin_dsn: str, name: str) -> None:
    """Drop database ``name`` if it exists, disconnecting whoever is still connected."""
    with connect_sync(admin_dsn, autocommit=True) as conn:
        if conn.info.server_version >= 130000:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            return
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        )
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))


def create_migrated_database(
    admin_dsn: str, name: str | None = None, *, schema: str = DEFAULT_SCHEMA
) -> str:
    """Create a database with pgwork's schema at head and return its DSN.

    Use it once per test session as a template, then clone it per test with
    ``create_database(admin_dsn, template=name)``.
    """
    name = name or unique_database_name("pgwork_tpl")
    dsn = create_database(admin_dsn, name)
    try:
        migrate.upgrade(dsn, schema=schema)
    except BaseException:
        drop_database(admin_dsn, name)
        raise
    return dsn


@contextmanager
def temporary_database(
    admin_dsn: str,
    *,
    template: str | None = None,
    migrated: bool = False,
    schema: str = DEFAULT_SCHEMA,
) -> Iterator[str]:
    """Yield the DSN of a new database, dropped on exit.

    ``migrated=True`` runs pgwork's migrations into it (slower than cloning a
    ``template`` that is already migrated, which is what the pytest fixtures do).
    """
    name = unique_database_name()
    if migrated and template is None:
        dsn = create_migrated_database(admin_dsn, name, schema=schema)
    else:
        dsn = create_database(admin_dsn, name, template=template)
    try:
        yield dsn
    finally:
        drop_database(admin_dsn, name)
