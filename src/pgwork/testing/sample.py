"""A week of job history written straight into pgwork's tables, for trying reads at scale.

A test of a query plan, an index or a dashboard page needs a table the size of a busy
deployment's, and enqueueing a million jobs through the client would take minutes: these
statements make them server-side with ``generate_series``, a few seconds per million.
The rows are what pgwork itself writes (UUIDv7 ids of their creation time, chains,
blocker edges, workers), so the planner sees the shape a real table has.
"""

from __future__ import annotations

from psycopg import sql

from pgwork.postgres.schema import DEFAULT_SCHEMA

__all__ = ["sample_statements", "uuid7_sql"]


def uuid7_sql(moment: str) -> str:
    """SQL (PostgreSQL 13+) for a UUIDv7 of the timestamp expression ``moment`` with
    random bits, as pgwork makes its ids: rows generated server-side keep the primary
    key in time order, which job listings read newest first.

    ``moment`` is pasted into the SQL as it stands: a column or an expression of the
    caller's statement, never a value from outside it.
    """
    return f"""encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
               placing substring(int8send(floor(extract(epoch FROM {moment})
                   * 1000)::bigint) FROM 3) FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid"""


# One row per job, in creation order over the last week; ``g`` numbers them (the newest
# is ``jobs - 1``). Status by ``g % 1000``: 1% failed, 0.5% blocked, 0.1% running, 4%
# pending (half of them scheduled for later), 2% cancelled, the rest completed.
_JOBS = f"""
INSERT INTO {{jobs}} (
    id, type_name, chain_id, chain_type_name, chain_index, input, output, status, queue,
    priority, created_at, scheduled_at, started_at, completed_at, attempt, max_attempts,
    last_attempt_error, last_attempt_at, leased_by, leased_until, chain_status,
    chain_completed_at, dedup_key
)
SELECT u, t, u, t, 0,
       jsonb_build_object('n', g, 'email', 'user' || g || '@example.com'),
       CASE WHEN s = 'completed' THEN jsonb_build_object('sent', true) END,
       s::{{job_status}}, q, 0, created, scheduled,
       CASE WHEN s NOT IN ('pending', 'blocked') THEN scheduled END,
       CASE WHEN s IN ('completed', 'failed', 'cancelled') THEN scheduled + interval '2 s' END,
       CASE WHEN s IN ('pending', 'blocked') THEN 0 WHEN s = 'failed' THEN 3 ELSE 1 END,
       3,
       CASE WHEN s = 'failed' THEN jsonb_build_object(
           'type', 'TimeoutError', 'message', 'upstream timed out after 30 s (job ' || g || ')',
           'traceback', 'Traceback (most recent call last):\n  File "app.py", line 1\n')
       END,
       CASE WHEN s NOT IN ('pending', 'blocked') THEN scheduled END,
       CASE WHEN s = 'running' THEN 'sample-worker-' || (g % 4) END,
       CASE WHEN s = 'running' THEN now() + interval '1 minute' END,
       CASE WHEN s IN ('pending', 'running', 'blocked') THEN 'active' ELSE s END
           ::{{chain_status}},
       CASE WHEN s IN ('completed', 'failed', 'cancelled') THEN scheduled + interval '2 s' END,
       CASE WHEN g % 100 = 0 THEN 'key-' || g END
FROM (
    SELECT g, {uuid7_sql("created")} AS u, t, q, s, created,
           CASE WHEN s = 'pending' AND g % 2 = 0 THEN now() + interval '1 hour'
                ELSE created END AS scheduled
    FROM (
        SELECT g,
               'sample.' || (ARRAY['email', 'resize', 'report', 'sync', 'charge', 'export',
                                  'notify', 'index'])[1 + g % 8] AS t,
               (ARRAY['default', 'mail', 'reports', 'slow'])[1 + (g / 7) % 4] AS q,
               CASE WHEN g % 1000 < 10 THEN 'failed'
                    WHEN g % 1000 < 15 THEN 'blocked'
                    WHEN g % 1000 = 15 THEN 'running'
                    WHEN g % 1000 < 56 THEN 'pending'
                    WHEN g % 1000 < 76 THEN 'cancelled'
                    ELSE 'completed' END AS s,
               now() - (%(jobs)s - g) * (interval '7 days' / %(jobs)s) AS created
        FROM generate_series(0, %(jobs)s - 1) AS g
    ) AS numbered
) AS rows
"""

# A second job for one completed chain in ten (its continuation, completed too).
_CONTINUATIONS = f"""
INSERT INTO {{jobs}} (
    id, type_name, chain_id, chain_type_name, chain_index, input, output, status, queue,
    created_at, scheduled_at, started_at, completed_at, attempt, max_attempts
)
SELECT {uuid7_sql("r.created_at + interval '1 s'")}, r.type_name || '.next', r.id,
       r.type_name, 1, '{{{{}}}}',
       '{{{{"done": true}}}}', 'completed', r.queue, r.created_at + interval '1 s',
       r.created_at + interval '1 s', r.created_at + interval '1 s', r.completed_at, 1, 3
FROM {{jobs}} AS r
WHERE r.status = 'completed' AND r.chain_index = 0 AND get_byte(uuid_send(r.id), 15) < 26
"""

# Each blocked job waits for one pending chain.
_BLOCKERS = """
INSERT INTO {job_blockers} (job_id, blocker_chain_id, position)
SELECT d.id, b.id, 0
FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM {jobs}
      WHERE status = 'blocked') AS d
JOIN (SELECT id, row_number() OVER (ORDER BY id) AS n FROM {jobs}
      WHERE status = 'pending' AND chain_index = 0) AS b ON b.n = d.n
"""

_WORKERS = """
INSERT INTO {workers} (id, host, pid, queues, job_types, max_slots, active_slots, status,
                       started_at, heartbeat_at)
SELECT 'sample-worker-' || w, 'host-' || (w % 2), 1000 + w, ARRAY['default', 'mail'],
       ARRAY['sample.email'], 16, w % 16, CASE WHEN w < 4 THEN 'busy' ELSE 'stopped' END,
       now() - interval '2 hours', CASE WHEN w < 4 THEN now() ELSE now() - interval '1 hour' END
FROM generate_series(0, 5) AS w
"""


def sample_statements(*, jobs: int, schema: str = DEFAULT_SCHEMA) -> list[sql.Composed]:
    """The statements that fill ``schema`` (migrated, empty) with ``jobs`` chains made
    over the last week, ready for ``execute`` on an autocommit connection, in order.

    By ``n % 1000`` of the job numbered ``n``: 1% failed, 0.5% blocked (each on a
    pending chain), 0.1% running (leased by ``sample-worker-0`` to ``-3``), 4% pending
    (half of them scheduled an hour ahead), 2% cancelled, the rest completed. Eight
    types (``sample.email``, ``sample.resize``, ...), four queues (``default``, ``mail``,
    ``reports``, ``slow``), a continuation for one completed chain in ten, a dedup key
    for one job in a hundred, six workers (four busy, two stopped); the tables are
    vacuumed and analyzed last, as a table that has lived a week would be.
    """
    names = {
        "jobs": sql.Identifier(schema, "jobs"),
        "job_blockers": sql.Identifier(schema, "job_blockers"),
        "workers": sql.Identifier(schema, "workers"),
        "job_status": sql.Identifier(schema, "job_status"),
        "chain_status": sql.Identifier(schema, "chain_status"),
    }
    count = sql.Literal(jobs)
    return [
        sql.SQL(_JOBS.replace("%(jobs)s", "{count}")).format(count=count, **names),
        sql.SQL(_CONTINUATIONS).format(**names),
        sql.SQL(_BLOCKERS).format(**names),
        sql.SQL(_WORKERS).format(**names),
        sql.SQL("VACUUM (ANALYZE) {jobs}").format(**names),
        sql.SQL("VACUUM (ANALYZE) {job_blockers}").format(**names),
    ]
