"""pgwork next to an application's own Alembic migrations.

Two things an application's ``env.py`` needs:

* ``include_name`` (or ``include_name_filter(...)`` to compose with a filter of your
  own) for ``context.configure(include_name=...)``: autogenerate with
  ``include_schemas=True`` then never sees pgwork's schema, tables or version table,
  so it never writes a migration that drops them;
* ``upgrade(connection)`` (optional): provision pgwork from the application's own
  ``alembic upgrade``, on its connection. pgwork's revisions still go to pgwork's own
  version table, never to the application's ``alembic_version``.

Not imported by ``import pgwork``: this module loads Alembic and SQLAlchemy, which
enqueueing and workers never need. See docs/deploying.md for worked examples.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache

import sqlalchemy as sa
from alembic import command
from alembic.util.langhelpers import ModuleClsProxy

from pgwork.postgres._names import DEFAULT_SCHEMA, VERSION_TABLE, validate_schema_name
from pgwork.postgres.migrate import SchemaChange, run_on_connection
from pgwork.postgres.schema import build_metadata

__all__ = ["IncludeName", "include_name", "include_name_filter", "upgrade"]

IncludeName = Callable[[str | None, str, Mapping[str, str | None]], bool]
"""Alembic's ``include_name`` hook: ``(name, type_, parent_names) -> keep?``."""

# Where a table of the default schema appears to autogenerate: as schema None.
_DEFAULT_SEARCH_SCHEMA = "public"


@lru_cache(maxsize=8)
def _pgwork_tables(schema: str) -> frozenset[str]:
    return frozenset(t.name for t in build_metadata(schema).tables.values()) | {VERSION_TABLE}


def include_name_filter(
    schema: str = DEFAULT_SCHEMA, *, also: IncludeName | None = None
) -> IncludeName:
    """An ``include_name`` hook that hides pgwork (in ``schema``) from autogenerate.

    pgwork in a schema of its own: that whole schema is skipped. pgwork in a schema it
    shares with the application (``public``): only pgwork's tables and version table
    are. ``also``: your own filter, asked about everything pgwork's does not hide.
    """
    schema = validate_schema_name(schema)
    tables = _pgwork_tables(schema)
    shared = schema == _DEFAULT_SEARCH_SCHEMA

    def in_pgwork_schema(name: str | None) -> bool:
        return name == schema or (shared and name is None)

    def keep(name: str | None, type_: str, parent_names: Mapping[str, str | None]) -> bool:
        if type_ == "schema":
            if name == schema and not shared:
                return False
        elif type_ == "table":
            if in_pgwork_schema(parent_names.get("schema_name")) and name in tables:
                return False
        elif in_pgwork_schema(parent_names.get("schema_name")) and (
            parent_names.get("table_name") in tables
        ):
            return False
        return also is None or also(name, type_, parent_names)

    return keep


def include_name(name: str | None, type_: str, parent_names: Mapping[str, str | None]) -> bool:
    """Hide pgwork's default schema (``pgwork``) from autogenerate; use it directly as
    ``context.configure(include_schemas=True, include_name=include_name)``."""
    return _default_filter(name, type_, parent_names)


_default_filter = include_name_filter()


def upgrade(
    connection: sa.Connection, *, schema: str = DEFAULT_SCHEMA, revision: str = "head"
) -> SchemaChange:
    """Migrate pgwork's schema on ``connection``, from an application's ``env.py``.

    Call it before ``context.configure(...)``. Without a transaction open on
    ``connection`` it migrates in one of its own and commits; inside one, it becomes a
    part of it. Safe to run from many processes at once (pgwork's migration lock).
    """
    # Alembic's ``context`` and ``op`` are module-level proxies to the running command:
    # pgwork's own command replaces them, and removes them when it ends, which would
    # leave the application's env.py without its ``context``. Put them back.
    outer = _current_proxies()
    try:
        return run_on_connection(connection, schema, "upgrade", revision, command.upgrade)
    finally:
        for proxy in outer:
            proxy._install_proxy()


def _current_proxies() -> list[ModuleClsProxy]:
    from alembic import context, op

    found = [getattr(module, "_proxy", None) for module in (context, op)]
    return [proxy for proxy in found if proxy is not None]
