"""Numbers about the queues for dashboards and metrics, read with one short query.

Synchronous on purpose: metric readers (OpenTelemetry's periodic reader, a Prometheus
scrape) call their callbacks from their own thread, outside any event loop.
"""

from __future__ import annotations

from psycopg import sql

from pgwork.postgres._names import DEFAULT_SCHEMA, validate_schema_name
from pgwork.postgres.connect import connect_sync

__all__ = ["QUEUE_DEPTHS", "queue_depths"]

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
