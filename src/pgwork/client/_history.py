"""Client API of the job history: throughput, wait and run time over days.

Mixed into ``Client``. The history is counted by the workers' maintenance (or by
``roll_up_history`` here) into buckets that retention does not delete; reading it costs
the number of buckets in the window, never the number of jobs.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import TYPE_CHECKING

from pgwork.adapters.history import (
    DAILY_RESOLUTION,
    FINE_KEEP,
    FINE_RESOLUTION,
    HISTORY_KEEP,
    HISTORY_MAX_LAG,
    HOURLY_KEEP,
    HOURLY_RESOLUTION,
    HistoryRollup,
    JobHistory,
)
from pgwork.errors import ConfigurationError

if TYPE_CHECKING:
    from pgwork.adapters.capabilities import Capabilities
    from pgwork.adapters.state import TransactionHandle

__all__ = ["MAX_HISTORY_POINTS", "HistoryMixin", "history_step"]

# A window is cut into at most this many steps (a chart's bars).
MAX_HISTORY_POINTS = 150


def history_step(window: timedelta) -> tuple[timedelta, timedelta, timedelta]:
    """How a window is read: the bucket width of its steps (the finest kept as long as
    the window, ``pgwork.adapters.history``), its step (the smallest multiple of that
    width giving at most ``MAX_HISTORY_POINTS`` steps), and the bucket width its
    totals per queue and type are summed from (the next coarser one: a few dozen
    buckets per queue and type)."""
    if window <= FINE_KEEP:
        resolution, groups = FINE_RESOLUTION, HOURLY_RESOLUTION
    elif window <= HOURLY_KEEP:
        resolution, groups = HOURLY_RESOLUTION, DAILY_RESOLUTION
    else:
        resolution, groups = DAILY_RESOLUTION, DAILY_RESOLUTION
    multiple = max(1, math.ceil(window / resolution / MAX_HISTORY_POINTS))
    return resolution, resolution * multiple, groups


class HistoryMixin:
    """``job_history`` and ``roll_up_history`` of ``Client``."""

    if TYPE_CHECKING:
        capabilities: Capabilities

        async def _read_handle(self, tx: object | None) -> TransactionHandle | None: ...

    async def job_history(
        self,
        *,
        window: timedelta = timedelta(days=1),
        queue: str | None = None,
        type_name: str | None = None,
        tx: object | None = None,
    ) -> JobHistory:
        """Jobs that completed or failed within ``window`` of now: how many, and how long
        they waited and ran (``pgwork.adapters.history``), per step of time and per
        queue and job type; ``queue`` / ``type_name`` keep only theirs.

        Read from the history the workers' maintenance counts, so it reaches back
        past retention (up to ``HISTORY_KEEP``) and lags the present by a rollup
        interval: ``rolled_up_to`` on the result says how far it reaches. Windows up
        to two days are read in five-minute buckets, up to eight days in hourly ones,
        longer ones in daily ones; the totals per queue and type in the next coarser
        buckets, so the window starts at the start of the hour (or day) it begins in.
        """
        if not timedelta(0) < window <= HISTORY_KEEP:
            raise ConfigurationError(
                f"window must be positive and at most {HISTORY_KEEP.days} days, got {window}"
            )
        resolution, step, groups = history_step(window)
        return await self.capabilities.require_views("Client.job_history").job_history(
            await self._read_handle(tx),
            window=window,
            resolution=resolution,
            step=step,
            group_resolution=groups,
            queue=queue,
            type_name=type_name,
        )

    async def roll_up_history(
        self, *, limit: int = 10_000, keep: timedelta = HISTORY_KEEP
    ) -> HistoryRollup:
        """Count up to about ``limit`` more ended jobs into the history and prune
        buckets past their keep period (daily ones: ``keep``): one step of what each
        worker's maintenance runs (call it again while ``caught_up`` is false). Safe
        beside running workers: each ended job is counted once."""
        if not 1 <= limit <= 1_000_000:
            raise ConfigurationError(f"limit must be in 1..1000000, got {limit}")
        if not FINE_KEEP <= keep <= timedelta(days=3650):
            raise ConfigurationError(
                f"keep must be between {FINE_KEEP.days} days and ten years, got {keep}"
            )
        return await self.capabilities.require_maintenance(
            "Client.roll_up_history"
        ).roll_up_history(limit=limit, keep=keep, max_lag=HISTORY_MAX_LAG)
