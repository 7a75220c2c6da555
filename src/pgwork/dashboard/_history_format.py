"""Turning the job history into what the history page shows: bars of throughput, wait
and run time per step of the window, and readable durations.

Drawn like the overview's chart: SVG rectangles positioned here, rendered by the
template, no script. Durations span milliseconds to hours, so their bars use a
logarithmic scale from 1 ms to the longest shown.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from pgwork.adapters.history import Durations, HistoryFigures, JobHistory, duration_text

__all__ = ["WINDOWS", "DurationChart", "ThroughputChart", "durations", "seconds", "throughput"]

# The windows the page offers, by their query value.
WINDOWS: dict[str, tuple[timedelta, str]] = {
    "1d": (timedelta(days=1), "Last day"),
    "7d": (timedelta(days=7), "Last week"),
    "30d": (timedelta(days=30), "30 days"),
    "90d": (timedelta(days=90), "90 days"),
}

WIDTH = 720
HEIGHT = 140
FLOOR_S = 0.001  # the bottom of a duration chart's scale


def seconds(value: float | None) -> str:
    """A duration, short (``duration_text``); a dash for none."""
    return duration_text(value, missing="–")


def _slots(history: JobHistory) -> list[tuple[datetime, HistoryFigures | None]]:
    """Every step from the window's start (the start of the hour or day it begins in,
    so a little longer than the window asked for) to now, oldest first, with its
    figures (None: no job ended)."""
    count = max(1, math.floor((history.now - history.since) / history.step) + 1)
    found = {p.start: p.figures for p in history.points}
    starts = (history.since + history.step * i for i in range(count))
    return [(start, found.get(start)) for start in starts]


def _label(start: datetime, step: timedelta) -> str:
    return f"{start:%a %d %b %H:%M} UTC" if step < timedelta(days=1) else f"{start:%d %b} UTC"


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    width: float
    # Stacked from the axis up: the lower part and the upper one.
    low_y: float
    low_height: float
    high_y: float
    high_height: float
    label: str


@dataclass(frozen=True, slots=True)
class ThroughputChart:
    width: int
    height: int
    bars: tuple[Bar, ...]
    peak: int
    completed: int
    failed: int


@dataclass(frozen=True, slots=True)
class DurationChart:
    width: int
    height: int
    bars: tuple[Bar, ...]
    peak_s: float
    jobs: int


def _geometry(index: int, slots: int) -> tuple[float, float]:
    slot_width = WIDTH / slots
    return round(index * slot_width + 0.5, 2), round(max(slot_width - 1, 0.5), 2)


def throughput(history: JobHistory) -> ThroughputChart:
    """Completed (below) and failed (on top) jobs per step."""
    slots = _slots(history)
    totals = [(f.completed, f.failed) if f else (0, 0) for _, f in slots]
    peak = max((d + f for d, f in totals), default=0)
    scale = (HEIGHT - 4) / peak if peak else 0.0
    bars = []
    for i, ((start, _), (done, failed)) in enumerate(zip(slots, totals, strict=True)):
        x, width = _geometry(i, len(slots))
        dh, fh = done * scale, failed * scale
        label = f"{_label(start, history.step)}: {done} completed, {failed} failed"
        bars.append(
            Bar(
                x,
                width,
                round(HEIGHT - dh, 2),
                round(dh, 2),
                round(HEIGHT - dh - fh, 2),
                round(fh, 2),
                label,
            )
        )
    return ThroughputChart(
        WIDTH,
        HEIGHT,
        tuple(bars),
        peak,
        sum(d for d, _ in totals),
        sum(f for _, f in totals),
    )


def _height(value: float | None, top: float) -> float:
    if not value or value <= FLOOR_S:
        return 0.0
    span = math.log10(top / FLOOR_S) or 1.0
    return (HEIGHT - 4) * min(1.0, math.log10(value / FLOOR_S) / span)


def durations(history: JobHistory, pick: Callable[[HistoryFigures], Durations]) -> DurationChart:
    """Per step, the median (darker, below) and the 95th percentile (lighter, above)
    of the durations ``pick`` chooses, each to within its histogram bin."""
    slots = _slots(history)
    picked = [pick(f) if f else None for _, f in slots]
    p95s = [d.quantile(0.95) if d else None for d in picked]
    top = max((p for p in p95s if p), default=FLOOR_S * 10)
    bars = []
    for i, ((start, _), d, p95) in enumerate(zip(slots, picked, p95s, strict=True)):
        x, width = _geometry(i, len(slots))
        p50 = d.quantile(0.5) if d else None
        low = _height(p50, top)
        high = max(_height(p95, top) - low, 0.0)
        when = _label(start, history.step)
        label = (
            f"{when}: median {seconds(p50)}, 95% {seconds(p95)}, longest "
            f"{seconds(d.max_s)} ({d.count} jobs)"
            if d and d.count
            else f"{when}: no job"
        )
        bars.append(
            Bar(
                x,
                width,
                round(HEIGHT - low, 2),
                round(low, 2),
                round(HEIGHT - low - high, 2),
                round(high, 2),
                label,
            )
        )
    jobs = sum(d.count for d in picked if d)
    return DurationChart(WIDTH, HEIGHT, tuple(bars), top, jobs)
