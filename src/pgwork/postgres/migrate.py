"""Apply and inspect pgwork's Alembic migrations from Python.

The CLI (``pgwork migrate`` / ``pgwork check``), the test fixtures and users' own
deployment code call these functions; nothing in pgwork runs DDL any other way. The
engine only calls :func:`verify_schema` (in ``_verify``, re-exported here), which reads
one row and changes nothing.

pgwork keeps its Alembic version table (``pgwork_alembic_version``) inside its own
schema, so its history never mixes with an application's own Alembic history in the
same database. ``pgwork.alembic`` lets an application's own ``env.py`` run these
migrations and keep pgwork's tables out of its autogenerate.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.pool import NullPool

from pgwork.errors import ConfigurationError, DatabaseError
from pgwork.postgres._names import (
    DEFAULT_SCHEMA,
    LEGACY_VERSION_TABLE,
    VERSION_TABLE,
    validate_schema_name,
)
from pgwork.postgres._verify import check_server_version, verify_schema
from pgwork.postgres.connect import connect_sync, unreachable

__all__ = [
    "SchemaChange",
    "SchemaStatus",
    "check",
    "current_revision",
    "downgrade",
    "head_revision",
    "known_revisions",
    "open_connection",
    "run_on_connection",
    "script_location",
    "upgrade",
    "verify_schema",
]


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    """Where a database's pgwork schema stands relative to this pgwork's migrations."""

    schema: str
    current: str | None
    head: str

    @property
    def is_current(self) -> bool:
        return self.current == self.head


@dataclass(frozen=True, slots=True)
class SchemaChange:
    """What one ``upgrade`` / ``downgrade`` call did, read under the migration lock."""

    schema: str
    before: str | None
    after: str | None

    @property
    def changed(self) -> bool:
        return self.before != self.after


def _revision(heads: tuple[str, ...]) -> str | None:
    return ",".join(sorted(heads)) or None


def script_location() -> Path:
    """Return the Alembic script directory (``env.py``, ``versions/``).

    An installed wheel carries it as ``pgwork/_migrations``; in a source checkout or an
    editable install it is the repository's top-level ``migrations/``.
    """
    packaged = importlib.resources.files("pgwork") / "_migrations"
    if isinstance(packaged, Path) and (packaged / "env.py").is_file():
        return packaged
    checkout = Path(__file__).resolve().parents[3] / "migrations"
    if (checkout / "env.py").is_file():
        return checkout
    raise ConfigurationError(
        f"pgwork's migrations are missing (looked in {packaged} and {checkout}); reinstall pgwork"
    )


def _config(schema: str, connection: sa.Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    config.set_main_option("path_separator", "os")
    config.attributes["schema"] = schema
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@lru_cache(maxsize=1)
def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(_config(DEFAULT_SCHEMA))


def known_revisions() -> frozenset[str]:
    """Every revision this pgwork ships; a database at another one is from a newer pgwork."""
    return frozenset(script.revision for script in _scripts().walk_revisions())


@lru_cache(maxsize=1)
def head_revision() -> str:
    """Return the newest revision this pgwork ships (its history has a single head)."""
    head = _scripts().get_current_head()
    if head is None:
        raise ConfigurationError("pgwork's migrations have no revisions; reinstall pgwork")
    return head


@contextmanager
def open_connection(dsn: str) -> Iterator[sa.Connection]:
    """Yield a SQLAlchemy connection (``postgresql+psycopg`` dialect) on ``dsn``.

    The DSN is handed to psycopg unchanged, so URI and ``key=value`` forms both work;
    connection failures raise ``DatabaseUnreachableError``.
    """
    engine = sa.create_engine(
        "postgresql+psycopg://", creator=lambda: connect_sync(dsn), poolclass=NullPool
    )
    try:
        try:
            connection = engine.connect()
        except sa.exc.DBAPIError as exc:  # raised by the dialect's first-connect queries
            raise unreachable(dsn, exc.orig or exc) from exc
        with connection:
            yield connection
    finally:
        engine.dispose()


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _run(dsn: str, schema: str, action: str, revision: str, fn: Any) -> SchemaChange:
    schema = validate_schema_name(schema)
    with open_connection(dsn) as connection:
        return run_on_connection(connection, schema, action, revision, fn)


def run_on_connection(
    connection: sa.Connection, schema: str, action: str, revision: str, fn: Any
) -> SchemaChange:
    """Run the Alembic command ``fn`` (``command.upgrade``, ...) of pgwork's history on
    ``connection``; an open transaction on it takes the migration in (a savepoint)."""
    schema = validate_schema_name(schema)
    # Before any DDL: on a server pgwork cannot run on, a migrated schema would only
    # make every worker fail later.
    driver_connection = connection.connection.driver_connection
    assert driver_connection is not None  # a live connection
    check_server_version(driver_connection)
    config = _config(schema, connection)
    try:
        fn(config, revision)
    except CommandError as exc:
        raise ConfigurationError(
            f"cannot {action} pgwork schema {schema!r} to {revision!r}: {exc}"
        ) from exc
    except sa.exc.DBAPIError as exc:
        raise DatabaseError(
            f"{action} of pgwork schema {schema!r} to {revision!r} failed and was rolled "
            f"back: {_first_line(exc)}"
        ) from exc
    before, after = config.attributes["revisions"]
    return SchemaChange(schema=schema, before=_revision(before), after=_revision(after))


def upgrade(dsn: str, *, schema: str = DEFAULT_SCHEMA, revision: str = "head") -> SchemaChange:
    """Migrate ``schema`` up to ``revision``, creating it in an empty database.

    Runs in one transaction under an advisory lock keyed on the schema name, so any
    number of processes may call it at once: one migrates, the others then find the
    schema at head and do nothing (their ``SchemaChange.changed`` is False).
    """
    return _run(dsn, schema, "upgrade", revision, command.upgrade)


def downgrade(dsn: str, *, schema: str, revision: str = "base") -> SchemaChange:
    """Migrate ``schema`` down to ``revision``; ``"base"`` drops every pgwork object.

    ``schema`` has no default on purpose: name what you are about to drop.
    """
    return _run(dsn, schema, "downgrade", revision, command.downgrade)


def current_revision(dsn: str, *, schema: str = DEFAULT_SCHEMA) -> str | None:
    """Return the revision recorded in ``schema``'s version table (None if never migrated).

    A database whose pgwork revision still sits in Alembic's default table (pgwork up to
    0.1) reports that revision; ``upgrade`` moves it into pgwork's own table.
    """
    schema = validate_schema_name(schema)
    with open_connection(dsn) as connection:
        heads = _heads(connection, schema, VERSION_TABLE)
        if not heads and sa.inspect(connection).has_table(LEGACY_VERSION_TABLE, schema=schema):
            ours = known_revisions()
            heads = tuple(h for h in _heads(connection, schema, LEGACY_VERSION_TABLE) if h in ours)
    return _revision(heads)


def _heads(connection: sa.Connection, schema: str, table: str) -> tuple[str, ...]:
    context = MigrationContext.configure(
        connection, opts={"version_table": table, "version_table_schema": schema}
    )
    return context.get_current_heads()


def check(dsn: str, *, schema: str = DEFAULT_SCHEMA) -> SchemaStatus:
    """Compare ``schema`` in the database with this pgwork's head revision. Read-only."""
    return SchemaStatus(
        schema=validate_schema_name(schema),
        current=current_revision(dsn, schema=schema),
        head=head_revision(),
    )
