"""SQL of the operator's read side beyond the listings: recent activity, chain links.

Run unprepared, as ``queries``, so each is planned with its actual values. Each reads a
bounded index range: a dashboard page must cost the same on a table of a thousand jobs
or a hundred million.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from pgwork.postgres._names import validate_schema_name
from pgwork.postgres.sql.fragments import first_edges, in_chain

__all__ = ["InsightStatements", "jobs_table"]

# Jobs that ended (completed or failed) since the start of the bucket the window begins
# in, newest first from jobs_ended_idx (migration 0007) and capped at ``sample`` rows:
# below the cap the count is exact; at it, ``since`` says how far back it reached. The
# ended jobs are read once, straight into their buckets of ``bucket_s`` seconds per
# queue (kind 1 rows), each numbered in float8 arithmetic (``date_part``: ``extract``
# computes in numeric, several times slower per row) and turned into its start time
# only once grouped. The first row (kind 0) carries the database clock, how many jobs
# were read and the end time of the oldest, both taken from the buckets, and the
# planner's estimate of the table's rows.
RECENT_ACTIVITY = """
WITH buckets AS MATERIALIZED (
    SELECT e.queue, e.n,
           count(*) FILTER (WHERE e.status = 'completed') AS completed,
           count(*) FILTER (WHERE e.status = 'failed') AS failed,
           min(e.completed_at) AS oldest
    FROM (
        SELECT j.queue, j.status, j.completed_at,
               floor(date_part('epoch', j.completed_at) / %(bucket_s)s) AS n
        FROM {jobs} AS j
        WHERE j.status IN ('completed', 'failed')
          AND j.completed_at >= to_timestamp(
              floor((date_part('epoch', now()) - %(window_s)s) / %(bucket_s)s + 1)
              * %(bucket_s)s)
        ORDER BY j.completed_at DESC
        LIMIT %(sample)s
    ) AS e
    GROUP BY e.queue, e.n
)
SELECT 0 AS kind, NULL::text, now(),
       (SELECT COALESCE(sum(b.completed + b.failed), 0)::bigint FROM buckets AS b),
       (SELECT GREATEST(c.reltuples, 0)::bigint FROM pg_class AS c
        WHERE c.oid = %(jobs_table)s::regclass),
       (SELECT min(b.oldest) FROM buckets AS b)
UNION ALL
SELECT 1, b.queue, to_timestamp(b.n * %(bucket_s)s), b.completed, b.failed, NULL
FROM buckets AS b
ORDER BY 1, 2, 3
"""

# The chains this chain's jobs wait for: the first ``limit`` blocker edges of each of
# its jobs by position (job_blockers_position_idx), then the first ``limit`` of those
# (a chain's jobs come from the primary key and jobs_chain_idx). A step waiting for
# 10,000 children costs ``limit`` edges, not 10,000.
CHAIN_BLOCKERS = f"""
SELECT j.chain_id, j.id, e.blocker_chain_id, r.chain_status::text, j.status::text
FROM {{jobs}} AS j
CROSS JOIN LATERAL {first_edges("j", "%(limit)s")} AS e
LEFT JOIN {{jobs}} AS r ON r.id = e.blocker_chain_id AND r.id = r.chain_id
WHERE {in_chain("j", "%(chain_id)s::uuid")}
ORDER BY j.chain_index, e.position
LIMIT %(limit)s
"""

# Jobs of other chains waiting for this one (job_blockers_blocker_idx), with the status
# of the chain each belongs to.
CHAIN_DEPENDANTS = """
SELECT d.chain_id, d.id, e.blocker_chain_id, r.chain_status::text, d.status::text
FROM {job_blockers} AS e
JOIN {jobs} AS d ON d.id = e.job_id
LEFT JOIN {jobs} AS r ON r.id = d.chain_id AND r.id = r.chain_id
WHERE e.blocker_chain_id = %(chain_id)s::uuid
  AND d.chain_id <> %(chain_id)s::uuid
ORDER BY d.created_at, d.id
LIMIT %(limit)s
"""


@dataclass(frozen=True, slots=True)
class InsightStatements:
    recent_activity: bytes
    chain_blockers: bytes
    chain_dependants: bytes


def jobs_table(schema: str) -> str:
    """The jobs table's name as ``regclass`` reads it (quoted, schema-qualified)."""
    schema = validate_schema_name(schema)
    return sql.Identifier(schema, "jobs").as_string(None)
