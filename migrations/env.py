"""Alembic environment for pgwork's migrations.

Two ways in:

* ``pgwork.postgres.migrate`` (``pgwork migrate``, test fixtures) passes an open
  SQLAlchemy connection and the schema name in ``config.attributes``;
* ``alembic upgrade head`` in a checkout reads the DSN from ``PGWORK_DSN`` or
  ``DATABASE_URL`` and the schema from ``-x schema=...``, ``PGWORK_SCHEMA`` or "pgwork".

Everything runs in one transaction that first takes ``pg_advisory_xact_lock`` on a key
derived from the schema name, before Alembic reads its version table: concurrent
upgrades queue up, and each one after the first finds the schema at head.

The version table, ``pgwork_alembic_version``, lives *inside* the pgwork schema, next to
pgwork's tables: never Alembic's default ``alembic_version``, so pgwork's history never
mixes with an application's own, even with ``--schema public``. A database migrated by a
pgwork that still used ``alembic_version`` has its pgwork revision moved over first
(the application's rows in that table are left alone). Alembic creates that
table before the first revision runs, so this file creates the schema when it is missing
and, after a downgrade to base, drops the version table and the schema (if nothing else
lives in it): the schema is the container of the history, not part of it.
"""

from __future__ import annotations

import hashlib
import os
from logging.config import fileConfig

import sqlalchemy as sa
from alembic import context
from alembic.script import ScriptDirectory
from alembic.util import CommandError

from pgwork.errors import PgworkError
from pgwork.postgres.migrate import open_connection
from pgwork.postgres.schema import (
    DEFAULT_SCHEMA,
    LEGACY_VERSION_TABLE,
    VERSION_TABLE,
    build_metadata,
    validate_schema_name,
)

config = context.config

# SQLSTATE dependent_objects_still_exist: someone else's objects live in the schema.
_DEPENDENT_OBJECTS_STILL_EXIST = "2BP01"


def _schema_name() -> str:
    name = (
        config.attributes.get("schema")
        or context.get_x_argument(as_dictionary=True).get("schema")
        or os.environ.get("PGWORK_SCHEMA")
        or DEFAULT_SCHEMA
    )
    try:
        return validate_schema_name(name)
    except PgworkError as exc:
        raise CommandError(str(exc)) from exc


def lock_key(schema: str) -> int:
    """A stable signed 64-bit advisory-lock key for migrating ``schema``."""
    digest = hashlib.sha256(f"pgwork.migrate:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _quoted(schema: str) -> str:
    return sa.dialects.postgresql.dialect().identifier_preparer.quote_identifier(schema)


def _include_name(name: str | None, type_: str, parent_names: dict[str, str | None]) -> bool:
    """Autogenerate looks at this schema only, and never at the version table."""
    if type_ == "schema":
        return name == config.attributes["pgwork_schema"]
    if type_ == "table":
        return name != VERSION_TABLE
    return True


def _configure(schema: str, **kwargs: object) -> None:
    config.attributes["pgwork_schema"] = schema
    context.configure(
        target_metadata=build_metadata(schema),
        version_table=VERSION_TABLE,
        version_table_schema=schema,
        include_schemas=True,
        include_name=_include_name,
        compare_server_default=True,
        transaction_per_migration=False,
        **kwargs,
    )


def _schema_exists(connection: sa.Connection, schema: str) -> bool:
    found = connection.execute(
        sa.text("SELECT 1 FROM pg_namespace WHERE nspname = :schema"), {"schema": schema}
    )
    return found.first() is not None


def _drop_empty_history(connection: sa.Connection, schema: str) -> None:
    """After a downgrade to base: drop the version table, then the schema if it is empty."""
    if context.get_context().get_current_heads():
        return
    if not sa.inspect(connection).has_table(VERSION_TABLE, schema=schema):
        return
    connection.execute(sa.text(f"DROP TABLE {_quoted(schema)}.{_quoted(VERSION_TABLE)}"))
    try:
        with connection.begin_nested():
            connection.execute(sa.text(f"DROP SCHEMA {_quoted(schema)} RESTRICT"))
    except sa.exc.DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) != _DEPENDENT_OBJECTS_STILL_EXIST:
            raise


def _adopt_legacy_history(connection: sa.Connection, schema: str) -> None:
    """Move pgwork's revision out of ``<schema>.alembic_version`` (where pgwork up to 0.1
    kept it) into its own version table; drop the old table once nothing is left in it.

    Only revisions pgwork ships move: in a shared schema (``public``) the same table may
    hold the application's own revision, which stays where it is.
    """
    inspector = sa.inspect(connection)
    if inspector.has_table(VERSION_TABLE, schema=schema):
        return
    if not inspector.has_table(LEGACY_VERSION_TABLE, schema=schema):
        return
    ours = sorted(s.revision for s in ScriptDirectory.from_config(config).walk_revisions())
    legacy = f"{_quoted(schema)}.{_quoted(LEGACY_VERSION_TABLE)}"
    moved = (
        connection.execute(
            sa.text(f"DELETE FROM {legacy} WHERE version_num = ANY(:ours) RETURNING version_num"),
            {"ours": ours},
        )
        .scalars()
        .all()
    )
    if not moved:
        return
    table = f"{_quoted(schema)}.{_quoted(VERSION_TABLE)}"
    connection.execute(
        sa.text(
            f"CREATE TABLE {table} (version_num varchar(32) NOT NULL, "
            f"CONSTRAINT {_quoted(VERSION_TABLE + '_pkc')} PRIMARY KEY (version_num))"
        )
    )
    for revision in moved:
        connection.execute(sa.text(f"INSERT INTO {table} VALUES (:r)"), {"r": revision})
    if connection.execute(sa.text(f"SELECT NOT EXISTS (SELECT FROM {legacy})")).scalar():
        connection.execute(sa.text(f"DROP TABLE {legacy}"))


def _run_online(connection: sa.Connection, schema: str) -> None:
    # Called from an application's env.py (pgwork.alembic.upgrade), the connection may
    # be in a transaction already: then pgwork's migration is a part of it.
    begin = connection.begin_nested if connection.in_transaction() else connection.begin
    with begin():
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": lock_key(schema)})
        _configure(schema, connection=connection)
        migration = context.get_context()
        mutating = not migration.opts.get("dont_mutate", False)
        if mutating and _schema_exists(connection, schema):
            _adopt_legacy_history(connection, schema)
        before = migration.get_current_heads()
        if mutating and not _schema_exists(connection, schema):
            connection.execute(sa.text(f"CREATE SCHEMA {_quoted(schema)}"))
        with context.begin_transaction():
            context.run_migrations(schema=schema)
        if mutating:
            _drop_empty_history(connection, schema)
        # Read under the lock, so callers can tell who actually migrated.
        config.attributes["revisions"] = (before, migration.get_current_heads())


def _run_offline(schema: str) -> None:
    """``alembic upgrade head --sql``: print the SQL a DBA can review and apply."""
    _configure(schema, url="postgresql+psycopg://", literal_binds=True)
    with context.begin_transaction():
        context.execute(f"SELECT pg_advisory_xact_lock({lock_key(schema)})")
        # A script cannot look before it leaps; the guard is the only conditional DDL.
        context.execute(f"CREATE SCHEMA IF NOT EXISTS {_quoted(schema)}")
        context.run_migrations(schema=schema)


def _dsn_from_environment() -> str:
    dsn = os.environ.get("PGWORK_DSN") or os.environ.get("DATABASE_URL")
    if not dsn:
        raise CommandError("set PGWORK_DSN (or DATABASE_URL) to a postgresql:// DSN")
    # Accept SQLAlchemy-style URLs too; psycopg wants the plain libpq scheme.
    for prefix in ("postgresql+psycopg://", "postgres+psycopg://"):
        if dsn.startswith(prefix):
            dsn = "postgresql://" + dsn[len(prefix) :]
    return dsn


def main() -> None:
    schema = _schema_name()
    if context.is_offline_mode():
        _run_offline(schema)
        return
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_online(connection, schema)
        return
    if config.config_file_name is not None:
        fileConfig(config.config_file_name, disable_existing_loggers=False)
    try:
        with open_connection(_dsn_from_environment()) as connection:
            _run_online(connection, schema)
    except PgworkError as exc:
        raise CommandError(str(exc)) from exc


main()
