"""SQL of the operator's work views: jobs waiting or running, stuck job types, failures
grouped by error, jobs by id prefix, jobs by an input field.

Run unprepared, as ``queries``, so a NULL filter folds away. Each reads a bounded index
range:

- waiting jobs (ready or scheduled) come from jobs_acquire_idx ``(queue, priority,
  scheduled_at) WHERE status = 'pending'``. Its ``(queue, priority)`` lanes are found by
  skipping through the index (one probe per lane), then each lane is read in
  ``scheduled_at`` order from the cursor on, at most ``limit`` rows, and the lanes
  merged: a page costs lanes x limit rows, however many jobs wait;
- running jobs come from jobs_lease_expiry_idx (at most the workers' slots); per
  worker, every running row is read once but only the first few of each worker are
  read whole and returned;
- failed jobs from jobs_attention_idx, whose ``(status, type_name, created_at)`` lanes
  are read and merged the same way;
- an id prefix is a range of the primary key;
- an input field is compared on the newest ``examine`` jobs, read backwards along the
  primary key (ids are UUIDv7, so newest first): a bounded scan, since no index covers
  inputs (one would cost every enqueue).

Pages continue strictly after the previous page's last ``(time, id)``; the redundant
bound on the time alone lets the index start at the cursor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pgwork.postgres.sql.fragments import job_columns

__all__ = ["WorkViewStatements"]

# The (queue, priority) pairs of pending jobs, by a skip scan of jobs_acquire_idx.
_LANES = """
WITH RECURSIVE lanes AS (
    (SELECT j.queue, j.priority
     FROM {jobs} AS j
     WHERE j.status = 'pending'
       AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
     ORDER BY j.queue, j.priority
     LIMIT 1)
    UNION ALL
    SELECT n.queue, n.priority
    FROM lanes AS l
    CROSS JOIN LATERAL (
        SELECT j.queue, j.priority
        FROM {jobs} AS j
        WHERE j.status = 'pending'
          AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
          AND (j.queue, j.priority) > (l.queue, l.priority)
        ORDER BY j.queue, j.priority
        LIMIT 1
    ) AS n
)"""


def _after(column: str, oldest_first: bool) -> str:
    op = ">" if oldest_first else "<"
    return f"""(%(after_at)s::timestamptz IS NULL
           OR (j.{column} {op}= %(after_at)s::timestamptz
               AND (j.{column}, j.id) {op} (%(after_at)s::timestamptz, %(after_id)s::uuid)))"""


def _order(column: str, oldest_first: bool, alias: str = "j") -> str:
    way = "ASC" if oldest_first else "DESC"
    return f"{alias}.{column} {way}, {alias}.id {way}"


def _waiting(due: str, oldest_first: bool) -> str:
    return f"""{_LANES}
SELECT {job_columns("j")}
FROM lanes AS l
CROSS JOIN LATERAL (
    SELECT j.*
    FROM {{jobs}} AS j
    WHERE j.status = 'pending'
      AND j.queue = l.queue
      AND j.priority = l.priority
      AND j.scheduled_at {due} now()
      AND {_after("scheduled_at", oldest_first)}
    ORDER BY {_order("scheduled_at", oldest_first)}
    LIMIT %(limit)s
) AS j
ORDER BY {_order("scheduled_at", oldest_first)}
LIMIT %(limit)s
"""


def _running(oldest_first: bool) -> str:
    return f"""
SELECT {job_columns("j")}
FROM {{jobs}} AS j
WHERE j.status = 'running'
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
  AND (%(leased_by)s::text IS NULL OR j.leased_by = %(leased_by)s::text)
  AND {_after("started_at", oldest_first)}
ORDER BY {_order("started_at", oldest_first)}
LIMIT %(limit)s
"""


# The job types of failed jobs, by a skip scan of jobs_attention_idx.
_FAILED_LANES = """
WITH RECURSIVE lanes AS (
    (SELECT j.type_name
     FROM {jobs} AS j
     WHERE j.status = 'failed'
     ORDER BY j.type_name
     LIMIT 1)
    UNION ALL
    SELECT n.type_name
    FROM lanes AS l
    CROSS JOIN LATERAL (
        SELECT j.type_name
        FROM {jobs} AS j
        WHERE j.status = 'failed' AND j.type_name > l.type_name
        ORDER BY j.type_name
        LIMIT 1
    ) AS n
)"""


def _failed(oldest_first: bool) -> str:
    """Failed jobs per type (jobs_attention_idx orders each type by ``created_at``),
    merged. The queue and error filters are checked row by row within a type: failed
    jobs are few, and a filter that matches none reads them, never the table."""
    return f"""{_FAILED_LANES}
SELECT {job_columns("j")}
FROM lanes AS l
CROSS JOIN LATERAL (
    SELECT j.*
    FROM {{jobs}} AS j
    WHERE j.status = 'failed'
      AND j.type_name = l.type_name
      AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
      AND (%(error_type)s::text IS NULL
           OR COALESCE(j.last_attempt_error ->> 'type', '') = %(error_type)s::text)
      AND (%(error_message)s::text IS NULL
           OR COALESCE(j.last_attempt_error ->> 'message', '') = %(error_message)s::text)
      AND {_after("created_at", oldest_first)}
    ORDER BY {_order("created_at", oldest_first)}
    LIMIT %(limit)s
) AS j
ORDER BY {_order("created_at", oldest_first)}
LIMIT %(limit)s
"""


# One statement per (status, order): each planned for its own index.
LISTINGS = {
    f"{status}:{'oldest' if oldest_first else 'newest'}": text
    for oldest_first in (True, False)
    for status, text in (
        ("ready", _waiting("<=", oldest_first)),
        ("scheduled", _waiting(">", oldest_first)),
        ("running", _running(oldest_first)),
        ("failed", _failed(oldest_first)),
    )
}

# Each worker's running jobs: how many, and the first ``per_worker`` it started. The
# running rows are grouped by worker on (leased_by, started_at, id) alone, keeping the
# ids of each worker's first ``per_worker``; only those are read whole, by primary key.
# A page of workers receives workers x per_worker rows, not every job they run (which
# the dashboard would decode one by one).
RUNNING_BY_WORKER = f"""
SELECT h.held, {job_columns("j")}
FROM (
    SELECT r.leased_by, count(*) AS held,
           (array_agg(r.id ORDER BY r.started_at, r.id))[1:%(per_worker)s] AS first
    FROM {{jobs}} AS r
    WHERE r.status = 'running'
    GROUP BY r.leased_by
) AS h
CROSS JOIN LATERAL unnest(h.first) AS f(id)
JOIN {{jobs}} AS j ON j.id = f.id
ORDER BY j.leased_by, j.started_at, j.id
"""

# The types among the oldest ``sample`` ready jobs of each lane. A type no worker takes
# stays ready while younger jobs are taken, so it gathers at the old end of its lane:
# this sample finds it without reading the whole queue.
PENDING_TYPES = f"""{_LANES}
SELECT l.queue, s.type_name, count(*), min(s.scheduled_at)
FROM lanes AS l
CROSS JOIN LATERAL (
    SELECT j.type_name, j.scheduled_at
    FROM {{jobs}} AS j
    WHERE j.status = 'pending'
      AND j.queue = l.queue
      AND j.priority = l.priority
      AND j.scheduled_at <= now()
    ORDER BY j.scheduled_at
    LIMIT %(sample)s
) AS s
GROUP BY l.queue, s.type_name
ORDER BY l.queue, s.type_name
"""

# The newest ``sample`` failed jobs (jobs_attention_idx), grouped by their last error.
ERROR_GROUPS = """
SELECT e.error_type, e.message, count(*), array_agg(DISTINCT e.queue ORDER BY e.queue),
       max(e.created_at)
FROM (
    SELECT COALESCE(j.last_attempt_error ->> 'type', '') AS error_type,
           COALESCE(j.last_attempt_error ->> 'message', '') AS message,
           j.queue, j.created_at
    FROM {jobs} AS j
    WHERE j.status = 'failed'
    ORDER BY j.created_at DESC
    LIMIT %(sample)s
) AS e
GROUP BY e.error_type, e.message
ORDER BY count(*) DESC, max(e.created_at) DESC
LIMIT %(limit)s
"""

# An id prefix as a range of the primary key.
JOBS_IN_ID_RANGE = f"""
SELECT {job_columns("j")}
FROM {{jobs}} AS j
WHERE j.id >= %(low)s::uuid AND j.id <= %(high)s::uuid
ORDER BY j.id
LIMIT %(limit)s
"""


# An input field compared on a bounded window of the newest jobs. The window is read
# along the primary key backwards from ``before`` and numbered as it is read; a job's
# input is fetched and compared only if its type is the one searched (``AND`` stops at
# the first false operand). One row past the window is read, only to tell whether
# older jobs remain. The summary (how many jobs were looked at, the oldest of them,
# whether any is older) comes with every match, or alone when none matched.
INPUT_SCAN = f"""
WITH examined AS MATERIALIZED (
    SELECT j.id, j.created_at, row_number() OVER (ORDER BY j.id DESC) AS n,
           (j.type_name = %(type_name)s::text
            AND j.input #> %(path)s::text[] = %(value)s::jsonb) AS hit
    FROM {{jobs}} AS j
    WHERE j.id < %(before)s::uuid
    ORDER BY j.id DESC
    LIMIT %(examine)s::int + 1
),
hits AS (
    SELECT e.id, e.n FROM examined AS e
    WHERE e.hit AND e.n <= %(examine)s::int
    ORDER BY e.id DESC
    LIMIT %(limit)s
)
SELECT COALESCE(w.n, 0), w.created_at, w.id,
    EXISTS (SELECT 1 FROM examined AS e WHERE e.n > %(examine)s::int), h.n, {job_columns("j")}
FROM (SELECT 1) AS one
LEFT JOIN (
    SELECT e.n, e.created_at, e.id FROM examined AS e
    WHERE e.n <= %(examine)s::int
    ORDER BY e.n DESC
    LIMIT 1
) AS w ON true
LEFT JOIN (hits AS h JOIN {{jobs}} AS j ON j.id = h.id) ON true
ORDER BY h.id DESC
"""


@dataclass(frozen=True, slots=True)
class WorkViewStatements:
    """``listings`` are keyed ``<status>:<order>`` (order ``oldest`` or ``newest``)."""

    listings: Mapping[str, bytes]
    running_by_worker: bytes
    pending_types: bytes
    error_groups: bytes
    jobs_in_id_range: bytes
    input_scan: bytes
