"""PostgreSQL side of the job history: the rollup step and the read of a window.

Mixed into ``PostgresStateAdapter``; uses its ``schema``, ``transaction``, ``_fetch``
and the unprepared ``_read`` of ``QueryOps``. The SQL, and why the rollup counts each
ended job once however many workers run it, is in ``sql.history``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pgwork.adapters.history import (
    DAILY_RESOLUTION,
    FINE_KEEP,
    FINE_RESOLUTION,
    HOURLY_KEEP,
    HOURLY_RESOLUTION,
    Durations,
    HistoryFigures,
    HistoryGroup,
    HistoryPoint,
    HistoryRollup,
    JobHistory,
)
from pgwork.adapters.state import TransactionHandle
from pgwork.postgres._base import AdapterBase
from pgwork.postgres._transactions import unwrap

__all__ = ["HISTORY_WIDTHS_S", "HistoryOps"]

# Every rollup counts each ended job into a bucket of each of these widths.
HISTORY_WIDTHS_S = [
    int(width.total_seconds()) for width in (FINE_RESOLUTION, HOURLY_RESOLUTION, DAILY_RESOLUTION)
]

# The horizon stays this far behind the database's clock: a transaction's start time
# is taken a moment before pg_stat_activity shows the transaction.
SETTLE_S = 1.0


class HistoryOps(AdapterBase):
    """``roll_up_history`` and ``job_history`` of the PostgreSQL state adapter."""

    async def roll_up_history(
        self, *, limit: int, keep: timedelta, max_lag: timedelta
    ) -> HistoryRollup:
        keeps = [FINE_KEEP.total_seconds(), HOURLY_KEEP.total_seconds(), keep.total_seconds()]
        async with self.transaction() as tx:
            conn = await unwrap(tx)
            locked = await self._fetch(
                conn,
                self.statements.history.lock_progress,
                {
                    "keep_s": keep.total_seconds(),
                    "settle_s": SETTLE_S,
                    "max_lag_s": max_lag.total_seconds(),
                },
            )
            if not locked:
                return HistoryRollup(skipped=True)
            since, horizon = locked[0]
            params = {
                "since": since,
                "horizon": horizon,
                "limit": limit,
                "widths": HISTORY_WIDTHS_S,
            }
            jobs, rolled_up_to, caught_up, _ = (
                await self._fetch(conn, self.statements.history.roll_up, params)
            )[0]
            pruned = await self._fetch(
                conn,
                self.statements.history.prune_history,
                {"widths": HISTORY_WIDTHS_S, "keep_s": keeps},
            )
        return HistoryRollup(
            skipped=False,
            jobs=int(jobs),
            rolled_up_to=rolled_up_to,
            caught_up=bool(caught_up),
            pruned=int(pruned[0][0]),
        )

    async def job_history(
        self,
        tx: TransactionHandle | None,
        *,
        window: timedelta,
        resolution: timedelta,
        step: timedelta,
        group_resolution: timedelta,
        queue: str | None,
        type_name: str | None,
    ) -> JobHistory:
        params = {
            "width": int(resolution.total_seconds()),
            "step": int(step.total_seconds()),
            "group_width": int(group_resolution.total_seconds()),
            "align": int(max(step, group_resolution).total_seconds()),
            "window_s": window.total_seconds(),
            "queue": queue,
            "type_name": type_name,
        }
        rows = await self._read(tx, self.statements.history.read_history, params)
        head, rest = rows[0], rows[1:]
        points = (HistoryPoint(r[1], _figures(r)) for r in rest if r[0] == 1)
        groups = (HistoryGroup(r[2], r[3], _figures(r)) for r in rest if r[0] == 2)
        return JobHistory(
            now=head[1],
            since=head[15],
            step=step,
            resolution=resolution,
            points=tuple(sorted(points, key=lambda p: p.start)),
            groups=tuple(sorted(groups, key=lambda g: (-g.figures.ended, g.queue, g.type_name))),
            rolled_up_to=head[14],
        )


def _durations(count: Any, total: Any, longest: Any, histogram: Any) -> Durations:
    return Durations(
        count=int(count or 0),
        total_s=float(total or 0.0),
        max_s=float(longest or 0.0),
        histogram=tuple(int(n) for n in histogram or ()),
    )


def _figures(row: tuple[Any, ...]) -> HistoryFigures:
    return HistoryFigures(
        completed=int(row[4]),
        failed=int(row[5]),
        wait=_durations(*row[6:10]),
        run=_durations(*row[10:14]),
    )
