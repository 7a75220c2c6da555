"""Records of the job history: throughput, wait time and run time over days.

The history counts every job that completed or failed, per bucket of its end time,
queue and job type, in a store of its own that retention does not touch
(``ControlStore.roll_up_history`` fills it, ``ReadStore.job_history`` reads it). Each
bucket keeps counts, sums, maxima and a histogram of durations over the fixed bins
``DURATION_BINS_S``, so buckets add up exactly into longer ones and a quantile is
known to within its bin.

What the durations are, from the columns of an ended job: ``wait`` is ``started_at -
scheduled_at`` of a job that ended on its first attempt (a retry moves ``scheduled_at``
to the retry's due time, so a retried job's first wait is not known); ``run`` is
``completed_at - max(started_at, scheduled_at)``: a first attempt's run time, and for a
retried job its last attempt's wait and run (a job that never started, failed because
a chain it waited for failed, has neither).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

__all__ = [
    "DAILY_RESOLUTION",
    "DURATION_BINS_S",
    "FINE_KEEP",
    "FINE_RESOLUTION",
    "HISTORY_KEEP",
    "HISTORY_MAX_LAG",
    "HOURLY_KEEP",
    "HOURLY_RESOLUTION",
    "Durations",
    "HistoryFigures",
    "HistoryGroup",
    "HistoryPoint",
    "HistoryRollup",
    "JobHistory",
    "duration_text",
]

# Lower bounds (seconds) of the histogram's bins after the first: bin 0 holds
# durations below 10 ms, bin k those in [DURATION_BINS_S[k-1], DURATION_BINS_S[k]), the
# last one an hour and more. Stored in every bucket: changing them needs a migration.
DURATION_BINS_S: tuple[float, ...] = (
    0.01,
    0.05,
    0.1,
    0.5,
    1.0,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    1800.0,
    3600.0,
)

# The widths the history is counted at, each kept for its own period: five-minute
# buckets for the last two days, hourly ones for eight days, daily ones for the keep
# period (90 days unless a rollup is given another). A rollup writes all three; a
# window is read at the finest width kept that long, so no read sums more than a few
# hundred buckets per queue and type.
FINE_RESOLUTION = timedelta(minutes=5)
HOURLY_RESOLUTION = timedelta(hours=1)
DAILY_RESOLUTION = timedelta(days=1)
FINE_KEEP = timedelta(days=2)
HOURLY_KEEP = timedelta(days=8)
HISTORY_KEEP = timedelta(days=90)
# How long an open transaction may hold the history's count back (the ``max_lag`` of
# ``ControlStore.roll_up_history``), for the workers' rollup and the client's alike.
HISTORY_MAX_LAG = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class Durations:
    """Durations of ``count`` jobs: their total and longest, in seconds, and how many
    fell in each bin of ``DURATION_BINS_S`` (``histogram``, one more entry than bins)."""

    count: int
    total_s: float
    max_s: float
    histogram: tuple[int, ...]

    @property
    def mean_s(self) -> float | None:
        return self.total_s / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        """An upper bound of the ``q`` quantile (0 < q <= 1): the upper edge of the bin
        it falls in, or the maximum when that is smaller (or the bin has no edge)."""
        if not self.count:
            return None
        wanted = q * self.count
        seen = 0
        for index, n in enumerate(self.histogram):
            seen += n
            if seen >= wanted and n:
                if index < len(DURATION_BINS_S):
                    return min(DURATION_BINS_S[index], self.max_s)
                return self.max_s
        return self.max_s


@dataclass(frozen=True, slots=True)
class HistoryFigures:
    """Jobs that ended in some stretch of time: how many completed and failed, how
    long they waited and ran (module docstring)."""

    completed: int
    failed: int
    wait: Durations
    run: Durations

    @property
    def ended(self) -> int:
        return self.completed + self.failed


@dataclass(frozen=True, slots=True)
class HistoryPoint:
    """The jobs that ended in ``[start, start + step)``, all queues and types asked for."""

    start: datetime
    figures: HistoryFigures


@dataclass(frozen=True, slots=True)
class HistoryGroup:
    """The jobs of one queue and job type that ended in the whole window."""

    queue: str
    type_name: str
    figures: HistoryFigures


@dataclass(frozen=True, slots=True)
class JobHistory:
    """The history of a window ending now: ``points`` (one per ``step`` that holds any
    job, oldest first, from ``since``) and ``groups`` (per queue and type, most ended
    first). Read from buckets of width ``resolution``; ``rolled_up_to`` is how far the
    count has reached (jobs that ended later are not in it yet), ``None`` before the
    first rollup."""

    now: datetime
    since: datetime
    step: timedelta
    resolution: timedelta
    points: tuple[HistoryPoint, ...]
    groups: tuple[HistoryGroup, ...]
    rolled_up_to: datetime | None


@dataclass(frozen=True, slots=True)
class HistoryRollup:
    """What one rollup step did: ``skipped`` when another held the history (nothing
    done); else how many ended ``jobs`` it counted, up to where (``rolled_up_to``),
    whether that reached the newest jobs it may count (``caught_up``: false when the
    batch limit stopped it first) and how many old buckets it ``pruned``."""

    skipped: bool
    jobs: int = 0
    rolled_up_to: datetime | None = None
    caught_up: bool = True
    pruned: int = 0


def duration_text(value: float | None, *, missing: str = "-") -> str:
    """A duration in seconds, short, as the history's views print it: ``4 ms``,
    ``2.5 s``, ``3.2 min``, ``1.5 h``; ``missing`` for none (no job ended)."""
    if value is None:
        return missing
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"
