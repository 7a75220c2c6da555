"""Every operator command (jobs, chains, queues, workers) fails in one line without a
traceback: unreachable server, missing or invalid schema, no DSN at all."""

from __future__ import annotations

import pytest
from click.testing import CliRunner, Result

from pgwork.cli import EXIT_ERROR, main

REFUSED = "postgresql://pgwork:hunter2-secret@127.0.0.1:1/pgwork"
SOME_ID = "01a2ffff-0000-7000-8000-000000000000"

COMMANDS = [
    ["jobs", "list"],
    ["jobs", "show", SOME_ID],
    ["jobs", "retry", SOME_ID],
    ["jobs", "cancel", SOME_ID],
    ["chains", "show", SOME_ID],
    ["queues"],
    ["queues", "pause", "mail"],
    ["queues", "resume", "mail"],
    ["workers"],
]


def _name(command: list[str]) -> str:
    return " ".join(c for c in command if c != SOME_ID)


def one_line_error(result: Result) -> str:
    assert result.exit_code == EXIT_ERROR, result.output
    assert "Traceback" not in result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS, ids=_name)
def test_an_unreachable_server_is_one_line_without_the_password(
    runner: CliRunner, command: list[str]
) -> None:
    result = runner.invoke(main, [*command, "--dsn", REFUSED])

    assert "cannot connect to PostgreSQL" in one_line_error(result)
    assert "hunter2-secret" not in result.output


@pytest.mark.parametrize("command", COMMANDS, ids=_name)
def test_a_database_never_migrated_is_one_line_naming_pgwork_migrate(
    runner: CliRunner, empty_database_dsn: str, command: list[str]
) -> None:
    result = runner.invoke(main, [*command, "--dsn", empty_database_dsn])

    line = one_line_error(result)
    assert "the pgwork schema 'pgwork' does not exist" in line
    assert "pgwork migrate" in line


@pytest.mark.parametrize("command", [["jobs", "list"], ["queues", "pause", "mail"]], ids=_name)
def test_an_invalid_schema_name_is_one_line(runner: CliRunner, command: list[str]) -> None:
    result = runner.invoke(main, [*command, "--dsn", REFUSED, "--schema", "Bad-Name"])

    assert "invalid pgwork schema name 'Bad-Name'" in one_line_error(result)


def test_the_schema_comes_from_pgwork_schema(runner: CliRunner, pgwork_dsn: str) -> None:
    result = runner.invoke(
        main, ["workers", "--dsn", pgwork_dsn], env={"PGWORK_SCHEMA": "elsewhere"}
    )

    assert "the pgwork schema 'elsewhere' does not exist" in one_line_error(result)


@pytest.mark.parametrize("command", COMMANDS, ids=_name)
def test_no_dsn_is_a_usage_error_naming_the_variables(
    runner: CliRunner, command: list[str]
) -> None:
    result = runner.invoke(main, command)

    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "PGWORK_DSN or DATABASE_URL" in result.stderr


def test_the_dsn_falls_back_to_database_url(runner: CliRunner, pgwork_dsn: str) -> None:
    result = runner.invoke(main, ["queues", "--json"], env={"DATABASE_URL": pgwork_dsn})

    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == '{"queues": [], "unhandled": []}'
