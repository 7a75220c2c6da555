"""PostgreSQL side of the operator's read side: recent activity and a chain's links.

Mixed into ``PostgresStateAdapter``; uses its ``schema`` and the unprepared ``_read`` of
``QueryOps``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

from pgwork.adapters.insight import ActivityBucket, ChainLink, ChainLinks, RecentActivity
from pgwork.adapters.state import TransactionHandle
from pgwork.postgres._base import AdapterBase
from pgwork.postgres.sql.insight import jobs_table
from pgwork.records import ChainStatus, JobStatus

__all__ = ["InsightOps"]


class InsightOps(AdapterBase):
    """``recent_activity`` and ``chain_links`` of the PostgreSQL state adapter."""

    async def recent_activity(
        self,
        tx: TransactionHandle | None,
        *,
        window: timedelta,
        bucket: timedelta,
        sample_size: int,
    ) -> RecentActivity:
        params = {
            "sample": sample_size,
            "window_s": window.total_seconds(),
            "bucket_s": bucket.total_seconds(),
            "jobs_table": jobs_table(self.schema),
        }
        rows = await self._read(tx, self.statements.insight.recent_activity, params)
        _, _, now, sampled, estimated, oldest = rows[0]
        complete = int(sampled) < sample_size
        return RecentActivity(
            now=now,
            buckets=tuple(
                ActivityBucket(queue=r[1], start=r[2], completed=int(r[3]), failed=int(r[4]))
                for r in rows[1:]
            ),
            sampled=int(sampled),
            complete=complete,
            estimated_jobs=int(estimated or 0),
            counted_from=None if complete else oldest,
        )

    async def chain_links(
        self, tx: TransactionHandle | None, *, chain_id: UUID, limit: int
    ) -> ChainLinks:
        params = {"chain_id": chain_id, "limit": limit}
        blockers = await self._read(tx, self.statements.insight.chain_blockers, params)
        dependants = await self._read(tx, self.statements.insight.chain_dependants, params)
        return ChainLinks(
            blockers=tuple(_link(row) for row in blockers),
            dependants=tuple(_link(row) for row in dependants),
        )


def _link(row: tuple[Any, ...]) -> ChainLink:
    return ChainLink(
        chain_id=row[0],
        job_id=row[1],
        blocker_chain_id=row[2],
        status=ChainStatus(row[3]) if row[3] is not None else None,
        job_status=JobStatus(row[4]),
    )
