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

__all__ = ["FLOW_RATES", "FLOW_USAGE", "QUEUE_DEPTHS", "flow_rates", "flow_usage", "queue_depths"]

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


# Per type asked about: its effective rate (its row's override, else the declaration
# given) and the attempts of the type started in that rate's window ending now, of
# every key (``job_starts_type_idx``), as the acquire counts them; a type whose
# effective rate is none is left out.
FLOW_RATES = """
SELECT t.name, COALESCE(o.rate_n, t.rate_n),
    (SELECT count(*) FROM {job_starts} AS s
     WHERE s.type_name = t.name
       AND s.started_at > now() - make_interval(secs => COALESCE(o.rate_per_s, t.rate_per_s)))
FROM unnest(%(names)s::text[], %(rate_n)s::int[], %(rate_per_s)s::float8[])
    AS t(name, rate_n, rate_per_s)
LEFT JOIN {job_limits} AS o ON o.type_name = t.name AND o.limit_key = ''
WHERE COALESCE(o.rate_n, t.rate_n) IS NOT NULL
ORDER BY t.name
"""


def flow_rates(
    dsn: str, job_types: Iterable[Any], *, schema: str = DEFAULT_SCHEMA
) -> dict[str, tuple[int, int]]:
    """``{type: (started, rate count)}`` for each limited type of ``job_types``
    (``JobType``s, e.g. a registry) with a rate: the attempts started in the window of
    its effective rate (an operator's override, else the declaration) ending now, on
    every worker, and how many that rate lets start per window, on a new connection. A
    type without a rate is left out. Meant for ``OpenTelemetryObserver(flow_rates=...)``."""
    schema = validate_schema_name(schema)
    limited = sorted((t for t in job_types if t.limited), key=lambda t: t.name)
    query = sql.SQL(FLOW_RATES).format(
        job_starts=sql.Identifier(schema, "job_starts"),
        job_limits=sql.Identifier(schema, "job_limits"),
    )
    params = {
        "names": [t.name for t in limited],
        "rate_n": [t.rate.n if t.rate else None for t in limited],
        "rate_per_s": [t.rate.per.total_seconds() if t.rate else None for t in limited],
    }
    with connect_sync(dsn, autocommit=True) as conn:
        rows = conn.execute(query, params).fetchall()
    return {str(name): (int(started), int(rate)) for name, rate, started in rows}
