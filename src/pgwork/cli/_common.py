"""Pieces of the ``pgwork`` command shared by ``cli.py`` and ``_cli_operator.py``.

Kept apart so the operator commands need not import ``pgwork.cli`` (which imports them).
The environment variable names are declared here on the options, but click reads them only
while ``pgwork.cli.main`` parses a command line, so ``cli`` stays the one entry point that
reads argv and the environment.
"""

from __future__ import annotations

import click
from rich.console import Console

from pgwork.postgres._names import DEFAULT_SCHEMA

__all__ = ["dsn_option", "require_dsn", "schema_option", "stderr", "stdout"]


def stdout() -> Console:
    return Console(highlight=False, soft_wrap=True)


def stderr() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def require_dsn(dsn: str | None) -> str:
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
