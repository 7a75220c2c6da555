"""The ``pgwork`` command: the only module that reads argv and the environment.

Every subcommand is a function registered on the ``main`` group below. A ``PgworkError``
raised by any of them is printed as one red line on stderr (no traceback) and exits with
status 2, so scripts can tell "the command failed" from ``pgwork check``'s status 1,
"the schema is not at head".
"""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from pgwork.errors import PgworkError
from pgwork.postgres import migrate as migrations
from pgwork.postgres._connect import redact_dsn
from pgwork.postgres.schema import DEFAULT_SCHEMA

__all__ = ["EXIT_ERROR", "EXIT_NOT_AT_HEAD", "main"]

EXIT_NOT_AT_HEAD = 1
EXIT_ERROR = 2


def _stdout() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _stderr() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


class _Group(click.Group):
    """A click group that turns pgwork's errors into one readable line."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PgworkError as exc:
            message = " ".join(str(exc).split())
            _stderr().print(f"[bold red]error:[/] [red]{escape(message)}[/]")
            ctx.exit(EXIT_ERROR)


def _require_dsn(dsn: str | None) -> str:
    if not dsn:
        raise click.UsageError("no database given: pass --dsn, or set PGWORK_DSN or DATABASE_URL")
    return dsn


dsn_option = click.option(
    "--dsn",
    envvar=["PGWORK_DSN", "DATABASE_URL"],
    show_envvar=True,
    help="PostgreSQL DSN, e.g. postgresql://user:password@host:5432/dbname.",
)
schema_option = click.option(
    "--schema",
    envvar="PGWORK_SCHEMA",
    show_envvar=True,
    default=DEFAULT_SCHEMA,
    show_default=True,
    help="Schema holding pgwork's tables.",
)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pgwork")
def main() -> None:
    """pgwork: durable background jobs stored in PostgreSQL."""


# --- schema -------------------------------------------------------------------------


@main.command(short_help="Create or upgrade pgwork's schema.")
@dsn_option
@schema_option
@click.option(
    "--revision",
    default="head",
    show_default=True,
    help="Revision to upgrade to ('head' or a revision id). pgwork never downgrades here.",
)
def migrate(dsn: str | None, schema: str, revision: str) -> None:
    """Create or upgrade pgwork's schema; safe to run from many processes at once."""
    dsn = _require_dsn(dsn)
    change = migrations.upgrade(dsn, schema=schema, revision=revision)
    where = escape(f"schema {schema!r} in {redact_dsn(dsn)}")
    if change.changed:
        _stdout().print(
            f"[green]migrated {where}: {change.before or '(none)'} -> {change.after}[/]"
        )
    else:
        _stdout().print(f"[green]{where} is already at {change.after}[/]")


@main.command(short_help="Exit 0 if the schema is at head, 1 if not.")
@dsn_option
@schema_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as one JSON object.")
def check(dsn: str | None, schema: str, as_json: bool) -> None:
    """Exit 0 if the schema is at this pgwork's head revision, 1 if it is not."""
    status = migrations.check(_require_dsn(dsn), schema=schema)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "schema": status.schema,
                    "current": status.current,
                    "head": status.head,
                    "is_current": status.is_current,
                }
            )
        )
    elif status.is_current:
        _stdout().print(f"[green]schema {status.schema!r} is at head ({status.head})[/]")
    elif status.current is not None and status.current not in migrations.known_revisions():
        _stdout().print(
            f"[yellow]schema {status.schema!r} is at {status.current}, which this pgwork "
            f"(head {status.head}) does not know: it was migrated by a newer pgwork[/]"
        )
    else:
        _stdout().print(
            f"[yellow]schema {status.schema!r} is at {status.current or '(none)'}, "
            f"head is {status.head}: run `pgwork migrate`[/]"
        )
    if not status.is_current:
        raise SystemExit(EXIT_NOT_AT_HEAD)


# --- further commands (worker, demo, ...) register on `main` below ----------------------


if __name__ == "__main__":
    main()
