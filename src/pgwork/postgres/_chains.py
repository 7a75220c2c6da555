"""PostgreSQL side of chain orchestration: blockers, cancel, retry, trigger, pause.

Mixed into ``PostgresStateAdapter``; uses its ``pool``, ``_fetch``, ``_connection`` and
``statements.chains`` (the rendered chain statements).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from pgwork.adapters._state_records import earliest_due
from pgwork.adapters.notify import Notice
from pgwork.adapters.state import (
    BlockerOutput,
    CancelledChain,
    ChainRef,
    NewJob,
    Resolution,
    TransactionHandle,
)
from pgwork.errors import ChainNotFoundError
from pgwork.postgres._base import AdapterBase
from pgwork.postgres._callers import DbConn
from pgwork.records import ChainStatus, JobStatus

__all__ = ["ChainOps"]

# Dependants of dependants are resolved level by level; a cycle is impossible (a job
# can only be blocked on chains that existed before it), this bounds a runaway anyway.
MAX_RESOLVE_DEPTH = 64


def _resolution(rows: Sequence[tuple[Any, ...]]) -> Resolution:
    """What settling did, from its rows: (job id, chain id, status, queue, awaited, due)
    of each job whose status changed."""
    return Resolution(
        ready_queues=tuple(sorted({r[3] for r in rows if r[2] == JobStatus.PENDING})),
        ended_chain_ids=tuple(r[1] for r in rows if r[2] != JobStatus.PENDING),
        awaited_chain_ids=tuple(r[1] for r in rows if r[2] != JobStatus.PENDING and r[4]),
        due=earliest_due(
            (r[3], float(r[5])) for r in rows if r[2] == JobStatus.PENDING and r[5] is not None
        ),
    )


class ChainOps(AdapterBase):
    """Blockers, cancel, retry, trigger, pause and await support."""

    # --- blockers ----------------------------------------------------------------------

    async def _check_blockers(self, conn: DbConn, jobs: Sequence[NewJob]) -> list[Notice]:
        """Lock the blocker chains' roots (see LOCK_BLOCKER_CHAINS) and refuse unknown
        ones. Returns the notices that announce the pending roots among them (one per
        queue and due time): an acquire skips a locked row, so one that ran meanwhile
        may have left its worker idle until the poll."""
        wanted = sorted({b for job in jobs for b in job.blockers})
        rows = await self._fetch(conn, self.statements.chains.lock_blocker_chains, {"ids": wanted})
        found = {row[0] for row in rows}
        missing = [chain_id for chain_id in wanted if chain_id not in found]
        if missing:
            raise ChainNotFoundError(missing)
        pending = dict.fromkeys((row[2], row[3]) for row in rows if row[2])
        return [Notice(kind="ready", queue=queue, at=at) for queue, at in pending]

    async def _insert_blocker_edges(self, conn: DbConn, jobs: Sequence[NewJob]) -> Resolution:
        """Record the edges of freshly inserted blocked jobs, count them (settling any
        whose blockers already ended), and settle what that ended in turn."""
        edges = [
            (job.id, chain_id, position, job.blocker_failure)
            for job in jobs
            for position, chain_id in enumerate(job.blockers)
        ]
        await self._fetch(
            conn,
            self.statements.chains.insert_blockers,
            {
                "job_ids": [e[0] for e in edges],
                "chain_ids": [e[1] for e in edges],
                "positions": [e[2] for e in edges],
                "policies": [e[3] for e in edges],
            },
        )
        first = await self._count(
            conn, [job.id for job in jobs], [job.blocker_need for job in jobs]
        )
        more = await self._resolve_dependants_of(conn, list(first.ended_chain_ids))
        return first.merge(more)

    async def _count(
        self, conn: DbConn, job_ids: Sequence[UUID], needs: Sequence[int | None]
    ) -> Resolution:
        """Count the blocked jobs' edges from scratch (COUNT_BLOCKERS)."""
        rows = await self._fetch(
            conn,
            self.statements.chains.count_blockers,
            {"job_ids": list(job_ids), "needs": list(needs)},
        )
        return _resolution(rows)

    async def _settle_ended(
        self, conn: DbConn, chain_ids: Sequence[UUID], job_ids: Sequence[UUID]
    ) -> Resolution:
        """Settle the ends of ``chain_ids`` for their locked dependants ``job_ids``, one
        edge each (SETTLE_ENDED)."""
        rows = await self._fetch(
            conn,
            self.statements.chains.settle_ended,
            {"chain_ids": list(chain_ids), "job_ids": list(job_ids)},
        )
        return _resolution(rows)

    async def _resolve_dependants_of(self, conn: DbConn, chain_ids: Sequence[UUID]) -> Resolution:
        """Settle jobs blocked on ``chain_ids`` (which just ended, or were reopened by a
        retry), level by level.

        Must run inside a transaction: the lock and the decision are two statements.
        """
        total = Resolution()
        pending = list(chain_ids)
        for _ in range(MAX_RESOLVE_DEPTH):
            if not pending:
                break
            locked = await self._fetch(
                conn, self.statements.chains.lock_blocked_dependants, {"chain_ids": pending}
            )
            if not locked:
                break
            step = await self._settle_ended(conn, pending, [row[0] for row in locked])
            total = total.merge(step)
            pending = list(step.ended_chain_ids)
        return total

    async def resolve_dependants(
        self, tx: TransactionHandle | None, *, chain_ids: Sequence[UUID]
    ) -> Resolution:
        if not chain_ids:
            return Resolution()
        if tx is None:
            async with self.transaction() as own:
                return await self.resolve_dependants(own, chain_ids=chain_ids)
        async with self._connection(tx) as conn:
            return await self._resolve_dependants_of(conn, chain_ids)

    async def sweep_blocked(self, *, limit: int = 100) -> Resolution:
        """Settle blocked jobs some of whose blockers ended unsettled (a process died
        between ending a blocker and settling its dependants): their edges are counted
        again from scratch."""
        async with self.transaction() as tx, self._connection(tx) as conn:
            rows = await self._fetch(
                conn, self.statements.chains.find_resolvable_blocked, {"limit": limit}
            )
            if not rows:
                return Resolution()
            first = await self._count(conn, [row[0] for row in rows], [None] * len(rows))
            return first.merge(await self._resolve_dependants_of(conn, first.ended_chain_ids))

    async def blocker_outputs(
        self, tx: TransactionHandle | None, *, job_id: UUID
    ) -> list[BlockerOutput]:
        async with self._connection(tx) as conn:
            rows = await self._fetch(
                conn, self.statements.chains.blocker_outputs, {"job_id": job_id}
            )
        return [
            BlockerOutput(
                chain_id=row[0],
                status=ChainStatus(row[1]) if row[1] else None,
                type_name=row[2],
                output=row[3],
                met=bool(row[4]),
            )
            for row in rows
        ]

    # --- control -----------------------------------------------------------------------

    async def chains_of(
        self, tx: TransactionHandle | None, *, ids: Sequence[UUID]
    ) -> list[ChainRef]:
        async with self._connection(tx) as conn:
            rows = await self._fetch(conn, self.statements.chains.chains_of, {"ids": list(ids)})
        return [
            ChainRef(
                id=row[0],
                chain_id=row[1],
                chain_status=ChainStatus(row[2]) if row[2] else None,
                job_status=JobStatus(row[3]) if row[3] else None,
                leased_by=row[4],
            )
            for row in rows
        ]

    async def cancel_chains(
        self, tx: TransactionHandle, *, chain_ids: Sequence[UUID]
    ) -> tuple[list[CancelledChain], Resolution]:
        async with self._connection(tx) as conn:
            # Two statements: the second must see what was handed on before the
            # first's locks were granted (see LOCK_ACTIVE_CHAINS).
            locked = await self._fetch(
                conn,
                self.statements.chains.lock_active_chains,
                {"chain_ids": sorted(set(chain_ids))},
            )
            if not locked:
                return [], Resolution()
            rows = await self._fetch(
                conn,
                self.statements.chains.cancel_chains,
                {"chain_ids": [row[0] for row in locked]},
            )
            cancelled = [CancelledChain(chain_id=row[0], job_ids=tuple(row[1])) for row in rows]
            resolution = await self._resolve_dependants_of(conn, [c.chain_id for c in cancelled])
        return cancelled, resolution

    async def retry_failed(
        self, tx: TransactionHandle, *, job_ids: Sequence[UUID], front: bool
    ) -> list[tuple[UUID, str]]:
        async with self._connection(tx) as conn:
            rows = await self._fetch(
                conn, self.statements.chains.retry_failed, {"ids": list(job_ids), "front": front}
            )
            chain_ids = sorted({r[1] for r in rows})
            await self._fetch(conn, self.statements.chains.reopen_chains, {"chain_ids": chain_ids})
            # A reopened chain runs again: the jobs blocked on it wait for its new end
            # rather than count the failure it no longer is. Reopening an edge makes no
            # blocked job pending nor ends one, so there is nothing to announce.
            await self._resolve_dependants_of(conn, chain_ids)
        return [(row[0], row[2]) for row in rows]

    async def trigger(self, tx: TransactionHandle, *, job_ids: Sequence[UUID]) -> list[str]:
        async with self._connection(tx) as conn:
            rows = await self._fetch(conn, self.statements.chains.trigger, {"ids": list(job_ids)})
        return sorted({row[1] for row in rows})

    async def set_queue_paused(
        self, tx: TransactionHandle | None, *, queue: str, paused: bool
    ) -> None:
        async with self._connection(tx) as conn:
            await self._fetch(
                conn, self.statements.chains.set_queue_paused, {"name": queue, "paused": paused}
            )

    async def now(self) -> datetime:
        async with self._connection(None) as conn:
            rows = await self._fetch(conn, b"SELECT now()", {})
        value: datetime = rows[0][0]
        return value

    async def mark_chain_awaited(self, *, chain_id: UUID) -> None:
        async with self._connection(None) as conn:
            await self._fetch(conn, self.statements.chains.mark_awaited, {"chain_id": chain_id})
