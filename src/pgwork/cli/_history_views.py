"""What ``pgwork history`` prints: the job history as JSON and as a rich table.

Pure, like ``_views``: the caller passes the history read from the database (with the
database's clock). JSON keys are the records' field names and stay stable for scripts;
durations are seconds.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from pgwork.adapters.history import Durations, HistoryFigures, JobHistory, duration_text

__all__ = ["history_json", "history_view"]


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _durations_json(d: Durations) -> dict[str, Any]:
    return {
        "count": d.count,
        "total_s": d.total_s,
        "mean_s": d.mean_s,
        "max_s": d.max_s if d.count else None,
        "p50_s": d.quantile(0.5),
        "p95_s": d.quantile(0.95),
        "histogram": list(d.histogram),
    }


def _figures_json(f: HistoryFigures) -> dict[str, Any]:
    return {
        "completed": f.completed,
        "failed": f.failed,
        "wait": _durations_json(f.wait),
        "run": _durations_json(f.run),
    }


def history_json(history: JobHistory) -> dict[str, Any]:
    return {
        "now": _iso(history.now),
        "since": _iso(history.since),
        "step_s": history.step.total_seconds(),
        "rolled_up_to": _iso(history.rolled_up_to),
        "completed": sum(p.figures.completed for p in history.points),
        "failed": sum(p.figures.failed for p in history.points),
        "groups": [
            {"queue": g.queue, "type_name": g.type_name, **_figures_json(g.figures)}
            for g in history.groups
        ],
        "points": [{"start": _iso(p.start), **_figures_json(p.figures)} for p in history.points],
    }


def history_view(history: JobHistory, title: str) -> RenderableType:
    """One line of totals and how far the count reached, then a row per queue and type:
    completed, failed, median / 95th percentile / longest wait and run time."""
    completed = sum(p.figures.completed for p in history.points)
    failed = sum(p.figures.failed for p in history.points)
    reached = (
        f"counted up to {history.rolled_up_to:%Y-%m-%d %H:%M:%S} UTC"
        if history.rolled_up_to is not None
        else "nothing counted yet (each worker's maintenance counts ended jobs every 30 s)"
    )
    head = Text(f"{title}: {completed} completed, {failed} failed; {reached}")
    if not history.groups:
        return Group(head, Text("no job ended in this window", style="dim"))
    numbers = ("COMPLETED", "FAILED", "WAIT P50", "WAIT P95", "RUN P50", "RUN P95", "RUN MAX")
    table = Table(header_style="bold", box=None, pad_edge=False)
    for name in ("QUEUE", "TYPE", *numbers):
        table.add_column(name, justify="right" if name in numbers else "left", no_wrap=True)
    for g in history.groups:
        f = g.figures
        table.add_row(
            g.queue,
            g.type_name,
            str(f.completed),
            Text(str(f.failed), style="red" if f.failed else ""),
            duration_text(f.wait.quantile(0.5)),
            duration_text(f.wait.quantile(0.95)),
            duration_text(f.run.quantile(0.5)),
            duration_text(f.run.quantile(0.95)),
            duration_text(f.run.max_s if f.run.count else None),
        )
    return Group(head, Text(""), table)
