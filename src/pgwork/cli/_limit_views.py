"""What ``pgwork limits`` prints: each limited job type's limits and use, as JSON and as
a table. Pure, as ``_views``: the caller passes the records read from the database.

The JSON keys are the records' field names and never change meaning (new ones may
appear); a rate is ``{"n": N, "per_seconds": S}``, a time ISO 8601 with its offset.
``started`` counts the attempts started in the current window of the effective rate (a
key's: of its key rate), null without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from pgwork._flow_control import Rate, rate_text
from pgwork.adapters.limits import KeyLimitStatus, Limits, LimitStatus

__all__ = ["limits_json", "limits_view"]


def _rate_json(rate: Rate | None) -> dict[str, Any] | None:
    return None if rate is None else {"n": rate.n, "per_seconds": rate.per.total_seconds()}


def _limits_json(limits: Limits | None) -> dict[str, Any] | None:
    if limits is None:
        return None
    return {
        "concurrency": limits.concurrency,
        "key_concurrency": limits.key_concurrency,
        "rate": _rate_json(limits.rate),
        "key_rate": _rate_json(limits.key_rate),
    }


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _key_json(key: KeyLimitStatus) -> dict[str, Any]:
    return {
        "limit_key": key.limit_key,
        "running": key.running,
        "pending": key.pending,
        "key_concurrency": key.key_concurrency,
        "key_rate": _rate_json(key.key_rate),
        "started": key.started,
        "override": _limits_json(key.override),
        "paused_until": _iso(key.paused_until),
    }


def limits_json(found: Sequence[LimitStatus]) -> dict[str, Any]:
    return {
        "limits": [
            {
                "job_type": status.type_name,
                "declared": _limits_json(status.declared),
                "override": _limits_json(status.override),
                "effective": _limits_json(status.effective),
                "running": status.running,
                "pending": status.pending,
                "started": status.started,
                "paused_until": _iso(status.paused_until),
                "keys": [_key_json(key) for key in status.keys],
            }
            for status in found
        ]
    }


def _limit(value: int | None, overridden: bool) -> str:
    text = "-" if value is None else str(value)
    return f"{text}*" if overridden else text


def _rate(rate: Rate | None, overridden: bool) -> str:
    text = "-" if rate is None else rate_text(rate)
    return f"{text}*" if overridden else text


def _started(started: int | None) -> str:
    return "-" if started is None else str(started)


def _paused(until: datetime | None) -> Text:
    if until is None:
        return Text("no", style="dim")
    return Text(f"until {until:%Y-%m-%d %H:%M:%S %Z}", style="yellow")


def limits_view(found: Sequence[LimitStatus], *, width: int) -> RenderableType:
    if not found:
        return Text(
            "no limited job type is known: none is declared by a registered worker, and "
            "no limit or pause is stored",
            style="dim",
        )
    table = Table(box=None, show_edge=False, pad_edge=False, header_style="bold", width=None)
    columns = ("TYPE", "RUNNING", "LIMIT", "KEY LIMIT", "STARTED", "RATE", "KEY RATE", "PENDING")
    for name in columns:
        right = name in ("RUNNING", "STARTED", "PENDING")
        table.add_column(name, justify="right" if right else "left")
    table.add_column("PAUSED")
    for status in found:
        over, eff = status.override, status.effective
        table.add_row(
            Text(status.type_name),
            Text(str(status.running)),
            Text(_limit(eff.concurrency, over.concurrency is not None)),
            Text(_limit(eff.key_concurrency, over.key_concurrency is not None)),
            Text(_started(status.started)),
            Text(_rate(eff.rate, over.rate is not None)),
            Text(_rate(eff.key_rate, over.key_rate is not None)),
            Text(str(status.pending)),
            _paused(status.paused_until),
        )
        for key in status.keys:
            name = "(no key)" if key.limit_key is None else key.limit_key
            table.add_row(
                Text(f"  key {name}", style="cyan"),
                Text(str(key.running)),
                Text(""),
                Text(_limit(key.key_concurrency, key.override.key_concurrency is not None)),
                Text(_started(key.started)),
                Text(""),
                Text(_rate(key.key_rate, key.override.key_rate is not None)),
                Text(str(key.pending)),
                _paused(key.paused_until),
            )
    note = Text(
        "* an operator's override of the declared limit (`pgwork limits set ... --reset` "
        "returns to the declaration); STARTED counts the attempts started in the current "
        "window of the RATE (on a key's row, of its KEY RATE); PENDING counts jobs due now",
        style="dim",
    )
    return Group(table, note)
