"""SQL of the read side: listings, counts, deletion and retention.

Optional filters are written ``(%(x)s IS NULL OR ...)``; the adapter sends these
statements unprepared, so each is planned with its actual parameters and a NULL filter
folds away, leaving the planner free to pick the partial index the remaining filters
match.

Job listings are newest first by id: ids are UUIDv7, so the primary key reads them in
the order they were made (migration 0006 dropped the creation-time index this took
before). Chain and blocked-job listings are newest first by ``(created_at, id)``, read
from their partial indexes. A page continues strictly after the previous page's last row
(``after_id``, and ``after_at`` where the order starts with ``created_at``: the
redundant ``created_at <= after_at`` lets the index start at the cursor).
"""

from __future__ import annotations

from dataclasses import dataclass

from pgwork.postgres._names import validate_schema_name
from pgwork.postgres.sql.fragments import first_edges, in_chain, job_columns, last_job
from pgwork.postgres.sql.history import count_into_history, ended_row
from pgwork.retention import AWAITED_HOLD

__all__ = ["QueryStatements", "retention_lock_key"]

# A job that may still run (a failed one can be retried) and then reads its blockers'
# outputs: while one exists, the chains it waits for are kept.
_MAY_STILL_RUN = "('blocked', 'pending', 'running', 'failed')"

# ``created_since_id`` is the smallest id made an hour before ``created_after``: a job's
# id is made by the enqueuing process just before its insert, so unless that machine's
# clock is an hour behind the database's, every job created after ``created_after``
# has a larger id, and the range of the primary key read is bounded by it (the filter
# on ``created_at`` itself still decides). ``created_before`` has no such bound: a
# transaction may insert long after it began, which ``created_at`` (its start) records.
LIST_JOBS = f"""
SELECT {job_columns("j")}
FROM {{jobs}} AS j
WHERE (%(type_name)s::text IS NULL OR j.type_name = %(type_name)s::text)
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
  AND (%(status)s::{{job_status}} IS NULL OR j.status = %(status)s::{{job_status}})
  AND (%(chain_id)s::uuid IS NULL OR {in_chain("j", "%(chain_id)s::uuid")})
  AND (%(created_after)s::timestamptz IS NULL
       OR (j.created_at > %(created_after)s::timestamptz
           AND j.id >= %(created_since_id)s::uuid))
  AND (%(created_before)s::timestamptz IS NULL
       OR j.created_at < %(created_before)s::timestamptz)
  AND (%(after_id)s::uuid IS NULL OR j.id < %(after_id)s::uuid)
ORDER BY j.id DESC
LIMIT %(limit)s
"""

# The filters of a chain listing on root rows ``r`` within one (type, status) range.
_CHAIN_RANGE = """
          AND r.chain_type_name = t.name
          AND r.chain_status = s.status
          AND (%(created_after)s::timestamptz IS NULL
               OR r.created_at > %(created_after)s::timestamptz)
          AND (%(created_before)s::timestamptz IS NULL
               OR r.created_at < %(created_before)s::timestamptz)
          AND (%(dedup_key)s::text IS NULL OR r.dedup_key = %(dedup_key)s::text)
          AND (%(after_at)s::timestamptz IS NULL
               OR (r.created_at <= %(after_at)s::timestamptz
                   AND (r.created_at, r.id) < (%(after_at)s::timestamptz, %(after_id)s::uuid)))
        ORDER BY r.created_at DESC, r.id DESC
        LIMIT %(limit)s"""

# Chains come from jobs_chains_idx (chain_type_name, chain_status, created_at, id) over
# root rows, except roots that are running: those are among the running jobs, the few
# rows of jobs_lease_expiry_idx (at most the workers' slots), read once
# (``running_roots``) and listed beside it (migration 0006). Without a type filter the
# chain types present are found by skipping through that index (one probe per type),
# plus the running roots' types; then each (type, status) range is read newest first
# in page order (``id`` breaks ties of ``created_at``, migration 0010), at most
# ``limit`` keys each from the index alone, and the ranges merged; only the page's rows
# are read whole, each by primary key (a lateral read: never a hash of the table). A
# page costs probes proportional to types x statuses x limit, whatever the table size
# and however many chains one transaction enqueued. A dedup key narrows each range to
# jobs_dedup_idx. (No queue filter: no index has the queue of finished chains, and a
# filter checked row by row reads a whole range when nothing matches.)
LIST_CHAINS = f"""
WITH RECURSIVE present_types AS (
    (SELECT r.chain_type_name AS name
     FROM {{jobs}} AS r
     WHERE r.id = r.chain_id AND r.status <> 'running' AND %(type_name)s::text IS NULL
     ORDER BY r.chain_type_name
     LIMIT 1)
    UNION ALL
    SELECT (SELECT r.chain_type_name
            FROM {{jobs}} AS r
            WHERE r.id = r.chain_id AND r.status <> 'running' AND r.chain_type_name > t.name
            ORDER BY r.chain_type_name
            LIMIT 1)
    FROM present_types AS t
    WHERE t.name IS NOT NULL
),
running_roots AS MATERIALIZED (
    SELECT r.*
    FROM {{jobs}} AS r
    WHERE r.status = 'running' AND r.id = r.chain_id
),
type_names AS (
    SELECT name FROM present_types WHERE name IS NOT NULL
    UNION
    SELECT r.chain_type_name FROM running_roots AS r WHERE %(type_name)s::text IS NULL
    UNION
    SELECT %(type_name)s::text WHERE %(type_name)s::text IS NOT NULL
),
page_keys AS (
    SELECT c.created_at, c.id
    FROM type_names AS t
    CROSS JOIN unnest(%(statuses)s::{{chain_status}}[]) AS s(status)
    CROSS JOIN LATERAL (
        (SELECT r.created_at, r.id
        FROM {{jobs}} AS r
        WHERE r.id = r.chain_id AND r.status <> 'running'{_CHAIN_RANGE})
        UNION ALL
        (SELECT r.created_at, r.id
        FROM running_roots AS r
        WHERE true{_CHAIN_RANGE})
    ) AS c
    ORDER BY c.created_at DESC, c.id DESC
    LIMIT %(limit)s
),
page AS (
    SELECT r.*
    FROM page_keys AS k
    CROSS JOIN LATERAL (SELECT r.* FROM {{jobs}} AS r WHERE r.id = k.id LIMIT 1) AS r
)
SELECT p.chain_status::text, p.chain_completed_at, {job_columns("p")}, {job_columns("cur")}
FROM page AS p
CROSS JOIN LATERAL {last_job("p")} AS cur
ORDER BY p.created_at DESC, p.id DESC
"""

# Blocked jobs are few (jobs_attention_idx); each comes with its blockers in declaration
# order and their chain status (NULL: the blocker chain was deleted).
# Blocked jobs, newest first, each with its counters and its first %(edges)s edges by
# position (job_blockers_position_idx): a page reads at most that many edges a job,
# whatever the number of chains a job waits for (a step may wait for 10,000 children).
LIST_BLOCKED_JOBS = f"""
SELECT {job_columns("j")}, j.blockers_needed, j.blockers_met, j.blockers_open,
    blk.chain_ids, blk.statuses
FROM (
    SELECT b.*
    FROM {{jobs}} AS b
    WHERE b.status = 'blocked'
      AND (%(after_at)s::timestamptz IS NULL
           OR (b.created_at <= %(after_at)s::timestamptz
               AND (b.created_at, b.id) < (%(after_at)s::timestamptz, %(after_id)s::uuid)))
    ORDER BY b.created_at DESC, b.id DESC
    LIMIT %(limit)s
) AS j
CROSS JOIN LATERAL (
    SELECT array_agg(f.blocker_chain_id ORDER BY f.position) AS chain_ids,
           array_agg(r.chain_status::text ORDER BY f.position) AS statuses
    FROM {first_edges("j", "%(edges)s")} AS f
    LEFT JOIN {{jobs}} AS r ON r.id = f.blocker_chain_id AND r.id = r.chain_id
) AS blk
ORDER BY j.created_at DESC, j.id DESC
"""

# One job's edges by position, strictly after ``after`` (job_blockers_position_idx),
# with each chain's status.
LIST_BLOCKERS = """
SELECT e.position, e.blocker_chain_id, r.chain_status::text
FROM {job_blockers} AS e
LEFT JOIN {jobs} AS r ON r.id = e.blocker_chain_id AND r.id = r.chain_id
WHERE e.job_id = %(job_id)s::uuid
  AND (%(after)s::int IS NULL OR e.position > %(after)s::int)
ORDER BY e.position
LIMIT %(limit)s
"""

# Unfinished work per queue, each status read through its partial index (pending from
# jobs_acquire_idx alone); queues known only from the queues table show up with zeros.
COUNT_JOBS = """
WITH pending AS (
    SELECT j.queue,
           count(*) FILTER (WHERE j.scheduled_at <= now()) AS ready,
           count(*) FILTER (WHERE j.scheduled_at > now()) AS scheduled,
           min(j.scheduled_at) FILTER (WHERE j.scheduled_at <= now()) AS oldest_ready_at
    FROM {jobs} AS j
    WHERE j.status = 'pending'
    GROUP BY j.queue
),
running AS (
    SELECT j.queue, count(*) AS running
    FROM {jobs} AS j
    WHERE j.status = 'running'
    GROUP BY j.queue
),
attention AS (
    SELECT j.queue,
           count(*) FILTER (WHERE j.status = 'blocked') AS blocked,
           count(*) FILTER (WHERE j.status = 'failed') AS failed
    FROM {jobs} AS j
    WHERE j.status IN ('failed', 'blocked')
    GROUP BY j.queue
),
names AS (
    SELECT queue AS name FROM pending
    UNION SELECT queue FROM running
    UNION SELECT queue FROM attention
    UNION SELECT name FROM {queues}
)
SELECT n.name, COALESCE(q.paused, false), COALESCE(p.ready, 0), COALESCE(p.scheduled, 0),
       COALESCE(r.running, 0), COALESCE(a.blocked, 0), COALESCE(a.failed, 0),
       p.oldest_ready_at, now() - p.oldest_ready_at
FROM names AS n
LEFT JOIN pending AS p ON p.queue = n.name
LEFT JOIN running AS r ON r.queue = n.name
LEFT JOIN attention AS a ON a.queue = n.name
LEFT JOIN {queues} AS q ON q.name = n.name
ORDER BY n.name
"""

# Deleting chains starts by locking their roots: enqueueing a job blocked on a chain
# locks that root row too (see ``chains``), so from here on no new dependant
# can appear, and the next statement sees every one that committed.
LOCK_CHAINS = """
SELECT r.id
FROM {jobs} AS r
WHERE r.id = ANY(%(ids)s::uuid[]) AND r.id = r.chain_id
ORDER BY r.id
FOR UPDATE
"""

FIND_DEPENDANTS = f"""
SELECT e.blocker_chain_id, d.id, d.chain_id
FROM {{job_blockers}} AS e
JOIN {{jobs}} AS d ON d.id = e.job_id
WHERE e.blocker_chain_id = ANY(%(ids)s::uuid[])
  AND d.status IN {_MAY_STILL_RUN}
  AND d.chain_id <> ALL(%(excluded)s::uuid[])
ORDER BY e.blocker_chain_id, d.id
"""

# Every job of the chains; their own blocker edges go with them (ON DELETE CASCADE).
DELETE_CHAINS = f"""
WITH gone AS (
    DELETE FROM {{jobs}} AS j
    WHERE {in_chain("j", "ANY(%(ids)s::uuid[])")}
    RETURNING j.id, j.chain_id
)
SELECT count(*) FILTER (WHERE id = chain_id), count(*) FROM gone
"""

# One retention sweep per schema at a time; whoever does not get the lock skips. The
# sweep's transaction runs without JIT compilation: its delete of thousands of ids by
# primary key is estimated above ``jit_above_cost``, and compiling it would cost more
# than running it (``python -m bench.retention``).
TRY_RETENTION_LOCK = """
SELECT pg_try_advisory_xact_lock(hashtextextended(%(key)s::text, 0)),
       set_config('jit', 'off', true)
"""

# Ended chains past their type's retention for how they ended (one range of
# jobs_chains_idx per type and ending, ``p``), oldest first within each. A chain ends
# after it starts, so ``created_at`` before the cutoff bounds the range read. A chain
# cancelled while its root still runs waits for that job to end (a running root is not
# in that index). Locked with SKIP LOCKED: a chain someone is changing waits for the
# next sweep. Kept whatever their period (``pgwork.retention``): a chain with
# dependants that may still run (only a root flagged as having had some,
# ``chain_has_dependants``, set in the transaction that adds one, is looked up among
# the edges); one whose dedup window is still open (``dedup_until``), so that the key
# still deduplicates; and one awaited (``chain_awaited``) that ended less than
# AWAITED_HOLD ago, so that an awaiter that missed the end's notice reads the outcome.
_AWAITED_HOLD_S = AWAITED_HOLD.total_seconds()
LOCK_EXPIRED_CHAINS = f"""
SELECT e.id
FROM unnest(%(type_names)s::text[], %(endings)s::text[], %(seconds)s::float8[])
    AS p(type_name, ending, seconds)
CROSS JOIN LATERAL (
    SELECT r.id
    FROM {{jobs}} AS r
    WHERE r.id = r.chain_id
      AND r.status <> 'running'
      AND r.chain_type_name = p.type_name
      AND r.chain_status = p.ending::{{chain_status}}
      AND r.created_at < now() - p.seconds * interval '1 second'
      AND r.chain_completed_at < now() - p.seconds * interval '1 second'
      AND (r.dedup_until IS NULL OR r.dedup_until < now())
      AND (NOT r.chain_awaited
           OR r.chain_completed_at < now() - {_AWAITED_HOLD_S!r} * interval '1 second')
      AND (NOT r.chain_has_dependants OR NOT EXISTS (
          SELECT 1
          FROM {{job_blockers}} AS e
          JOIN {{jobs}} AS d ON d.id = e.job_id
          WHERE e.blocker_chain_id = r.id
            AND d.chain_id <> r.id
            AND d.status IN {_MAY_STILL_RUN}
      ))
    LIMIT %(limit)s
    FOR UPDATE OF r SKIP LOCKED
) AS e
LIMIT %(limit)s
"""

# The history's progress row, locked before retention deletes anything: a rollup in
# progress finishes first, and none starts until this sweep commits (see
# ``history``).
LOCK_HISTORY_PROGRESS = """
SELECT 1 FROM {job_history_progress} FOR UPDATE
"""

# Runs after LOCK_EXPIRED_CHAINS, under a fresh snapshot: a dependant enqueued between
# that statement's snapshot and its lock is seen here, and its blocker kept. The jobs
# to delete are found by index, the roots by primary key and their continuations in
# jobs_chain_idx, and deleted by primary key: a condition over thousands of ids that
# ORs the two (``in_chain``) is read as a scan of the whole table. The jobs deleted
# that ended at or after the history's progress, which no rollup has counted yet, are
# counted into the history here (under LOCK_HISTORY_PROGRESS): the history keeps every
# ended job whichever of the two reaches it first.
DELETE_EXPIRED_CHAINS = f"""
WITH doomed AS (
    SELECT r.id
    FROM {{jobs}} AS r
    WHERE r.id = ANY(%(ids)s::uuid[]) AND r.id = r.chain_id
      AND (NOT r.chain_has_dependants OR NOT EXISTS (
          SELECT 1
          FROM {{job_blockers}} AS e
          JOIN {{jobs}} AS d ON d.id = e.job_id
          WHERE e.blocker_chain_id = r.id
            AND d.chain_id <> r.id
            AND d.status IN {_MAY_STILL_RUN}
      ))
), members AS (
    SELECT x.id FROM doomed AS x
    UNION ALL
    SELECT c.id
    FROM doomed AS x
    JOIN {{jobs}} AS c ON c.chain_id = x.id AND c.id <> c.chain_id
), gone AS (
    DELETE FROM {{jobs}} AS j
    WHERE j.id = ANY(ARRAY(SELECT m.id FROM members AS m))
    RETURNING j.id, j.chain_id, j.queue, j.type_name, j.status, j.scheduled_at,
        j.started_at, j.completed_at, j.attempt
), uncounted AS (
    SELECT {ended_row("g")}
    FROM gone AS g
    WHERE g.status IN ('completed', 'failed')
      AND g.completed_at >= (SELECT p.rolled_up_to FROM {{job_history_progress}} AS p)
), counted AS ({count_into_history("uncounted", "%(widths)s::int[]")}
)
SELECT count(*) FILTER (WHERE id = chain_id), (SELECT count(*) FROM counted) FROM gone
"""


GET_JOBS = f"""
SELECT {job_columns("j")}
FROM {{jobs}} AS j
WHERE j.id = ANY(%(ids)s::uuid[])
"""

LIST_CHAIN_JOBS = f"""
SELECT {job_columns("j")}
FROM {{jobs}} AS j
WHERE {in_chain("j", "%(chain_id)s::uuid")}
ORDER BY j.chain_index
"""

GET_CHAINS = f"""
SELECT r.chain_status::text, r.chain_completed_at, {job_columns("r")}, {job_columns("cur")}
FROM {{jobs}} AS r
CROSS JOIN LATERAL {last_job("r")} AS cur
WHERE r.id = ANY(%(ids)s::uuid[]) AND r.id = r.chain_id
"""


@dataclass(frozen=True, slots=True)
class QueryStatements:
    get_jobs: bytes
    list_chain_jobs: bytes
    get_chains: bytes
    list_jobs: bytes
    list_chains: bytes
    list_blocked_jobs: bytes
    list_blockers: bytes
    count_jobs: bytes
    lock_chains: bytes
    find_dependants: bytes
    delete_chains: bytes
    try_retention_lock: bytes
    lock_expired_chains: bytes
    lock_history_progress: bytes
    delete_expired_chains: bytes


def retention_lock_key(schema: str) -> str:
    """The text TRY_RETENTION_LOCK hashes: one sweep lock per schema."""
    return f"pgwork.retention:{validate_schema_name(schema)}"
