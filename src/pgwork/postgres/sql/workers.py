"""SQL of the worker registry: register, heartbeat, declare the silent dead, prune the
stopped, list."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WorkerStatements"]

REGISTER_WORKER = """
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

FIND_DEAD_WORKERS = """
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
PRUNE_WORKERS = """
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

LIST_WORKERS = """
SELECT id, host, pid, queues, job_types, max_slots, active_slots, status, started_at,
    heartbeat_at, metadata, now() - heartbeat_at < %(limit_s)s * interval '1 second',
    abandoned_handlers
FROM {workers}
ORDER BY started_at DESC
"""


@dataclass(frozen=True, slots=True)
class WorkerStatements:
    register_worker: bytes
    heartbeat: bytes
    find_dead_workers: bytes
    prune_workers: bytes
    list_workers: bytes
