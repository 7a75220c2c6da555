"""What ``pgwork chains waiting`` and ``pgwork signals list`` print: JSON and tables.

Pure, as ``_views``: the caller passes the records, whose ``as_of`` is the database's
clock, so ages and times to come are measured on the clock that wrote them.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from pgwork.cli._views import _iso, _table, age, dumps, waiting_json
from pgwork.records import Page, SignalRecord, Waiting, WaitKind

__all__ = ["dumps", "signals_json", "signals_view", "waiting_page_json", "waiting_page_view"]


def waiting_page_json(page: Page[Waiting]) -> dict[str, Any]:
    return {"waiting": [waiting_json(w) for w in page.items], "next_cursor": page.next_cursor}


def _printable(text: str) -> str:
    """``text`` with its control characters escaped (``\\x1b``, ``\\n``): a signal's
    name holds the application's key, which a terminal must not take for commands."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _what(waiting: Waiting) -> str:
    """The WAITS FOR cell: the kind, and what it names."""
    if waiting.kind is WaitKind.SIGNAL:
        return f"signal {_printable(waiting.signal or '')}"
    if waiting.kind is WaitKind.BLOCKERS:
        return f"blockers ({waiting.done or 0}/{waiting.total or 0} ended)"
    if waiting.kind is WaitKind.DEBOUNCE and waiting.deadline is not None:
        return f"debounce (deadline in {age(waiting.deadline - waiting.as_of)})"
    return waiting.kind.value


def _starts(waiting: Waiting) -> str:
    """When it starts if nothing else happens: a timeout, a sleep's end; ``-``: never
    by itself (a signal without a timeout, blockers)."""
    if waiting.until is None:
        return "-"
    return f"in {age(waiting.until - waiting.as_of)}"


def _more(cursor: str | None) -> list[RenderableType]:
    return [] if cursor is None else [Text.assemble(("next page: ", "dim"), f"--cursor {cursor}")]


def waiting_page_view(page: Page[Waiting], *, width: int) -> RenderableType:
    if not page.items:
        return Text("no chain waits for a signal, a time, a debounce or blockers", style="dim")
    rows = [
        [
            Text(str(w.chain_id)),
            Text(w.chain_type_name),
            Text(f"{w.chain_index} {w.type_name}"),
            Text(_what(w), style="magenta"),
            Text(age(w.as_of - w.since)),
            Text(_starts(w)),
        ]
        for w in page.items
    ]
    columns = ("ID", "CHAIN TYPE", "STEP", "WAITS FOR", "WAITING", "STARTS")
    return Group(_table(columns, rows, width=width), *_more(page.next_cursor))


def signals_json(page: Page[SignalRecord]) -> dict[str, Any]:
    return {
        "signals": [
            {
                "id": str(s.id),
                "name": s.name,
                "payload": s.payload,
                "sent_at": _iso(s.sent_at),
                "age_seconds": s.age.total_seconds(),
                "pending": s.pending,
                "consumed_by": str(s.consumed_by) if s.consumed_by is not None else None,
                "consumed_at": _iso(s.consumed_at),
            }
            for s in page.items
        ],
        "next_cursor": page.next_cursor,
    }


def signals_view(page: Page[SignalRecord], *, width: int) -> RenderableType:
    if not page.items:
        return Text("no signals match", style="dim")
    rows = [
        [
            Text(str(s.id)),
            Text(_printable(s.name)),
            Text(age(s.age)),
            Text("pending", style="yellow")
            if s.pending
            else Text(f"taken by {s.consumed_by}", style="dim"),
        ]
        for s in page.items
    ]
    return Group(
        _table(("ID", "NAME", "AGE", "STATE"), rows, width=width), *_more(page.next_cursor)
    )
