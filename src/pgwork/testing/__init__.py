"""Helpers for testing code that uses pgwork, and the pytest plugin behind them.

The pytest fixtures (``pgwork_dsn``, ``empty_database_dsn``, ``pg_server_dsn``, ...) come
from ``pgwork.testing.plugin``, loaded automatically when pgwork is installed. The
functions below work without pytest. Nothing in the pgwork library imports this package.

They are imported on first use (PEP 562): pytest imports this package for its plugin in
every run of a project that installs pgwork, and the helpers load migrations, SQLAlchemy
and Alembic, which a run that never uses them should not pay for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgwork.testing.databases import (
        create_database,
        create_migrated_database,
        database_dsn,
        drop_database,
        temporary_database,
        unique_database_name,
    )
    from pgwork.testing.sample import sample_statements, uuid7_sql
    from pgwork.testing.servers import ServerUnavailable, docker_server, embedded_server

__all__ = [
    "ServerUnavailable",
    "create_database",
    "create_migrated_database",
    "database_dsn",
    "docker_server",
    "drop_database",
    "embedded_server",
    "sample_statements",
    "temporary_database",
    "unique_database_name",
    "uuid7_sql",
]

_HOMES = {
    "ServerUnavailable": "pgwork.testing.servers",
    "docker_server": "pgwork.testing.servers",
    "embedded_server": "pgwork.testing.servers",
    "create_database": "pgwork.testing.databases",
    "create_migrated_database": "pgwork.testing.databases",
    "database_dsn": "pgwork.testing.databases",
    "drop_database": "pgwork.testing.databases",
    "temporary_database": "pgwork.testing.databases",
    "unique_database_name": "pgwork.testing.databases",
    "sample_statements": "pgwork.testing.sample",
    "uuid7_sql": "pgwork.testing.sample",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
