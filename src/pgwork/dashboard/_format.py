"""Turning records into what the templates show: JSON text, ages, the activity chart.

Nothing here writes markup: templates are autoescaped and get plain values, so a
payload or an error message holding ``<script>`` is shown as text wherever it appears.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic_core import to_jsonable_python

from pgwork.adapters.insight import ActivityBucket

__all__ = ["Bar", "Chart", "JsonText", "age", "chart", "json_text", "per_queue", "short_id"]

# Past this many characters a payload is cut, with a link to the whole of it.
TRUNCATE_AT = 4000


@dataclass(frozen=True, slots=True)
class JsonText:
    text: str
    truncated: bool
    size: int


def json_text(value: Any, *, full: bool = False) -> JsonText:
    """``value`` (decoded JSON or a job type's model) as indented JSON text."""
    try:
        text = json.dumps(
            to_jsonable_python(value, fallback=repr), indent=2, ensure_ascii=False, sort_keys=True
        )
    except (TypeError, ValueError):
        text = repr(value)
    if full or len(text) <= TRUNCATE_AT:
        return JsonText(text, False, len(text))
    return JsonText(text[:TRUNCATE_AT], True, len(text))


def short_id(value: object) -> str:
    """The last group of a UUID (12 hex digits, its random tail), after an ellipsis.

    Ids are UUIDv7: their first 12 hex digits are the creation millisecond, so rows
    made together share them and a leading slice tells none apart. The tail is random
    (48 bits), so a page's rows show distinct short ids; ``title`` shows the whole one.
    """
    text = str(value)
    return "…" + text.rsplit("-", 1)[-1] if len(text) == 36 else text


def age(moment: datetime | None, now: datetime) -> str:
    """``moment`` relative to ``now``, short: ``3s ago``, ``in 2m``, ``5h ago``."""
    if moment is None:
        return ""
    delta = now - moment
    future = delta < timedelta(0)
    seconds = int(abs(delta).total_seconds())
    if seconds < 60:
        text = f"{seconds}s"
    elif seconds < 3600:
        text = f"{seconds // 60}m"
    elif seconds < 86400:
        text = f"{seconds // 3600}h"
    else:
        text = f"{seconds // 86400}d"
    return f"in {text}" if future else f"{text} ago"


def duration(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return ""
    return took(end - start)


def took(span: timedelta | None) -> str:
    """A length of time, short: ``40 ms``, ``3.2 s``, ``7.5 min``; empty if unknown."""
    if span is None:
        return ""
    seconds = span.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def per_queue(buckets: Iterable[ActivityBucket]) -> dict[str, tuple[int, int]]:
    """(completed, failed) per queue over all buckets."""
    totals: dict[str, tuple[int, int]] = {}
    for b in buckets:
        done, failed = totals.get(b.queue, (0, 0))
        totals[b.queue] = (done + b.completed, failed + b.failed)
    return totals


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    width: float
    done_y: float
    done_height: float
    failed_y: float
    failed_height: float
    label: str
    # False: the slot ended before the oldest job the count reached, so its bar is
    # unknown, not empty (drawn grey, not as zero).
    counted: bool = True


@dataclass(frozen=True, slots=True)
class Chart:
    width: int
    height: int
    bars: tuple[Bar, ...]
    peak: int
    completed: int
    failed: int


def chart(
    buckets: Sequence[ActivityBucket],
    *,
    now: datetime,
    window: timedelta,
    bucket: timedelta,
    counted_from: datetime | None = None,
    width: int = 720,
    height: int = 140,
) -> Chart:
    """Stacked bars (completed below, failed on top), one per ``bucket`` of ``window``
    ending at ``now``, drawn in SVG user units. Slots that end at or before
    ``counted_from`` (where a capped count stopped) are marked not counted."""
    step = bucket.total_seconds()
    slots = max(1, int(window / bucket))
    first = (int(now.timestamp() // step) - slots + 1) * step
    done = [0] * slots
    failed = [0] * slots
    for b in buckets:
        index = int((b.start.timestamp() - first) // step)
        if 0 <= index < slots:
            done[index] += b.completed
            failed[index] += b.failed
    peak = max((d + f for d, f in zip(done, failed, strict=True)), default=0)
    scale = (height - 4) / peak if peak else 0.0
    slot_width = width / slots
    bars = []
    for i, (d, f) in enumerate(zip(done, failed, strict=True)):
        dh, fh = d * scale, f * scale
        start = datetime.fromtimestamp(first + i * step, tz=now.tzinfo)
        counted = counted_from is None or start + bucket > counted_from
        label = f"{start:%H:%M} UTC: {d} completed, {f} failed"
        if not counted:
            label = f"{start:%H:%M} UTC: not counted (before the newest jobs counted)"
        elif counted_from is not None and start <= counted_from:
            label += f" (counted from {counted_from:%H:%M:%S} UTC)"
        bars.append(
            Bar(
                x=round(i * slot_width + 1, 2),
                width=round(max(slot_width - 2, 1), 2),
                done_y=round(height - dh, 2),
                done_height=round(dh, 2),
                failed_y=round(height - dh - fh, 2),
                failed_height=round(fh, 2),
                label=label,
                counted=counted,
            )
        )
    return Chart(width, height, tuple(bars), peak, sum(done), sum(failed))
