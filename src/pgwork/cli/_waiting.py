"""``pgwork chains waiting`` and ``pgwork signals list``: what waits, and the signals
nothing has taken yet.

``waiting`` is attached to the ``chains`` group and ``signals`` to ``main`` by
``pgwork.cli``; of its siblings this module imports only ``_common``, ``_operate`` and
``_waiting_views``. No job-type registry is needed: payloads are the stored JSON.
"""

from __future__ import annotations

import click

from pgwork.cli import _waiting_views as views
from pgwork.cli._common import dsn_option, schema_option
from pgwork.cli._operate import json_option, operate, show
from pgwork.client import Client
from pgwork.records import Page, SignalRecord, Waiting, WaitKind

__all__ = ["signals", "waiting"]

_limit = click.option(
    "--limit", type=int, default=50, show_default=True, help="Rows per page (1-1000)."
)
_cursor = click.option("--cursor", help="Where the previous page ended (its printed cursor).")


@click.command("waiting", short_help="Chains whose step waits: signal, time, debounce, blockers.")
@dsn_option
@schema_option
@click.option(
    "--kind",
    type=click.Choice([k.value for k in WaitKind]),
    help="Only this kind of wait.",
)
@click.option("--type", "chain_type", help="Only chains of this type.")
@click.option("--signal", help="Only steps waiting for this signal name.")
@click.option("--signal-prefix", help="Only steps waiting for a signal name starting so.")
@_limit
@_cursor
@json_option
def waiting(
    dsn: str | None,
    schema: str,
    kind: str | None,
    chain_type: str | None,
    signal: str | None,
    signal_prefix: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """Chains whose current step waits for a signal (with its timeout), a time, a
    debounce or blocker chains, newest first: what each waits for, for how long it
    has, and when it starts by itself."""

    async def read(client: Client) -> Page[Waiting]:
        return await client.list_waiting(
            kind=kind,
            chain_type=chain_type,
            signal=signal,
            signal_prefix=signal_prefix,
            limit=limit,
            cursor=cursor,
        )

    page = operate(dsn, schema, read)
    show(as_json, views.waiting_page_json(page), lambda w: views.waiting_page_view(page, width=w))


@click.group(short_help="Signals sent and not taken yet.")
def signals() -> None:
    """Signals (docs/chains.md, "Waiting for a signal")."""


@signals.command("list", short_help="Pending signals, newest first, with their age.")
@dsn_option
@schema_option
@click.option(
    "--all", "every", is_flag=True, help="Every signal kept, the ones steps took included."
)
@click.option("--name", help="Only signals of this name.")
@click.option("--prefix", help="Only signals whose name starts so (payment: for every payment).")
@_limit
@_cursor
@json_option
def list_signals(
    dsn: str | None,
    schema: str,
    every: bool,
    name: str | None,
    prefix: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """Signals sent that no step has taken yet, newest first, with their age: each is
    kept for the next step that waits for its name, until the workers' retention
    deletes it (``signal_retention``). --all lists the taken ones too."""

    async def read(client: Client) -> Page[SignalRecord]:
        return await client.list_signals(
            pending=not every, name=name, name_prefix=prefix, limit=limit, cursor=cursor
        )

    page = operate(dsn, schema, read)
    show(as_json, views.signals_json(page), lambda w: views.signals_view(page, width=w))
