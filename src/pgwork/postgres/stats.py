"""Numbers about the queues for dashboards and metrics, read with one short query.

Synchronous on purpose: metric readers (OpenTelemetry's periodic reader, a Prometheus
scrape) call their callbacks from their own thread, outside any event loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from psycopg import sql

from pgwork.postgres._names import DEFAULT_SCHEMA, validate_schema_name
from pgwork.postgres.connect import connect_sync

__all__ = ["FLOW_USAGE", "QUEUE_DEPTHS", "flow_usage", "queue_depths"]

# Pending jobs per queue, ready now or scheduled for later.
QUEUE_DEPTHS = """
SELECT j.queue, count(*)
FROM {jobs} AS j
WHERE j.status = 'pending'
GROUP BY j.queue
ORDER BY j.queue
"""


def queue_depths(dsn: str, *, schema: str = DEFAULT_SCHEMA) -> dict[str, int]:
    """``{queue: pending jobs}`` for every queue that has any, on a new connection.

    Meant for a metrics callback every few seconds; raises ``DatabaseUnreachableError``
    when the database cannot be reached.
    """
    schema = validate_schema_name(schema)
    query = sql.SQL(QUEUE_DEPTHS).format(jobs=sql.Identifier(schema, "jobs"))
    with connect_sync(dsn, autocommit=True) as conn:
        rows = conn.execute(query).fetchall()
    return {str(queue): int(count) for queue, count in rows}


# Per limited type asked about: its limited jobs running now (jobs_limit_running_idx)
# and its concurrency override, if any.
FLOW_USAGE = """
SELECT t.name,
    (SELECT count(*) FROM {jobs} AS j
     WHERE j.status = 'running' AND j.limit_group IS NOT NULL AND j.type_name = t.name),
    o.concurrency
FROM unnest(%(names)s::text[]) AS t(name)
LEFT JOIN {job_limits} AS o ON o.type_name = t.name AND o.limit_key = ''
ORDER BY t.name
"""


def flow_usage(
    dsn: str, job_types: Iterable[Any], *, schema: str = DEFAULT_SCHEMA
) -> dict[str, tuple[int, int | None]]:
    """``{type: (running, concurrency limit)}`` for each limited type of ``job_types``
    (``JobType``s, e.g. a registry): the attempts running now on every worker, and the
    effective limit (an operator's override, else the declaration; None for none), on
    a new connection. Meant for ``OpenTelemetryObserver(flow_usage=...)``."""
    schema = validate_schema_name(schema)
    declared = {t.name: t.concurrency for t in job_types if t.limited}
    query = sql.SQL(FLOW_USAGE).format(
        jobs=sql.Identifier(schema, "jobs"), job_limits=sql.Identifier(schema, "job_limits")
    )
    with connect_sync(dsn, autocommit=True) as conn:
        rows = conn.execute(query, {"names": sorted(declared)}).fetchall()
    return {
        str(name): (int(running), override if override is not None else declared[str(name)])
        for name, running, override in rows
    }
