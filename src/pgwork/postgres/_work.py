"""PostgreSQL side of the operator's work views (``WorkReader``).

Mixed into ``PostgresStateAdapter``; uses its ``schema`` and the unprepared ``_read`` of
``QueryOps``, so each statement is planned with its actual filter values.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from psycopg import errors as pg_errors

from pgwork.adapters.state import PageKey, TransactionHandle
from pgwork.adapters.work import (
    ErrorGroup,
    InputMatch,
    InputScan,
    PendingType,
    WorkerJobs,
    WorkFilter,
)
from pgwork.errors import ConfigurationError
from pgwork.postgres._base import AdapterBase
from pgwork.postgres._rows import job_from_row
from pgwork.records import Job

__all__ = ["WorkOps"]


class WorkOps(AdapterBase):
    """``list_work``, ``running_by_worker``, ``pending_types``, ``error_groups``,
    ``jobs_in_id_range`` and ``scan_input``."""

    async def list_work(
        self,
        tx: TransactionHandle | None,
        *,
        where: WorkFilter,
        after: PageKey | None,
        oldest_first: bool,
        limit: int,
    ) -> list[Job[Any]]:
        params = {
            "queue": where.queue,
            "leased_by": where.leased_by,
            "error_type": where.error_type,
            "error_message": where.error_message,
            "after_at": after.created_at if after is not None else None,
            "after_id": after.id if after is not None else None,
            "limit": limit,
        }
        key = f"{where.status.value}:{'oldest' if oldest_first else 'newest'}"
        rows = await self._read(tx, self.statements.work_views.listings[key], params)
        return [job_from_row(row) for row in rows]

    async def running_by_worker(
        self, tx: TransactionHandle | None, *, per_worker: int
    ) -> list[WorkerJobs]:
        rows = await self._read(
            tx, self.statements.work_views.running_by_worker, {"per_worker": per_worker}
        )
        held: dict[str, tuple[int, list[Job[Any]]]] = {}
        for row in rows:
            job = job_from_row(row, offset=1)
            assert job.leased_by is not None  # a running job is leased
            held.setdefault(job.leased_by, (int(row[0]), []))[1].append(job)
        return [
            WorkerJobs(worker_id=worker, running=count, oldest=tuple(jobs))
            for worker, (count, jobs) in held.items()
        ]

    async def pending_types(
        self, tx: TransactionHandle | None, *, sample: int
    ) -> list[PendingType]:
        rows = await self._read(
            tx, self.statements.work_views.pending_types, {"queue": None, "sample": sample}
        )
        return [
            PendingType(queue=r[0], type_name=r[1], jobs=int(r[2]), oldest_due_at=r[3])
            for r in rows
        ]

    async def error_groups(
        self, tx: TransactionHandle | None, *, sample: int, limit: int
    ) -> list[ErrorGroup]:
        rows = await self._read(
            tx, self.statements.work_views.error_groups, {"sample": sample, "limit": limit}
        )
        return [
            ErrorGroup(
                error_type=r[0], message=r[1], jobs=int(r[2]), queues=tuple(r[3]), newest_at=r[4]
            )
            for r in rows
        ]

    async def jobs_in_id_range(
        self, tx: TransactionHandle | None, *, low: UUID, high: UUID, limit: int
    ) -> list[Job[Any]]:
        params = {"low": low, "high": high, "limit": limit}
        rows = await self._read(tx, self.statements.work_views.jobs_in_id_range, params)
        return [job_from_row(row) for row in rows]

    async def scan_input(
        self,
        tx: TransactionHandle | None,
        *,
        match: InputMatch,
        before: PageKey | None,
        examine: int,
        limit: int,
    ) -> InputScan:
        params = {
            "type_name": match.type_name,
            "path": list(match.path),
            "value": match.value_json,
            "before": before.id if before is not None else _AFTER_EVERY_ID,
            "examine": examine,
            "limit": limit + 1,
        }
        try:
            rows = await self._read(tx, self.statements.work_views.input_scan, params)
        except (UnicodeError, pg_errors.DataException) as exc:
            # The client checks what it sends; this is the database's own refusal of a
            # value (a character its encoding lacks, say), named, not a server error.
            raise ConfigurationError(f"the database cannot compare this value: {exc}") from exc
        examined, oldest_at, oldest_id, older = rows[0][:4]
        hits = [(row[4], job_from_row(row, 5)) for row in rows if row[4] is not None]
        if len(hits) > limit:
            n, last = hits[limit - 1]
            jobs = tuple(job for _, job in hits[:limit])
            return InputScan(jobs, n, PageKey(last.created_at, last.id), exhausted=False)
        oldest = PageKey(oldest_at, oldest_id) if oldest_id is not None else None
        jobs = tuple(job for _, job in hits)
        return InputScan(jobs, int(examined), oldest, exhausted=not older)


# Greater than every UUID: the first window starts at the newest job.
_AFTER_EVERY_ID = UUID(int=(1 << 128) - 1)
