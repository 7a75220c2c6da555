"""SQL of leases: acquire jobs, find the next due one, open an atomic attempt, renew
(in line when a caller holds the row), hand jobs back, reap expired leases.

Every write on behalf of an attempt is fenced by ``(id, lease_token)`` and the running
status.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgwork.postgres.sql.fragments import appended_history

__all__ = ["ACQUIRED_WIDTH", "LEASE_LINE_LOCK", "LeaseStatements"]

# The first key of a job's lease-line lock (a two-key advisory lock; the second key is
# the job id's hash): "pgwr" read as an int4. PostgreSQL keeps two-key advisory locks
# apart from the one-key ones pgwork takes elsewhere (dedup keys, retention).
LEASE_LINE_LOCK = 0x70677772


# The second half of every acquire statement: lease the chosen candidates, each for
# its own type's duration. A candidate is found again by the row version its lock
# returned (``ctid``, a TID scan: one page read) rather than by its id (a primary-key
# probe, three or four page reads a job): the candidate is locked, so that version is
# its last until this statement's commit; ``j.id = c.id`` makes sure the version found
# is the candidate's. But when a candidate's row was updated and committed after this
# statement's snapshot and before its lock (marking the chain awaited, enqueueing a
# job blocked on it), the lock followed the update to a version the snapshot cannot
# see, and the TID scan finds no row: the job is locked but not leased, and pending
# again at commit. Then, and only then, the statement adds one row of NULLs after the
# leased ones (``missed``), and the adapter acquires again (``_state_worker``): left
# unsaid, the worker took the short acquire for a drained queue and the job waited for
# its next poll. A second ``UPDATE`` in the statement leasing the missed candidates by
# id did the same but cost its initialisation on every execution (server CPU every
# turn, and planning without a cached plan) for a race that needs a write to a
# pending row at the very moment it is acquired.
LEASES = """
leases AS (
    SELECT * FROM unnest(%(type_names)b::text[], %(lease_seconds)b::float8[])
        AS l(type_name, seconds)
)"""

_LEASE = """
    UPDATE {jobs} AS j
    SET status = 'running',
        attempt = j.attempt + 1,
        leased_by = %(worker_id)s,
        lease_token = gen_random_uuid(),
        leased_until = now() + l.seconds * interval '1 second',
        started_at = COALESCE(j.started_at, now())
    FROM candidates AS c, leases AS l
    WHERE j.ctid = c.ctid AND j.id = c.id AND l.type_name = j.type_name
    RETURNING j.id, j.type_name, j.chain_id, j.chain_type_name, j.chain_index,
        j.input::text, j.queue, j.priority, j.attempt, j.max_attempts, j.lease_token,
        j.leased_until, j.created_at, j.scheduled_at, j.last_attempt_error,
        j.trace_context, j.started_at, j.last_attempt_at, j.dedup_key, j.context, j.limit_key
"""

LEASED = f"""
leased AS ({_LEASE})"""

# Columns of an acquired row (``_rows.acquired_from_row``): a handler sees every field
# ``get_job`` returns, so the acquire hands them all back.
ACQUIRED_WIDTH = 21

# The leased rows, then the ``missed`` marker (a row whose id is NULL) when the lease
# found fewer candidates than were locked.
LEASE_CANDIDATES = f"""
SELECT * FROM leased
UNION ALL
SELECT {", ".join(["NULL"] * ACQUIRED_WIDTH)}
WHERE (SELECT count(*) FROM leased) < (SELECT count(*) FROM candidates)
"""

# Queues are drained in the order given (strictly), each on its own index range, so a
# deep low-priority queue never slows acquiring from a high-priority one. Rows locked
# beyond the outer LIMIT are released at commit, a few milliseconds later.
CANDIDATES_BY_QUEUE = """
candidates AS (
    SELECT c.id, c.ctid
    FROM unnest(%(queues)b::text[]) WITH ORDINALITY AS q(name, rank)
    CROSS JOIN LATERAL (
        SELECT j.id, j.ctid, j.priority, j.scheduled_at
        FROM {jobs} AS j
        WHERE j.status = 'pending'
          AND j.queue = q.name
          AND j.scheduled_at <= now()
          AND j.type_name = ANY(%(type_names)b::text[])
        ORDER BY j.priority, j.scheduled_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE NOT EXISTS (SELECT 1 FROM {queues} AS p WHERE p.name = q.name AND p.paused)
    ORDER BY q.rank, c.priority, c.scheduled_at
    LIMIT %(limit)s
)"""

ACQUIRE = f"WITH {CANDIDATES_BY_QUEUE},{LEASES},{LEASED}{LEASE_CANDIDATES}"

# ``queues=None``: any queue not paused, best priority then oldest first across all.
CANDIDATES_ANY_QUEUE = """
candidates AS (
    SELECT j.id, j.ctid
    FROM {jobs} AS j
    WHERE j.status = 'pending'
      AND j.scheduled_at <= now()
      AND j.type_name = ANY(%(type_names)b::text[])
      AND NOT EXISTS (SELECT 1 FROM {queues} AS p WHERE p.name = j.queue AND p.paused)
    ORDER BY j.priority, j.scheduled_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)"""

ACQUIRE_ANY_QUEUE = f"WITH {CANDIDATES_ANY_QUEUE},{LEASES},{LEASED}{LEASE_CANDIDATES}"

# When the next not-yet-due pending job becomes due. A loose index scan on
# jobs_acquire_idx (queue, priority, scheduled_at): for each queue, hop from one
# priority present to the next, and within each take the first row past now() less
# ``since`` (jobs due that recently count as due now: see StateAdapter.next_due). So it
# costs a few index probes per priority in use, however many jobs are scheduled.
NEXT_DUE = """
WITH RECURSIVE p AS (
    SELECT q.name, (
        SELECT min(j.priority) FROM {jobs} AS j WHERE j.status = 'pending' AND j.queue = q.name
    ) AS priority
    FROM unnest(%(queues)s::text[]) AS q(name)
    UNION ALL
    SELECT p.name, (
        SELECT min(j.priority) FROM {jobs} AS j
        WHERE j.status = 'pending' AND j.queue = p.name AND j.priority > p.priority
    )
    FROM p
    WHERE p.priority IS NOT NULL
)
SELECT extract(epoch FROM min(d.scheduled_at) - now())::float8
FROM p
CROSS JOIN LATERAL (
    SELECT j.scheduled_at
    FROM {jobs} AS j
    WHERE j.status = 'pending'
      AND j.queue = p.name
      AND j.priority = p.priority
      AND j.scheduled_at > now() - make_interval(secs => %(since)s::float8)
      AND j.type_name = ANY(%(type_names)s::text[])
    ORDER BY j.scheduled_at
    LIMIT 1
) AS d
WHERE p.priority IS NOT NULL
"""

# Opens an atomic attempt's transaction: checks that the lease still holds its job (its
# token, and not lapsed: another worker may reap a lapsed lease at any moment, so the
# handler must not start on it) and bounds the transaction on the server. The
# session-local idle timeout ends a transaction whose handler stopped talking to the
# database, even if the worker is stuck. The job's row is not locked: the worker renews
# the attempt's lease while its handler runs, as a staged attempt's, and the completion
# is fenced by the lease token and the status (so a caller cancelling or deleting the
# job does not wait for the handler, and the completion is refused after it). The status
# is compared as text on purpose: ``status = 'running'`` lets the planner read the row
# through the partial index of running jobs' leases (``jobs_lease_expiry_idx``, which
# the statistics show nearly empty) and filter it by id, walking every entry there, dead
# ones included: each job a drain finished leaves one until a vacuum, so the check grew
# with every job drained, where a primary key lookup stays flat
# (tests/plans/test_atomic_plans.py holds the plan). A predicate on ``status::text`` matches
# no index.
BEGIN_ATOMIC = """
SELECT j.id
FROM {jobs} AS j,
     (SELECT set_config('idle_in_transaction_session_timeout', %(idle_ms)s, true)) AS cfg(v)
WHERE j.id = %(job_id)s AND j.lease_token = %(lease_token)s AND j.status::text = 'running'
  AND j.leased_until > now()
"""

# BEGIN_ATOMIC for PostgreSQL 17 and later, bounded by transaction_timeout instead: set
# inside a transaction, that timer starts at once and only the transaction's end stops
# it, so this statement may travel in one pipeline with its BEGIN. The idle timer is
# armed only when the server sends ReadyForQuery, and disarmed by the next message it
# reads: psycopg's pipeline sends a Flush after its Sync, which left it disarmed.
BEGIN_ATOMIC_BOUNDED = BEGIN_ATOMIC.replace(
    "idle_in_transaction_session_timeout", "transaction_timeout"
)

# RENEW, FAIL, RESCHEDULE and RELEASE name their rows by id and test the status as
# text, as BEGIN_ATOMIC does and for the same reason: with ``status = 'running'`` the
# planner may read the partial index of running leases whole instead of the primary
# key, dead entries of every job drained since the last vacuum included.
RENEW = """
WITH r AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[], %(seconds)s::float8[])
        AS r(id, token, seconds)
),
-- A row another transaction holds (a caller cancelling, completing or just reading it
-- FOR UPDATE) is skipped, not waited on: one caller's lock must not hold up every
-- other lease of the worker. Its lease is reported ``deferred`` below.
held AS (
    SELECT j.id
    FROM {jobs} AS j, r
    WHERE j.id = r.id AND j.lease_token = r.token AND j.status::text = 'running'
    FOR NO KEY UPDATE OF j SKIP LOCKED
),
renewed AS (
    UPDATE {jobs} AS j
    SET leased_until = now() + r.seconds * interval '1 second'
    FROM r, held AS h
    WHERE j.id = h.id AND r.id = h.id AND j.lease_token = r.token
      AND j.status::text = 'running'
    RETURNING j.id, j.lease_token, j.leased_until
)
SELECT r.id, r.token, u.leased_until, j.status::text,
    COALESCE(j.lease_token = r.token AND j.status::text = 'running'
        AND NOT EXISTS (SELECT 1 FROM held AS h WHERE h.id = r.id), false) AS deferred
FROM r
LEFT JOIN renewed AS u ON u.id = r.id AND u.lease_token = r.token
LEFT JOIN {jobs} AS j ON j.id = r.id
"""

# A lease whose row a caller held at the last renewal is renewed by a worker waiting in
# line for that row, in a transaction of its own that first takes the job's lease-line
# lock (an advisory lock, ``LEASE_LINE_LOCK`` and the job id's hash) and sets its
# ``lock_timeout``. The lease ran out in the table while the caller held the row, and
# the moment the caller lets go the row is free to a reaper's SKIP LOCKED before the
# waiting worker has written its renewal; the reaper skips a job whose lease-line lock
# is taken (REAP), so the worker still running the job keeps it. The lease counts
# from the moment the row was got (``clock_timestamp()``), not from the wait's start.
TAKE_LEASE_LINE = """
SELECT pg_advisory_xact_lock({lease_line}, hashtext(%(id)s::text)),
    set_config('lock_timeout', %(wait_ms)s, true)
"""

RENEW_IN_LINE = """
UPDATE {jobs} AS j
SET leased_until = clock_timestamp() + %(seconds)s * interval '1 second'
WHERE j.id = %(id)s AND j.lease_token = %(token)s AND j.status::text = 'running'
RETURNING j.leased_until
"""

JOB_STATUS = """
SELECT status::text FROM {jobs} WHERE id = %(id)s
"""


# Graceful stop: the job goes back where it was in its queue and the attempt it
# never really ran is handed back.
RELEASE = """
UPDATE {jobs} AS j
SET status = 'pending',
    attempt = GREATEST(j.attempt - 1, 0),
    leased_by = NULL,
    leased_until = NULL,
    lease_token = NULL
FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS r(id, token)
WHERE j.id = r.id AND j.lease_token = r.token AND j.status::text = 'running'
RETURNING j.id
"""

# Takes back jobs whose lease expired. Rows locked by a live atomic attempt are
# skipped (SKIP LOCKED), so only holders that are really gone lose their jobs, and so
# are jobs whose lease-line lock is taken: their worker is waiting to renew them the
# moment a caller lets go of the row (TAKE_LEASE_LINE). The lost attempt counts: at
# max_attempts the job fails instead of going back.
REAP = """
WITH expired AS (
    SELECT j.id, j.leased_by
    FROM {jobs} AS j
    WHERE j.status = 'running'
      AND j.leased_until < now()
      AND j.type_name = ANY(%(type_names)s::text[])
      -- Not the reaping worker's own jobs — unless it says which leases it still
      -- holds: then a job it abandoned (its attempt aborted while the database
      -- was unreachable) is taken back like anyone else's.
      AND (j.leased_by IS DISTINCT FROM %(worker_id)s
           OR NOT (j.lease_token = ANY(COALESCE(%(held)s::uuid[], ARRAY[j.lease_token]))))
      AND pg_try_advisory_xact_lock({lease_line}, hashtext(j.id::text))
    ORDER BY j.leased_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
-- Workers found dead by their heartbeat: all their jobs at once, leases expired or
-- not and whatever the limit (which bounds expired leases only).
abandoned AS (
    SELECT j.id, j.leased_by
    FROM {jobs} AS j
    WHERE cardinality(%(dead_workers)s::text[]) > 0
      AND j.status = 'running'
      AND j.leased_by = ANY(%(dead_workers)s::text[])
    FOR UPDATE SKIP LOCKED
),
found AS (
    SELECT id, leased_by FROM expired
    UNION
    SELECT id, leased_by FROM abandoned
),
-- A job past its attempts fails its chain, on the chain's root row: that row is locked
-- without waiting too, and a job whose root another transaction holds (a caller
-- enqueueing a job blocked on the chain, deleting or cancelling it) is left for a
-- later reap. A one-job chain's job is its own root.
failing_roots AS (
    SELECT r.id
    FROM {jobs} AS r
    WHERE r.id IN (
        SELECT j.chain_id FROM {jobs} AS j, found AS f
        WHERE j.id = f.id AND j.id <> j.chain_id AND j.attempt >= j.max_attempts
    )
    FOR NO KEY UPDATE OF r SKIP LOCKED
),
taken AS (
    SELECT f.id, f.leased_by, jsonb_build_object(
            'type', 'LeaseExpired',
            'message', CASE WHEN f.leased_by = ANY(%(dead_workers)s::text[])
                THEN 'worker ' || f.leased_by || ' stopped sending heartbeats'
                ELSE 'lease held by ' || COALESCE(f.leased_by, '?') || ' expired at '
                    || j.leased_until::text || '; the worker stopped renewing it' END,
            'traceback', NULL) AS error
    FROM found AS f, {jobs} AS j
    WHERE j.id = f.id
      AND (j.id = j.chain_id OR j.attempt < j.max_attempts
           OR j.chain_id IN (SELECT fr.id FROM failing_roots AS fr))
),
reaped AS (
    UPDATE {jobs} AS j
    SET status = CASE WHEN j.attempt >= j.max_attempts
                      THEN 'failed'::{job_status} ELSE 'pending'::{job_status} END,
        completed_at = CASE WHEN j.attempt >= j.max_attempts THEN now() END,
        last_attempt_error = e.error,
        last_attempt_at = now(),
        attempt_history = <appended>,
        leased_by = NULL,
        leased_until = NULL,
        lease_token = NULL,
        chain_status = CASE WHEN j.id = j.chain_id AND j.attempt >= j.max_attempts
                            THEN 'failed'::{chain_status} ELSE j.chain_status END,
        chain_completed_at = CASE WHEN j.id = j.chain_id AND j.attempt >= j.max_attempts
                                  THEN now() ELSE j.chain_completed_at END
    FROM taken AS e
    WHERE j.id = e.id
    RETURNING j.id, j.chain_id, j.type_name, e.leased_by, j.attempt, j.status::text,
        j.chain_has_dependants AS has_dependants
),
-- A one-job chain's root is the job itself: tested on reaped's own columns, no
-- primary-key probe (as in COMPLETE).
roots AS (
    UPDATE {jobs} AS r
    SET chain_status = 'failed', chain_completed_at = now()
    FROM reaped
    WHERE r.id = reaped.chain_id AND reaped.chain_id <> reaped.id AND reaped.status = 'failed'
    RETURNING r.id, r.chain_has_dependants AS has_dependants
)
SELECT p.id, p.type_name, p.leased_by, p.attempt, p.status, p.chain_id,
    p.status = 'failed' AND CASE WHEN p.id = p.chain_id THEN p.has_dependants
                                 ELSE COALESCE(rt.has_dependants, false) END AS has_dependants
FROM reaped AS p
LEFT JOIN roots AS rt ON rt.id = p.chain_id
""".replace("<appended>", appended_history("j", "NULL", "e.error"))


@dataclass(frozen=True, slots=True)
class LeaseStatements:
    acquire: bytes
    acquire_any_queue: bytes
    next_due: bytes
    begin_atomic: bytes
    begin_atomic_bounded: bytes
    renew: bytes
    take_lease_line: bytes
    renew_in_line: bytes
    job_status: bytes
    release: bytes
    reap: bytes
