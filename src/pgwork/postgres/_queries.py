"""PostgreSQL side of the read API: jobs and chains by id, listings, counts; and deletion
and retention.

Mixed into ``PostgresStateAdapter``; uses its ``pool``, ``schema``, ``_fetch``,
``_connection`` and ``transaction``. Listings run unprepared (``_read``): each is planned
with its actual filter values, so the planner can use the partial index they match.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any
from uuid import UUID

from pgwork._ids import first_id_at
from pgwork.adapters.state import (
    LISTED_BLOCKERS,
    BlockedJob,
    BlockerEdge,
    BlockerStatus,
    ChainDeletion,
    ChainDependant,
    ChainFilter,
    JobFilter,
    PageKey,
    QueueCount,
    TransactionHandle,
)
from pgwork.postgres._base import AdapterBase
from pgwork.postgres._callers import DbConn
from pgwork.postgres._history import HISTORY_WIDTHS_S
from pgwork.postgres._rows import JOB_WIDTH, chain_from_row, job_from_row
from pgwork.postgres._transactions import unwrap
from pgwork.postgres.sql.queries import retention_lock_key
from pgwork.records import Chain, ChainStatus, Job
from pgwork.retention import Retention

_SAVEPOINT = b"SAVEPOINT pgwork_delete"
_ROLLBACK_TO_SAVEPOINT = b"ROLLBACK TO SAVEPOINT pgwork_delete"
_RELEASE_SAVEPOINT = b"RELEASE SAVEPOINT pgwork_delete"

__all__ = ["QueryOps"]


class QueryOps(AdapterBase):
    """Listing / counting / deleting operations of the PostgreSQL state adapter."""

    # --- by id -------------------------------------------------------------------------

    async def get_jobs(
        self, tx: TransactionHandle | None, *, job_ids: Sequence[UUID]
    ) -> list[Job[Any]]:
        async with self._connection(tx) as conn:
            rows = await self._fetch(conn, self.statements.queries.get_jobs, {"ids": list(job_ids)})
        return [job_from_row(row) for row in rows]

    async def get_chains(
        self, tx: TransactionHandle | None, *, chain_ids: Sequence[UUID]
    ) -> list[Chain]:
        async with self._connection(tx) as conn:
            rows = await self._fetch(
                conn, self.statements.queries.get_chains, {"ids": list(chain_ids)}
            )
        return [chain_from_row(row) for row in rows]

    async def list_chain_jobs(
        self, tx: TransactionHandle | None, *, chain_id: UUID
    ) -> list[Job[Any]]:
        async with self._connection(tx) as conn:
            rows = await self._fetch(
                conn, self.statements.queries.list_chain_jobs, {"chain_id": chain_id}
            )
        return [job_from_row(row) for row in rows]

    # --- listings ----------------------------------------------------------------------

    async def list_jobs(
        self,
        tx: TransactionHandle | None,
        *,
        where: JobFilter,
        after: PageKey | None,
        limit: int,
    ) -> list[Job[Any]]:
        params = {
            "type_name": where.type_name,
            "queue": where.queue,
            "status": where.status.value if where.status is not None else None,
            "chain_id": where.chain_id,
            "created_after": where.created_after,
            "created_since_id": (
                first_id_at(where.created_after - _CLOCK_MARGIN)
                if where.created_after is not None
                else None
            ),
            "created_before": where.created_before,
            "after_id": after.id if after is not None else None,
            "limit": limit,
        }
        rows = await self._read(tx, self.statements.queries.list_jobs, params)
        return [job_from_row(row) for row in rows]

    async def list_chains(
        self,
        tx: TransactionHandle | None,
        *,
        where: ChainFilter,
        after: PageKey | None,
        limit: int,
    ) -> list[Chain]:
        statuses = [where.status] if where.status is not None else list(ChainStatus)
        params = {
            "type_name": where.type_name,
            "statuses": [status.value for status in statuses],
            "created_after": where.created_after,
            "created_before": where.created_before,
            "dedup_key": where.dedup_key,
            **_page_params(after, limit),
        }
        rows = await self._read(tx, self.statements.queries.list_chains, params)
        return [chain_from_row(row) for row in rows]

    async def list_blocked_jobs(
        self, tx: TransactionHandle | None, *, after: PageKey | None, limit: int
    ) -> list[BlockedJob]:
        # One edge more than shown: its presence says the job waits for more.
        params = {**_page_params(after, limit), "edges": LISTED_BLOCKERS + 1}
        rows = await self._read(tx, self.statements.queries.list_blocked_jobs, params)
        listed = []
        for row in rows:
            chain_ids, statuses = row[JOB_WIDTH + 3] or (), row[JOB_WIDTH + 4] or ()
            blockers = tuple(
                BlockerStatus(chain_id, ChainStatus(status) if status else None)
                for chain_id, status in zip(chain_ids, statuses, strict=True)
            )
            listed.append(
                BlockedJob(
                    job=job_from_row(row),
                    blockers=blockers[:LISTED_BLOCKERS],
                    more_blockers=len(blockers) > LISTED_BLOCKERS,
                    blockers_needed=row[JOB_WIDTH],
                    blockers_met=row[JOB_WIDTH + 1],
                    blockers_open=row[JOB_WIDTH + 2],
                )
            )
        return listed

    async def list_blockers(
        self, tx: TransactionHandle | None, *, job_id: UUID, after: int | None, limit: int
    ) -> list[BlockerEdge]:
        params = {"job_id": job_id, "after": after, "limit": limit}
        rows = await self._read(tx, self.statements.queries.list_blockers, params)
        return [
            BlockerEdge(position, chain_id, ChainStatus(status) if status else None)
            for position, chain_id, status in rows
        ]

    async def count_jobs(self, tx: TransactionHandle | None) -> list[QueueCount]:
        rows = await self._read(tx, self.statements.queries.count_jobs, {})
        return [
            QueueCount(
                queue=r[0],
                paused=r[1],
                ready=r[2],
                scheduled=r[3],
                running=r[4],
                blocked=r[5],
                failed=r[6],
                oldest_ready_at=r[7],
                oldest_ready_age=r[8],
            )
            for r in rows
        ]

    # --- deletion ----------------------------------------------------------------------

    async def delete_chains(
        self, tx: TransactionHandle, *, chain_ids: Sequence[UUID], cascade: bool
    ) -> ChainDeletion:
        conn = await unwrap(tx)
        wanted = list(dict.fromkeys(chain_ids))
        if not wanted:
            return ChainDeletion(deleted_chains=0, deleted_jobs=0)
        # In a savepoint of the caller's transaction: a delete that refuses gives back
        # the locks it took, so that workers may go on with those chains while the
        # caller, having caught the error, goes on with its transaction.
        await self._fetch(conn, _SAVEPOINT, {})
        deletion = await self._delete_chains(conn, wanted, cascade=cascade)
        refused = bool(deletion.missing) or (bool(deletion.dependants) and not cascade)
        if refused:
            await self._fetch(conn, _ROLLBACK_TO_SAVEPOINT, {})
        await self._fetch(conn, _RELEASE_SAVEPOINT, {})
        return deletion

    async def _delete_chains(
        self, conn: DbConn, wanted: list[UUID], *, cascade: bool
    ) -> ChainDeletion:
        locked = {
            row[0]
            for row in await self._fetch(conn, self.statements.queries.lock_chains, {"ids": wanted})
        }
        missing = tuple(chain_id for chain_id in wanted if chain_id not in locked)
        if missing:
            return ChainDeletion(deleted_chains=0, deleted_jobs=0, missing=missing)
        doomed = set(locked)
        frontier = sorted(locked)
        found: list[ChainDependant] = []
        # Level by level: each new level is locked before its own dependants are looked
        # for, for the same reason as the first (see LOCK_CHAINS).
        while frontier:
            rows = await self._fetch(
                conn,
                self.statements.queries.find_dependants,
                {"ids": frontier, "excluded": sorted(doomed)},
            )
            level = [ChainDependant(*row) for row in rows]
            if level and not cascade:
                return ChainDeletion(deleted_chains=0, deleted_jobs=0, dependants=tuple(level))
            found.extend(level)
            frontier = sorted({d.chain_id for d in level} - doomed)
            if frontier:
                await self._fetch(conn, self.statements.queries.lock_chains, {"ids": frontier})
                doomed.update(frontier)
        rows = await self._fetch(
            conn, self.statements.queries.delete_chains, {"ids": sorted(doomed)}
        )
        chains, jobs = rows[0]
        return ChainDeletion(
            deleted_chains=int(chains), deleted_jobs=int(jobs), dependants=tuple(found)
        )

    async def delete_expired_chains(self, *, retention: Mapping[str, Retention], limit: int) -> int:
        ranges = [
            (type_name, ending, period.total_seconds())
            for type_name, policy in retention.items()
            for ending, period in policy.periods()
        ]
        if limit <= 0 or not ranges:
            return 0
        policy = {
            "type_names": [r[0] for r in ranges],
            "endings": [r[1] for r in ranges],
            "seconds": [r[2] for r in ranges],
            "limit": limit,
        }
        async with self.transaction() as tx:
            conn = await unwrap(tx)
            key = {"key": retention_lock_key(self.schema)}
            locked = await self._fetch(conn, self.statements.queries.try_retention_lock, key)
            if not locked[0][0]:
                return 0
            await self._fetch(conn, self.statements.queries.lock_history_progress, {})
            ids = [
                row[0]
                for row in await self._fetch(
                    conn, self.statements.queries.lock_expired_chains, policy
                )
            ]
            if not ids:
                return 0
            params = {"ids": ids, "widths": HISTORY_WIDTHS_S}
            rows = await self._fetch(conn, self.statements.queries.delete_expired_chains, params)
            return int(rows[0][0])


# How far behind the database's clock an enqueuing machine's may be for a job to still
# match ``created_after`` (see LIST_JOBS).
_CLOCK_MARGIN = timedelta(hours=1)


def _page_params(after: PageKey | None, limit: int) -> dict[str, Any]:
    return {
        "after_at": after.created_at if after is not None else None,
        "after_id": after.id if after is not None else None,
        "limit": limit,
    }
