"""PostgreSQL side of the worker registry: registration, heartbeats, dead workers,
pruning the stopped.

Mixed into ``PostgresStateAdapter``. A worker's row says who it is (host, pid, queues,
types, slots) and how it is doing (status, active slots, last heartbeat). A worker
whose heartbeat is older than the limit is dead: ``find_dead_workers`` marks it
stopped (once, whoever gets there first) so its jobs can be taken back at once.
"""

from __future__ import annotations

import json

from pgwork.adapters.state import WorkerInfo, WorkerRecord
from pgwork.postgres._base import AdapterBase

__all__ = ["RegistryOps"]


class RegistryOps(AdapterBase):
    """Register, heartbeat, find dead workers, list workers."""

    # Registration and heartbeats run on the adapter's own connection, never a pooled
    # one: handlers in atomic transactions may hold every pooled connection.

    async def register_worker(self, *, worker: WorkerInfo) -> None:
        async with self._own_line() as conn:
            await self._fetch(
                conn,
                self.statements.workers.register_worker,
                {
                    "id": worker.id,
                    "host": worker.host,
                    "pid": worker.pid,
                    "queues": list(worker.queues),
                    "job_types": list(worker.job_types),
                    "max_slots": worker.max_slots,
                    "metadata": json.dumps(dict(worker.metadata)),
                },
            )

    async def heartbeat(
        self, *, worker_id: str, active_slots: int, status: str, abandoned_handlers: int = 0
    ) -> bool:
        params = {
            "id": worker_id,
            "active_slots": active_slots,
            "status": status,
            "abandoned": abandoned_handlers,
        }
        async with self._own_line() as conn:
            rows = await self._fetch(conn, self.statements.workers.heartbeat, params)
        return bool(rows)

    async def find_dead_workers(self, *, older_than_s: float, exclude: str) -> list[str]:
        async with self._connection(None) as conn:
            rows = await self._fetch(
                conn,
                self.statements.workers.find_dead_workers,
                {"limit_s": older_than_s, "me": exclude},
            )
        return [row[0] for row in rows]

    async def prune_workers(self, *, stopped_for_s: float, limit: int = 1000) -> int:
        async with self._connection(None) as conn:
            rows = await self._fetch(
                conn,
                self.statements.workers.prune_workers,
                {"stopped_for_s": stopped_for_s, "limit": limit},
            )
        return len(rows)

    async def list_workers(self, *, alive_within_s: float) -> list[WorkerRecord]:
        async with self._connection(None) as conn:
            rows = await self._fetch(
                conn, self.statements.workers.list_workers, {"limit_s": alive_within_s}
            )
        return [
            WorkerRecord(
                id=r[0],
                host=r[1],
                pid=r[2],
                queues=tuple(r[3]),
                job_types=tuple(r[4]),
                max_slots=r[5],
                active_slots=r[6],
                status=r[7],
                started_at=r[8],
                heartbeat_at=r[9],
                metadata=r[10] or {},
                alive=bool(r[11]) and r[7] != "stopped",
                abandoned_handlers=r[12],
            )
            for r in rows
        ]
