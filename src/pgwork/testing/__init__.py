"""Helpers for testing code that uses pgwork, and the pytest plugin behind them.

The pytest fixtures (``pgwork_dsn``, ``empty_database_dsn``, ``pg_server_dsn``, ...) come
from ``pgwork.testing.plugin``, loaded automatically when pgwork is installed. The
functions below work without pytest. Nothing in the pgwork library imports this package.
"""

from pgwork.testing.databases import (
    create_database,
    create_migrated_database,
    database_dsn,
    drop_database,
    temporary_database,
    unique_database_name,
)
from pgwork.testing.servers import ServerUnavailable, docker_server, embedded_server

__all__ = [
    "ServerUnavailable",
    "create_database",
    "create_migrated_database",
    "database_dsn",
    "docker_server",
    "drop_database",
    "embedded_server",
    "temporary_database",
    "unique_database_name",
]
