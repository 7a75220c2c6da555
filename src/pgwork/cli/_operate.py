"""What the operator commands share: a client for one command, a transaction of its
own, ``--json`` or a table, and the connection options given before a subcommand.

Kept apart so that each command module (``_operator``, ``_limits``) imports this and
not one another.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import click
from rich.console import Console, RenderableType

from pgwork.cli import _views as views
from pgwork.cli._common import require_dsn, stdout
from pgwork.client import Client, create_client
from pgwork.job_types import JobTypeRegistry
from pgwork.postgres.connect import connect
from pgwork.postgres.notify import PostgresNotifyAdapter
from pgwork.postgres.state import PostgresStateAdapter

__all__ = ["committed", "group_connection", "json_option", "operate", "show"]

T = TypeVar("T")

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document (stable keys) for scripts."
)


def operate(dsn: str | None, schema: str, operation: Callable[[Client], Awaitable[T]]) -> T:
    """Run ``operation`` on a client of ``schema`` at ``dsn``, closing it afterwards."""
    given = require_dsn(dsn)

    async def run() -> T:
        state = await PostgresStateAdapter.connect(given, schema=schema, max_size=2)
        client = create_client(
            state_adapter=state,
            notify_adapter=PostgresNotifyAdapter(given, schema=schema),
            registry=JobTypeRegistry(),
            observers=[],
        )
        try:
            return await operation(client)
        finally:
            with anyio.CancelScope(shield=True):
                await client.close()

    return anyio.run(run)


async def committed(dsn: str, work: Callable[[object], Awaitable[T]]) -> T:
    """Run ``work`` in a transaction of its own and commit it; on any error the
    connection is closed uncommitted, so nothing of it (notices included) happens."""
    conn = await connect(dsn)
    try:
        result = await work(conn)
        await conn.commit()
        return result
    finally:
        with anyio.CancelScope(shield=True):
            await conn.close()


PIPE_WIDTH = 1000


def show(as_json: bool, data: Any, view: Callable[[int], RenderableType]) -> None:
    """Print ``data`` as JSON, or ``view(width)`` (a table fitted to the terminal)."""
    if as_json:
        click.echo(views.dumps(data))
    else:
        out = stdout()
        if not out.is_terminal and not os.environ.get("COLUMNS"):
            # A pipe has no width: rich would assume 80 columns and cut rows that a
            # script reads whole (ids, type names). COLUMNS still sets one.
            out = Console(highlight=False, soft_wrap=True, width=PIPE_WIDTH)
        out.print(view(out.width))


def group_connection(ctx: click.Context, dsn: str | None, schema: str) -> tuple[str | None, str]:
    """--dsn / --schema given before the subcommand (`pgwork queues --dsn X pause q`)."""
    given = ctx.parent.params if ctx.parent is not None else {}
    if ctx.get_parameter_source("schema") is click.core.ParameterSource.DEFAULT:
        schema = given.get("schema") or schema
    return dsn or given.get("dsn"), schema
