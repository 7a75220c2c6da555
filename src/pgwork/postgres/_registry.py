"""PostgreSQL side of the worker registry: registration, heartbeats, dead workers,
pruning the stopped.

Mixed into ``PostgresStateAdapter``. A worker's row says who it is (host, pid, queues,
types, slots) and how it is doing (status, active slots, last heartbeat). A worker
whose heartbeat is older than the limit is dead: ``find_dead_workers`` marks it
stopped (once, whoever gets there first) so its jobs can be taken back at once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from psycopg import sql

from pgwork.adapters.state import TransactionHandle, WorkerInfo, WorkerRecord
from pgwork.postgres._callers import DbConn
from pgwork.postgres._names import validate_schema_name

__all__ = ["RegistryOps", "render_registry_statements"]

REGISTER = """
INSERT INTO {workers} (
    id, host, pid, queues, job_types, max_slots, active_slots, status, started_at,
    heartbeat_at, metadata
)
VALUES (
    %(id)s, %(host)s, %(pid)s, %(queues)s, %(job_types)s, %(max_slots)s, 0, 'idle',
    now(), now(), %(metadata)s::jsonb
)
ON CONFLICT (id) DO UPDATE
SET host = EXCLUDED.host, pid = EXCLUDED.pid, queues = EXCLUDED.queues,
    job_types = EXCLUDED.job_types, max_slots = EXCLUDED.max_slots, active_slots = 0,
    status = 'idle', started_at = now(), heartbeat_at = now(), metadata = EXCLUDED.metadata
"""

# Returns no row when the worker was declared dead meanwhile (it must register again:
# its jobs were taken back and its attempts will find their leases gone).
HEARTBEAT = """
UPDATE {workers}
SET heartbeat_at = now(), active_slots = %(active_slots)s, status = %(status)s,
    abandoned_handlers = %(abandoned)s
WHERE id = %(id)s AND status <> 'stopped'
RETURNING id
"""

FIND_DEAD = """
WITH dead AS (
    SELECT w.id FROM {workers} AS w
    WHERE w.status <> 'stopped'
      AND w.heartbeat_at < now() - %(limit_s)s * interval '1 second'
      AND w.id <> %(me)s
    ORDER BY w.heartbeat_at
    LIMIT 100
    FOR UPDATE SKIP LOCKED
)
UPDATE {workers} AS w
SET status = 'stopped'
FROM dead
WHERE w.id = dead.id
RETURNING w.id
"""

# Stopped workers (gone for good, or declared dead) linger for operators to see; after
# the retention their rows go. Keyed on the last heartbeat, which a stopped worker no
# longer moves.
PRUNE = """
WITH gone AS (
    SELECT w.id FROM {workers} AS w
    WHERE w.status = 'stopped'
      AND w.heartbeat_at < now() - %(stopped_for_s)s * interval '1 second'
    ORDER BY w.heartbeat_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {workers} AS w
USING gone
WHERE w.id = gone.id
RETURNING w.id
"""

LIST = """
SELECT id, host, pid, queues, job_types, max_slots, active_slots, status, started_at,
    heartbeat_at, metadata, now() - heartbeat_at < %(limit_s)s * interval '1 second',
    abandoned_handlers
FROM {workers}
ORDER BY started_at DESC
"""


def render_registry_statements(schema: str) -> dict[str, bytes]:
    schema = validate_schema_name(schema)
    workers = sql.Identifier(schema, "workers")
    return {
        name: sql.SQL(text).format(workers=workers).as_bytes(None)
        for name, text in (
            ("register", REGISTER),
            ("heartbeat", HEARTBEAT),
            ("find_dead", FIND_DEAD),
            ("prune", PRUNE),
            ("list", LIST),
        )
    }


class RegistryOps:
    """Register, heartbeat, find dead workers, list workers."""

    if TYPE_CHECKING:
        _rsql: dict[str, bytes]

        async def _fetch(
            self, conn: DbConn, query: bytes, params: Mapping[str, Any]
        ) -> list[tuple[Any, ...]]: ...

        def _connection(
            self, tx: TransactionHandle | None
        ) -> AbstractAsyncContextManager[DbConn]: ...

        def _own_line(self) -> AbstractAsyncContextManager[DbConn]: ...

    # Registration and heartbeats run on the adapter's own connection, never a pooled
    # one: handlers in atomic transactions may hold every pooled connection.

    async def register_worker(self, *, worker: WorkerInfo) -> None:
        async with self._own_line() as conn:
            await self._fetch(
                conn,
                self._rsql["register"],
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
            rows = await self._fetch(conn, self._rsql["heartbeat"], params)
        return bool(rows)

    async def find_dead_workers(self, *, older_than_s: float, exclude: str) -> list[str]:
        async with self._connection(None) as conn:
            rows = await self._fetch(
                conn, self._rsql["find_dead"], {"limit_s": older_than_s, "me": exclude}
            )
        return [row[0] for row in rows]

    async def prune_workers(self, *, stopped_for_s: float, limit: int = 1000) -> int:
        async with self._connection(None) as conn:
            rows = await self._fetch(
                conn, self._rsql["prune"], {"stopped_for_s": stopped_for_s, "limit": limit}
            )
        return len(rows)

    async def list_workers(self, *, alive_within_s: float) -> list[WorkerRecord]:
        async with self._connection(None) as conn:
            rows = await self._fetch(conn, self._rsql["list"], {"limit_s": alive_within_s})
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
