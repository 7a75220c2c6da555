"""pytest plugin: a PostgreSQL server per session, a migrated database per test.

Installed with pgwork (entry point ``pytest11``), so its fixtures are available in any
project that has pgwork installed; nothing starts unless a test asks for a fixture.

Choosing the server (``--pg``, default ``auto``):

* ``auto``: ``PGWORK_TEST_DSN`` if set, else an embedded PostgreSQL (``pgwork[embedded]``);
* ``dsn``: ``PGWORK_TEST_DSN`` (an admin DSN allowed to create databases), required;
* ``embedded``: a private server in a temporary directory, deleted at the end;
* ``docker``: PostgreSQL 18 through testcontainers; tests are skipped, with the reason,
  when no Docker engine answers.

Fixtures (all sync, all plain DSN strings, usable from any async test runner):

``pg_server_dsn``             session: admin DSN of the chosen server
``pgwork_schema``             session: schema name to migrate ("pgwork"; override it)
``pgwork_template_database``  session: name of a database migrated to head, dropped at the end
``pgwork_dsn``                function: DSN of a fresh clone of the template, dropped after
``empty_database_dsn``        function: DSN of a fresh database with no pgwork schema
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager

import pytest

from pgwork.postgres.schema import DEFAULT_SCHEMA
from pgwork.testing.databases import (
    create_migrated_database,
    drop_database,
    temporary_database,
    unique_database_name,
)
from pgwork.testing.servers import ServerUnavailable, docker_server, embedded_server

__all__ = [
    "PG_MODES",
    "TEST_DSN_ENV",
    "empty_database_dsn",
    "pg_server_dsn",
    "pgwork_dsn",
    "pgwork_schema",
    "pgwork_template_database",
]

PG_MODES = ("auto", "dsn", "embedded", "docker")
TEST_DSN_ENV = "PGWORK_TEST_DSN"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pgwork", "pgwork test databases")
    group.addoption(
        "--pg",
        dest="pgwork_pg",
        choices=PG_MODES,
        default="auto",
        help=(
            "PostgreSQL server for pgwork fixtures: auto (PGWORK_TEST_DSN, else embedded), "
            "dsn, embedded, or docker (testcontainers; skipped without a Docker engine)"
        ),
    )


@contextmanager
def _given_dsn(dsn: str) -> Iterator[str]:
    yield dsn


def _server(mode: str) -> AbstractContextManager[str]:
    dsn = os.environ.get(TEST_DSN_ENV)
    if mode == "dsn" or (mode == "auto" and dsn):
        if not dsn:
            raise pytest.UsageError(f"--pg=dsn needs {TEST_DSN_ENV} set to an admin DSN")
        return _given_dsn(dsn)
    if mode == "docker":
        return docker_server()
    return embedded_server()


@pytest.fixture(scope="session")
def pg_server_dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    """Admin DSN of the session's PostgreSQL server (see ``--pg``)."""
    with ExitStack() as stack:
        try:
            dsn = stack.enter_context(_server(request.config.getoption("pgwork_pg")))
        except ServerUnavailable as exc:
            pytest.skip(str(exc))
        yield dsn


@pytest.fixture(scope="session")
def pgwork_schema() -> str:
    """Schema the template is migrated into; override in a conftest to test another."""
    return DEFAULT_SCHEMA


@pytest.fixture(scope="session")
def pgwork_template_database(pg_server_dsn: str, pgwork_schema: str) -> Iterator[str]:
    """Name of a database migrated to head once per session, cloned by ``pgwork_dsn``."""
    name = unique_database_name("pgwork_tpl")
    create_migrated_database(pg_server_dsn, name, schema=pgwork_schema)
    try:
        yield name
    finally:
        drop_database(pg_server_dsn, name)


@pytest.fixture
def pgwork_dsn(pg_server_dsn: str, pgwork_template_database: str) -> Iterator[str]:
    """DSN of a fresh database with pgwork's schema at head, dropped after the test."""
    with temporary_database(pg_server_dsn, template=pgwork_template_database) as dsn:
        yield dsn


@pytest.fixture
def empty_database_dsn(pg_server_dsn: str) -> Iterator[str]:
    """DSN of a fresh, empty database (no pgwork schema), dropped after the test."""
    with temporary_database(pg_server_dsn) as dsn:
        yield dsn
