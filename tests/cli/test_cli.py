"""``pgwork migrate`` and ``pgwork check``: output, exit codes, and one-line errors."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result

from pgwork.cli import EXIT_ERROR, EXIT_NOT_AT_HEAD, main
from pgwork.postgres import migrate

REFUSED = "postgresql://pgwork:hunter2-secret@127.0.0.1:1/pgwork"


def _assert_one_line_error(result: Result, code: int = EXIT_ERROR) -> str:
    assert result.exit_code == code
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_migrate_then_check_exits_zero(runner: CliRunner, empty_database_dsn: str) -> None:
    migrated = runner.invoke(main, ["migrate", "--dsn", empty_database_dsn])
    again = runner.invoke(main, ["migrate", "--dsn", empty_database_dsn])
    checked = runner.invoke(main, ["check", "--dsn", empty_database_dsn])

    assert migrated.exit_code == 0, migrated.output
    assert f"(none) -> {migrate.head_revision()}" in migrated.stdout
    assert "already at" in again.stdout
    assert checked.exit_code == 0
    assert f"at head ({migrate.head_revision()})" in checked.stdout


def test_check_on_empty_database_exits_one(runner: CliRunner, empty_database_dsn: str) -> None:
    result = runner.invoke(main, ["check", "--dsn", empty_database_dsn])

    assert result.exit_code == EXIT_NOT_AT_HEAD
    assert "(none)" in result.stdout
    assert "pgwork migrate" in result.stdout


def test_check_names_a_revision_from_a_newer_pgwork(
    runner: CliRunner, pgwork_dsn: str, pgwork_schema: str
) -> None:
    with migrate.open_connection(pgwork_dsn) as conn, conn.begin():
        conn.execute(
            sa.text(f"UPDATE \"{pgwork_schema}\".pgwork_alembic_version SET version_num = '9999'")
        )

    result = runner.invoke(main, ["check", "--dsn", pgwork_dsn, "--schema", pgwork_schema])

    assert result.exit_code == EXIT_NOT_AT_HEAD
    assert "newer pgwork" in result.stdout


def test_check_json_prints_status(runner: CliRunner, pgwork_dsn: str, pgwork_schema: str) -> None:
    result = runner.invoke(
        main, ["check", "--json", "--dsn", pgwork_dsn, "--schema", pgwork_schema]
    )

    assert result.exit_code == 0
    assert json.loads(result.stdout) == {
        "schema": pgwork_schema,
        "current": migrate.head_revision(),
        "head": migrate.head_revision(),
        "is_current": True,
    }


def test_dsn_falls_back_to_pgwork_dsn_then_database_url(
    runner: CliRunner, empty_database_dsn: str
) -> None:
    from_url = runner.invoke(main, ["migrate"], env={"DATABASE_URL": empty_database_dsn})
    from_pgwork = runner.invoke(
        main, ["check"], env={"PGWORK_DSN": empty_database_dsn, "DATABASE_URL": REFUSED}
    )

    assert from_url.exit_code == 0, from_url.output
    assert from_pgwork.exit_code == 0, from_pgwork.output


def test_schema_option_and_environment(runner: CliRunner, empty_database_dsn: str) -> None:
    result = runner.invoke(
        main, ["migrate", "--dsn", empty_database_dsn], env={"PGWORK_SCHEMA": "cli_schema"}
    )

    assert result.exit_code == 0, result.output
    assert migrate.check(empty_database_dsn, schema="cli_schema").is_current
    assert not migrate.check(empty_database_dsn).is_current


@pytest.mark.parametrize("command", ["migrate", "check"])
def test_unreachable_server_prints_one_line_without_password(
    runner: CliRunner, command: str
) -> None:
    result = runner.invoke(main, [command, "--dsn", REFUSED])

    line = _assert_one_line_error(result)
    assert "cannot connect" in line
    assert "hunter2-secret" not in result.output


def test_invalid_schema_prints_one_line(runner: CliRunner) -> None:
    result = runner.invoke(main, ["migrate", "--dsn", REFUSED, "--schema", "Bad-Name"])

    assert "invalid pgwork schema name" in _assert_one_line_error(result)


def test_unknown_revision_prints_one_line(runner: CliRunner, empty_database_dsn: str) -> None:
    result = runner.invoke(main, ["migrate", "--dsn", empty_database_dsn, "--revision", "nope"])

    assert "nope" in _assert_one_line_error(result)


def test_missing_dsn_is_a_usage_error(runner: CliRunner) -> None:
    result = runner.invoke(main, ["check"])

    assert result.exit_code == 2
    assert "PGWORK_DSN" in result.stderr
