"""The most attempts certainly started in one window of a rate, counted outside pgwork.

A rate counts an attempt as started at its acquire, a moment no handler sees. Each
attempt is known to have started between two moments on the database's clock: its
acquire's transaction start (its lease's end less the lease's length) and its
handler's first statement. Attempts whose bounds all lie in one window started in it,
whatever their true moments; so the counts here never exceed the truth (a correct
build never shows more than its rate), and they reach it when the bounds are tight.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

__all__ = ["Start", "most_started", "windows"]

# (no earlier than, no later than)
Start = tuple[datetime, datetime]


def windows(starts: Sequence[Start], window: timedelta) -> list[tuple[datetime, int]]:
    """For each distinct earliest bound, the attempts certainly started in the
    half-open window (as the acquire counts it) that begins there."""
    found = []
    for early in sorted({lo for lo, _ in starts}):
        inside = sum(1 for lo, hi in starts if lo >= early and hi - early < window)
        found.append((early, inside))
    return found


def most_started(starts: Sequence[Start], window: timedelta) -> int:
    return max((n for _, n in windows(starts, window)), default=0)
