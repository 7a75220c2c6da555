"""The pytest plugin and helpers that users get from ``pgwork.testing``."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa
from psycopg.conninfo import conninfo_to_dict

from pgwork.postgres import migrate
from pgwork.postgres.connect import connect_sync
from pgwork.testing import create_database, database_dsn, drop_database, temporary_database
from pgwork.testing.servers import ServerUnavailable, docker_server


def _count(dsn: str, query: str) -> int:
    with migrate.open_connection(dsn) as conn:
        return int(conn.execute(sa.text(query)).scalar_one())


@pytest.mark.parametrize("run", [1, 2])
def test_each_test_gets_a_fresh_migrated_database(
    pgwork_dsn: str, pgwork_schema: str, run: int
) -> None:
    assert migrate.check(pgwork_dsn, schema=pgwork_schema).is_current
    with migrate.open_connection(pgwork_dsn) as conn, conn.begin():
        conn.execute(sa.text(f"INSERT INTO \"{pgwork_schema}\".queues (name) VALUES ('q')"))

    assert _count(pgwork_dsn, f'SELECT count(*) FROM "{pgwork_schema}".queues') == 1


def test_empty_database_has_no_pgwork_schema(empty_database_dsn: str) -> None:
    assert migrate.current_revision(empty_database_dsn) is None
    assert (
        _count(empty_database_dsn, "SELECT count(*) FROM pg_namespace WHERE nspname = 'pgwork'")
        == 0
    )


def test_temporary_database_is_dropped_on_exit(pg_server_dsn: str) -> None:
    with temporary_database(pg_server_dsn, migrated=True) as dsn:
        assert migrate.check(dsn).is_current
        name = sa.make_url(dsn.replace("postgresql://", "postgresql+psycopg://", 1)).database

    assert _count(pg_server_dsn, f"SELECT count(*) FROM pg_database WHERE datname = '{name}'") == 0


def test_drop_database_disconnects_open_sessions(pg_server_dsn: str) -> None:
    dsn = create_database(pg_server_dsn, "pgwork_harness_busy")
    with connect_sync(dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")

        drop_database(pg_server_dsn, "pgwork_harness_busy")

        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    query = "SELECT count(*) FROM pg_database WHERE datname = 'pgwork_harness_busy'"
    assert _count(pg_server_dsn, query) == 0


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgresql://u:p@h:5432/postgres", "postgresql://u:p@h:5432/other"),
        ("postgresql://u@/postgres?host=/tmp/sock", "postgresql://u@/other?host=/tmp/sock"),
        (
            "postgresql://u@h/x?dbname=postgres&sslmode=disable",
            "postgresql://u@h/other?sslmode=disable",
        ),
        ("host=h user=u dbname=postgres", "host=h user=u dbname=other"),
    ],
)
def test_database_dsn_keeps_the_dsn_form(dsn: str, expected: str) -> None:
    result = database_dsn(dsn, "other")

    assert ("://" in result) == ("://" in expected)
    assert conninfo_to_dict(result) == conninfo_to_dict(expected)


def _docker_available() -> bool:
    try:
        with docker_server():
            return True
    except ServerUnavailable:
        return False


def test_docker_mode_fails_with_the_reason_when_no_engine(pytester: pytest.Pytester) -> None:
    if _docker_available():
        pytest.skip("a Docker engine is reachable here; the failure path cannot be exercised")
    pytester.makepyfile(
        """
        def test_needs_database(pgwork_dsn):
            assert pgwork_dsn
        """
    )

    result = pytester.runpytest_subprocess("--pg=docker", "-p", "no:cacheprovider")

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*no Docker engine is reachable*"])


def test_plugin_fixtures_use_the_given_dsn(
    pytester: pytest.Pytester, pg_server_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGWORK_TEST_DSN", pg_server_dsn)
    pytester.makepyfile(
        f"""
        def test_server(pg_server_dsn):
            assert pg_server_dsn == {pg_server_dsn!r}

        def test_migrated(pgwork_dsn):
            from pgwork.postgres.migrate import check
            assert check(pgwork_dsn).is_current
        """
    )

    result = pytester.runpytest_subprocess("--pg=dsn", "-p", "no:cacheprovider")

    result.assert_outcomes(passed=2)
