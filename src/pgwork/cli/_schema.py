"""``pgwork migrate`` and ``pgwork check``: create, upgrade and inspect pgwork's schema."""

from __future__ import annotations

import json

import click
from rich.markup import escape

from pgwork.cli._app import EXIT_NOT_AT_HEAD
from pgwork.cli._common import dsn_option, load_migrations, require_dsn, schema_option, stdout
from pgwork.postgres.connect import redact_dsn

__all__ = ["check", "migrate"]


@click.command(short_help="Create or upgrade pgwork's schema.")
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
    migrations = load_migrations()
    dsn = require_dsn(dsn)
    change = migrations.upgrade(dsn, schema=schema, revision=revision)
    where = escape(f"schema {schema!r} in {redact_dsn(dsn)}")
    if change.changed:
        stdout().print(f"[green]migrated {where}: {change.before or '(none)'} -> {change.after}[/]")
    else:
        stdout().print(f"[green]{where} is already at {change.after}[/]")


@click.command(short_help="Exit 0 if the schema is at head, 1 if not.")
@dsn_option
@schema_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as one JSON object.")
def check(dsn: str | None, schema: str, as_json: bool) -> None:
    """Exit 0 if the schema is at this pgwork's head revision, 1 if it is not."""
    migrations = load_migrations()
    status = migrations.check(require_dsn(dsn), schema=schema)
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
        stdout().print(f"[green]schema {status.schema!r} is at head ({status.head})[/]")
    elif status.current is not None and status.current not in migrations.known_revisions():
        stdout().print(
            f"[yellow]schema {status.schema!r} is at {status.current}, which this pgwork "
            f"(head {status.head}) does not know: it was migrated by a newer pgwork[/]"
        )
    else:
        stdout().print(
            f"[yellow]schema {status.schema!r} is at {status.current or '(none)'}, "
            f"head is {status.head}: run `pgwork migrate`[/]"
        )
    if not status.is_current:
        raise SystemExit(EXIT_NOT_AT_HEAD)
