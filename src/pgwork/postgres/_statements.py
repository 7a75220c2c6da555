"""Every SQL statement of the PostgreSQL state adapter, by name.

Statements are templates: ``{jobs}``, ``{queues}``, ``{job_status}``,
``{chain_status}`` and ``{lease_line}`` are replaced once per adapter with the quoted
schema-qualified identifiers and the lease-line lock's key (see ``render``);
everything a caller supplies is a bound parameter. Batch statements take arrays and
``unnest`` them, so the parameter count is fixed whatever the batch size. The
statement contract test prepares each of these against a migrated database.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from psycopg import sql

from pgwork.postgres._names import validate_schema_name
from pgwork.records import ATTEMPT_HISTORY_LIMIT, HISTORY_TRACEBACK_LIMIT

# The first key of a job's lease-line lock (a two-key advisory lock; the second key is
# the job id's hash): "pgwr" read as an int4. PostgreSQL keeps two-key advisory locks
# apart from the one-key ones pgwork takes elsewhere (dedup keys, retention).
LEASE_LINE_LOCK = 0x70677772

# Columns of a full job row, in the order ``_rows.job_from_row`` reads them. Input and
# output come as text and are parsed row by row (``_rows.parse_stored_json``).
_JOB_COLUMNS = """
    {alias}.id, {alias}.type_name, {alias}.chain_id, {alias}.chain_type_name,
    {alias}.chain_index, {alias}.input::text, {alias}.output::text, {alias}.status::text,
    {alias}.queue, {alias}.priority, {alias}.created_at, {alias}.scheduled_at,
    {alias}.started_at, {alias}.completed_at, {alias}.attempt, {alias}.max_attempts,
    {alias}.last_attempt_error, {alias}.last_attempt_at, {alias}.leased_by,
    {alias}.leased_until, {alias}.dedup_key, {alias}.context, {alias}.attempt_history::text
"""


def _columns(alias: str) -> str:
    return _JOB_COLUMNS.replace("{alias}", alias)


def _in_chain(alias: str, chain: str) -> str:
    """SQL: job ``alias`` belongs to the chain(s) ``chain`` (``%(x)s``, ``ANY(...)``).

    ``jobs_chain_idx`` holds continuations only (migration 0005), so the root is matched
    apart, by primary key; the planner reads the two indexes and ORs the results.
    """
    return (
        f"(({alias}.id = {chain} AND {alias}.id = {alias}.chain_id)"
        f" OR ({alias}.chain_id = {chain} AND {alias}.id <> {alias}.chain_id))"
    )


def _last_job(root: str) -> str:
    """SQL: the newest job (a whole row) of the chain whose root row is ``root``, an
    alias in scope: its last continuation (``jobs_chain_idx``, which holds
    continuations only), else the root itself. No row when ``root`` is NULL."""
    return f"""(
        SELECT n.* FROM (
            (SELECT c.* FROM {{jobs}} AS c
             WHERE c.chain_id = {root}.id AND c.id <> c.chain_id
             ORDER BY c.chain_index DESC
             LIMIT 1)
            UNION ALL
            SELECT {root}.* WHERE {root}.id IS NOT NULL
        ) AS n
        ORDER BY n.chain_index DESC
        LIMIT 1
    )"""


def _appended(alias: str, ran_for: str, error: str) -> str:
    """SQL: job ``alias``'s attempt history with its current attempt appended, failed
    with ``error`` (jsonb) after ``ran_for`` seconds (NULL: unknown), and cut to the
    newest ``ATTEMPT_HISTORY_LIMIT`` entries. The entry's traceback keeps its last
    ``HISTORY_TRACEBACK_LIMIT`` characters; its time is UTC, written the same way
    whatever the session's time zone."""
    keep = HISTORY_TRACEBACK_LIMIT
    history = f"""COALESCE({alias}.attempt_history, '[]'::jsonb) || jsonb_build_array(
            jsonb_build_object(
                'attempt', {alias}.attempt,
                'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                'worker', {alias}.leased_by,
                'ran_for', {ran_for},
                'error', {error} || jsonb_build_object('traceback',
                    CASE WHEN length({error} ->> 'traceback') > {keep}
                         THEN '…' || right({error} ->> 'traceback', {keep})
                         ELSE {error} ->> 'traceback' END)))"""
    return f"""jsonb_path_query_array(
            {history},
            '$[$from to last]',
            jsonb_build_object('from', GREATEST(
                COALESCE(jsonb_array_length({alias}.attempt_history), 0)
                + 1 - {ATTEMPT_HISTORY_LIMIT}, 0)))"""


# Each array is one text parameter holding an array literal written by pgwork
# (``_enqueue.insert_params``), cast here: formatting a hundred rows of literals costs
# less than psycopg's dumping of fifteen lists, the parameter count stays fixed
# whatever the batch size, and a string is a string to every driver. Inputs and
# contexts travel as text and are parsed as jsonb here. The outer SELECT announces the
# ready queues (``%(ready)s``, already encoded; empty or a NULL channel: none) in the
# same round trip; a data-modifying CTE always runs to completion, and PostgreSQL
# delivers the notices on commit, once per transaction. The arrays are unnested in a
# select list (a ProjectSet node, which hands each row on as it makes it), not in FROM
# (a Function Scan, which first copies every row into a tuplestore): in lockstep all
# the same, and less server CPU per row (`python -m bench --only enqueue`).
INSERT_JOBS = """
WITH inserted AS (
    INSERT INTO {jobs} (
        id, type_name, chain_id, chain_type_name, chain_index, input, status, queue,
        priority, max_attempts, scheduled_at, chain_status, dedup_key, trace_context,
        context
    )
    SELECT
        n.id, n.type_name, n.chain_id, n.chain_type_name, n.chain_index, n.input::jsonb,
        n.status::{job_status}, n.queue, n.priority, n.max_attempts,
        GREATEST(now(), n.run_at, now() + n.run_after * interval '1 second'),
        CASE WHEN n.id = n.chain_id THEN 'active'::{chain_status} END,
        n.dedup_key, n.trace_context::jsonb, n.context::jsonb
    FROM (
        SELECT
            unnest(%(ids)s::text::uuid[]) AS id,
            unnest(%(type_names)s::text::text[]) AS type_name,
            unnest(%(chain_ids)s::text::uuid[]) AS chain_id,
            unnest(%(chain_type_names)s::text::text[]) AS chain_type_name,
            unnest(%(chain_indexes)s::text::int[]) AS chain_index,
            unnest(%(inputs)s::text::text[]) AS input,
            unnest(%(queues)s::text::text[]) AS queue,
            unnest(%(priorities)s::text::smallint[]) AS priority,
            unnest(%(max_attempts)s::text::int[]) AS max_attempts,
            unnest(%(run_ats)s::text::timestamptz[]) AS run_at,
            unnest(%(run_afters)s::text::float8[]) AS run_after,
            unnest(%(dedup_keys)s::text::text[]) AS dedup_key,
            unnest(%(trace_contexts)s::text::text[]) AS trace_context,
            unnest(%(statuses)s::text::text[]) AS status,
            unnest(%(contexts)s::text::text[]) AS context
    ) AS n
)
SELECT pg_notify(%(channel)s::text, p) FROM unnest(%(ready)s::text::text[]) AS p
"""

# INSERT_JOBS for a batch of new chains' first jobs that run now (no schedule, no
# blocker, no dedup key): what the general statement takes as six more arrays (chain
# ids, chain indexes, statuses, run_at, run_after, dedup keys) or computes per row
# (GREATEST of the schedule, CASE of the chain status) is the row's own id, a constant
# or a column default here, as in COPY_JOBS. Batches of 100 are the commonest, and
# they cost the server less per row so (`python -m bench --only enqueue`).
INSERT_PLAIN_JOBS = """
WITH inserted AS (
    INSERT INTO {jobs} (
        id, type_name, chain_id, chain_type_name, input, status, queue, priority,
        max_attempts, chain_status, trace_context, context
    )
    SELECT
        n.id, n.type_name, n.id, n.chain_type_name, n.input::jsonb, 'pending', n.queue,
        n.priority, n.max_attempts, 'active', n.trace_context::jsonb, n.context::jsonb
    FROM (
        SELECT
            unnest(%(ids)s::text::uuid[]) AS id,
            unnest(%(type_names)s::text::text[]) AS type_name,
            unnest(%(chain_type_names)s::text::text[]) AS chain_type_name,
            unnest(%(inputs)s::text::text[]) AS input,
            unnest(%(queues)s::text::text[]) AS queue,
            unnest(%(priorities)s::text::smallint[]) AS priority,
            unnest(%(max_attempts)s::text::int[]) AS max_attempts,
            unnest(%(trace_contexts)s::text::text[]) AS trace_context,
            unnest(%(contexts)s::text::text[]) AS context
    ) AS n
)
SELECT pg_notify(%(channel)s::text, p) FROM unnest(%(ready)s::text::text[]) AS p
"""

# INSERT_JOBS for one job, with scalar parameters: psycopg dumps fourteen one-element
# arrays about ten times slower than fourteen values, and a single start_chain is the
# commonest enqueue. ``%(ready)s``: the one encoded notice, or NULL for none.
INSERT_JOB = """
WITH inserted AS (
    INSERT INTO {jobs} (
        id, type_name, chain_id, chain_type_name, chain_index, input, status, queue,
        priority, max_attempts, scheduled_at, chain_status, dedup_key, trace_context,
        context
    )
    VALUES (
        %(id)s::uuid, %(type_name)s::text, %(chain_id)s::uuid, %(chain_type_name)s::text,
        %(chain_index)s::int, %(input)s::jsonb, %(status)s::text::{job_status},
        %(queue)s::text, %(priority)s::smallint, %(max_attempts)s::int,
        GREATEST(
            now(), %(run_at)s::timestamptz, now() + %(run_after)s::float8 * interval '1 second'
        ),
        CASE WHEN %(id)s::uuid = %(chain_id)s::uuid THEN 'active'::{chain_status} END,
        %(dedup_key)s::text, %(trace_context)s::jsonb, %(context)s::jsonb
    )
)
SELECT pg_notify(%(channel)s::text, %(ready)s::text) WHERE %(ready)s::text IS NOT NULL
"""

# INSERT_JOB for the commonest enqueue, one job runnable now (no schedule, no blocker,
# no dedup key): what the others compute from NULLs is written as constants, so the
# client sends thirteen parameters, not seventeen, and the server has no GREATEST/CASE over
# them to evaluate. ``%(ready)s``: the one encoded notice, or NULL for none.
INSERT_PLAIN_JOB = """
WITH inserted AS (
    INSERT INTO {jobs} (
        id, type_name, chain_id, chain_type_name, chain_index, input, status, queue,
        priority, max_attempts, chain_status, trace_context, context
    )
    VALUES (
        %(id)s::uuid, %(type_name)s::text, %(chain_id)s::uuid, %(chain_type_name)s::text,
        %(chain_index)s::int, %(input)s::jsonb, 'pending', %(queue)s::text,
        %(priority)s::smallint, %(max_attempts)s::int,
        CASE WHEN %(id)s::uuid = %(chain_id)s::uuid THEN 'active'::{chain_status} END,
        %(trace_context)s::jsonb, %(context)s::jsonb
    )
)
SELECT pg_notify(%(channel)s::text, %(ready)s::text) WHERE %(ready)s::text IS NOT NULL
"""

# INSERT_PLAIN_JOB for the first job of a new chain with no trace or logging context
# (``start_chain``'s commonest call) that announces its queue: the chain's id and type
# are the job's own (one parameter each, used twice), its index, status and chain status
# constants, so the client sends eight parameters, not thirteen. The notice is sent from
# the FROM clause, which yields one row, so the insert runs once, and the statement
# returns no row for the driver to describe and load. ``%(ready)s``: the encoded notice.
INSERT_PLAIN_ROOT = """
INSERT INTO {jobs} (
    id, type_name, chain_id, chain_type_name, chain_index, input, status, queue,
    priority, max_attempts, chain_status
)
SELECT
    %(id)s::uuid, %(type_name)s::text, %(id)s::uuid, %(type_name)s::text, 0,
    %(input)s::jsonb, 'pending', %(queue)s::text, %(priority)s::smallint,
    %(max_attempts)s::int, 'active'
FROM (SELECT pg_notify(%(channel)s::text, %(ready)s::text)) AS announced
"""

# INSERT_JOBS's announcement alone, for batches written with COPY.
NOTIFY_READY = """
SELECT pg_notify(%(channel)s::text, p) FROM unnest(%(ready)b::text[]) AS p
"""

# The same rows as INSERT_JOBS for jobs that are neither scheduled nor blocked, whose
# created_at and scheduled_at both take their default, now().
COPY_JOBS = """
COPY {jobs} (
    id, type_name, chain_id, chain_type_name, chain_index, input, status, queue,
    priority, max_attempts, chain_status, dedup_key, trace_context, context
) FROM STDIN
"""

# Serialises concurrent enqueues of the same (chain type, dedup key) until commit.
# Locks are taken in a stable order so two batches cannot deadlock each other. Only
# under READ COMMITTED (which READ UNCOMMITTED is in PostgreSQL), whose next
# statement's snapshot sees what the lock's previous holder committed: at a higher
# level the one row returned names the level and no lock is taken (the caller refuses
# the enqueue, and its transaction stays usable).
LOCK_DEDUP_KEYS = """
SELECT s.isolation, pg_advisory_xact_lock(l.k)
FROM (SELECT current_setting('transaction_isolation') AS isolation) AS s
LEFT JOIN (
    SELECT DISTINCT hashtextextended(x, 0) AS k FROM unnest(%(keys)s::text[]) AS x
) AS l ON s.isolation IN ('read committed', 'read uncommitted')
ORDER BY l.k
"""

# Must run as its own statement after LOCK_DEDUP_KEYS: under READ COMMITTED it then
# sees chains committed by whoever held the lock before us.
FIND_DEDUP_MATCHES = """
SELECT d.ord, j.id, j.status::text
FROM unnest(
    %(chain_type_names)s::text[], %(keys)s::text[], %(scopes)s::text[],
    %(windows)s::float8[]
) WITH ORDINALITY AS d(chain_type_name, key, scope, window_s, ord)
CROSS JOIN LATERAL (
    SELECT r.id, r.status
    FROM {jobs} AS r
    WHERE r.id = r.chain_id
      AND r.chain_type_name = d.chain_type_name
      AND r.dedup_key = d.key
      AND (
          d.scope = 'ever'
          OR (d.scope = 'incomplete' AND r.chain_status = 'active')
          OR (d.scope = 'window' AND r.created_at > now() - d.window_s * interval '1 second')
      )
    ORDER BY r.created_at DESC
    LIMIT 1
) AS j
"""

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
_LEASES = """
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
        j.trace_context, j.started_at, j.last_attempt_at, j.dedup_key, j.context
"""

_LEASED = f"""
leased AS ({_LEASE})"""

# Columns of an acquired row (``_rows.acquired_from_row``): a handler sees every field
# ``get_job`` returns, so the acquire hands them all back.
ACQUIRED_WIDTH = 20

# The leased rows, then the ``missed`` marker (a row whose id is NULL) when the lease
# found fewer candidates than were locked.
_LEASE_CANDIDATES = f"""
SELECT * FROM leased
UNION ALL
SELECT {", ".join(["NULL"] * ACQUIRED_WIDTH)}
WHERE (SELECT count(*) FROM leased) < (SELECT count(*) FROM candidates)
"""

# Queues are drained in the order given (strictly), each on its own index range, so a
# deep low-priority queue never slows acquiring from a high-priority one. Rows locked
# beyond the outer LIMIT are released at commit, a few milliseconds later.
_CANDIDATES_BY_QUEUE = """
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

ACQUIRE = f"WITH {_CANDIDATES_BY_QUEUE},{_LEASES},{_LEASED}{_LEASE_CANDIDATES}"

# ``queues=None``: any queue not paused, best priority then oldest first across all.
_CANDIDATES_ANY_QUEUE = """
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

ACQUIRE_ANY_QUEUE = f"WITH {_CANDIDATES_ANY_QUEUE},{_LEASES},{_LEASED}{_LEASE_CANDIDATES}"

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
# ones included: each job a drain finished leaves one until a vacuum, so the check cost
# 0.5 ms of server CPU after 3,000 jobs instead of a primary key lookup's ~20 µs. A
# predicate on ``status::text`` matches no index.
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
# key (52 ms for a renewal after 30,000 jobs were drained and before a vacuum).
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

# Completes jobs. A worker's completion is fenced by its lease token; a completion
# without token (workerless) applies to any job not yet final. A chain ends when its
# job completes without continuation: the root row records that. A one-job chain's
# job is its root and was updated by ``done`` already; ``roots`` tests that on
# ``done``'s own columns (``done.chain_id <> done.id``), so such a job costs no
# primary-key probe there (written as ``r.id <> done.id`` the test could only be
# applied to the row the probe found: 50 probes, ~150 buffer reads, per turn of 50).
_COMPLETE_CTES = """
c AS (
    SELECT * FROM unnest(
        %(ids)b::uuid[], %(tokens)b::uuid[], %(outputs)b::text[], %(ends_chain)b::bool[]
    ) AS c(id, token, output, ends_chain)
),
done AS (
    UPDATE {jobs} AS j
    SET status = 'completed',
        output = c.output::jsonb,
        completed_at = now(),
        leased_by = NULL,
        leased_until = NULL,
        lease_token = NULL,
        chain_status = CASE WHEN j.id = j.chain_id AND c.ends_chain
                            THEN 'completed'::{chain_status} ELSE j.chain_status END,
        chain_completed_at = CASE WHEN j.id = j.chain_id AND c.ends_chain
                                  THEN now() ELSE j.chain_completed_at END
    FROM c
    WHERE j.id = c.id
      AND CASE WHEN c.token IS NULL THEN j.status IN ('pending', 'running', 'blocked')
               ELSE j.lease_token = c.token AND j.status = 'running' END
    RETURNING j.id, j.chain_id, j.chain_index, c.ends_chain, j.chain_awaited AS awaited,
        j.chain_has_dependants AS has_dependants
),
roots AS (
    UPDATE {jobs} AS r
    SET chain_status = 'completed', chain_completed_at = now()
    FROM done
    WHERE r.id = done.chain_id AND done.chain_id <> done.id AND done.ends_chain
    RETURNING r.id, r.chain_awaited AS awaited, r.chain_has_dependants AS has_dependants
)"""

_COMPLETE_RESULT = """
SELECT d.id, d.chain_id, d.chain_index, d.ends_chain,
    d.ends_chain AND CASE WHEN d.id = d.chain_id THEN d.has_dependants
                          ELSE COALESCE(rt.has_dependants, false) END AS has_dependants,
    d.ends_chain AND CASE WHEN d.id = d.chain_id THEN d.awaited
                          ELSE COALESCE(rt.awaited, false) END AS awaited
FROM done AS d
LEFT JOIN roots AS rt ON rt.id = d.chain_id
"""

COMPLETE = f"WITH {_COMPLETE_CTES}{_COMPLETE_RESULT}"


def _skipping_locked(ctes: str) -> str:
    """``ctes`` for a worker's own batch of completions, which skips a row another
    transaction holds instead of waiting on it (a caller cancelling or completing that
    job, or reading it ``FOR UPDATE``): one caller's lock must not hold up the other
    completions of the batch, nor the acquire of the same turn. The rows are locked
    first (``held``) and updated by id, not by the locked version's ``ctid``: a row
    updated and committed between the statement's snapshot and its lock is then still
    found (the update follows it). A completion that ends a chain at a later job also
    writes the chain's root row: that row is locked the same way (``ending_roots``;
    a one-job chain's job is its root, and costs no probe), and a completion whose
    root is held is skipped too (a caller enqueueing a job blocked on the chain,
    deleting or cancelling it, holds its root); ``taken`` are the completions written.
    Nothing here waits, so the order of the locks does not matter. A completion not
    taken is in ``deferred`` when the snapshot saw its job held by its lease: not
    written this time, to be tried again; any other not written was refused."""
    fence = """CASE WHEN c.token IS NULL THEN j.status IN ('pending', 'running', 'blocked')
               ELSE j.lease_token = c.token AND j.status = 'running' END"""
    assert ctes.count(fence) == 1
    head, tail = ctes.split("done AS (", 1)
    held = f"""held AS (
    SELECT j.id, j.chain_id, c.ends_chain
    FROM {{jobs}} AS j, c
    WHERE j.id = c.id
      AND {fence}
    FOR NO KEY UPDATE OF j SKIP LOCKED
),
ending_roots AS (
    SELECT r.id
    FROM {{jobs}} AS r
    WHERE r.id IN (SELECT h.chain_id FROM held AS h WHERE h.id <> h.chain_id AND h.ends_chain)
    FOR NO KEY UPDATE OF r SKIP LOCKED
),
taken AS (
    SELECT h.id FROM held AS h
    WHERE h.id = h.chain_id OR NOT h.ends_chain
       OR h.chain_id IN (SELECT e.id FROM ending_roots AS e)
),
deferred AS (
    SELECT c.id FROM c
    WHERE NOT EXISTS (SELECT 1 FROM taken AS t WHERE t.id = c.id)
      AND EXISTS (
          SELECT 1 FROM {{jobs}} AS j
          WHERE j.id = c.id
            AND {fence}
      )
),
done AS ("""
    tail = tail.replace(
        "    FROM c\n    WHERE j.id = c.id\n",
        "    FROM c, taken AS t\n    WHERE j.id = c.id AND t.id = c.id\n",
        1,
    )
    assert "taken AS t" in tail
    return head + held + tail


_COMPLETE_CTES_SKIPPING = _skipping_locked(_COMPLETE_CTES)

# COMPLETE for a worker's batch written on its own (no acquire went out to take it):
# the completions written, then one row per deferred completion (its id, the rest
# NULL; a written one's chain id is never NULL).
COMPLETE_SKIPPING = f"""WITH {_COMPLETE_CTES_SKIPPING}{_COMPLETE_RESULT}
UNION ALL
SELECT d.id, NULL, NULL, NULL, NULL, NULL FROM deferred AS d
"""

# One completion (an atomic attempt's, a hand-on's): scalars instead of one-element
# arrays. PostgreSQL estimates a one-element array's unnest at one row but a bound
# array's at ten, so with arrays it kept re-planning this statement for every call.
#
# Its chain's root row is locked first (``chain_root``, ``FOR KEY SHARE``; none when the
# job is the root, whose own update locks it): a cancel or a delete locks the roots of
# its chains ``FOR UPDATE`` before it reads their jobs, so a hand-on and a cancel of
# the same chain take their turns, in the same order, rather than one missing the
# other's continuation (or deadlocking on the job's row). ``done`` reads the lock's
# result as a one-time filter, so the root is locked before the job's row.
_COMPLETE_CTES_ONE = _COMPLETE_CTES.replace(
    """SELECT * FROM unnest(
        %(ids)b::uuid[], %(tokens)b::uuid[], %(outputs)b::text[], %(ends_chain)b::bool[]
    ) AS c(id, token, output, ends_chain)
),""",
    """SELECT %(id)s::uuid AS id, %(token)s::uuid AS token, %(output)s::text AS output,
        %(ends_chain)s::bool AS ends_chain
),
chain_root AS (
    SELECT r.id FROM {jobs} AS r
    WHERE r.id = (SELECT o.chain_id FROM {jobs} AS o, c
                  WHERE o.id = c.id AND o.id <> o.chain_id)
    FOR KEY SHARE OF r
),""",
).replace(
    """    FROM c
    WHERE j.id = c.id
""",
    """    FROM c
    WHERE j.id = c.id AND (SELECT count(*) FROM chain_root) >= 0
""",
)
assert "chain_root) >= 0" in _COMPLETE_CTES_ONE
COMPLETE_ONE = f"WITH {_COMPLETE_CTES_ONE}{_COMPLETE_RESULT}"

# A hand-on in one statement (one round trip, its own transaction on an autocommit
# connection): the job completes and, only if its lease still held (``completed`` has
# its row), the chain's next job is inserted and announced (the notice goes out on
# commit, with its due time when it runs later). The chain goes on, so it neither ends
# nor unblocks anyone. One round trip where the steps would take five: BEGIN, the
# completion, the insert, the notice, COMMIT.
COMPLETE_AND_CONTINUE = f"""
WITH {_COMPLETE_CTES_ONE},
completed AS ({_COMPLETE_RESULT}),
continued AS (
    INSERT INTO {{jobs}} (
        id, type_name, chain_id, chain_type_name, chain_index, input, status, queue,
        priority, max_attempts, scheduled_at, trace_context, context
    )
    SELECT %(next_id)s::uuid, %(next_type_name)s::text, %(next_chain_id)s::uuid,
        %(next_chain_type_name)s::text, %(next_chain_index)s::int, %(next_input)s::jsonb,
        'pending', %(next_queue)s::text, %(next_priority)s::smallint,
        %(next_max_attempts)s::int,
        GREATEST(
            now(), %(next_run_at)s::timestamptz,
            now() + %(next_run_after)s::float8 * interval '1 second'
        ),
        %(next_trace_context)s::jsonb, %(next_context)s::jsonb
    FROM completed
)
SELECT r.*, CASE WHEN %(ready)s::text IS NOT NULL
                 THEN pg_notify(%(channel)s::text, %(ready)s::text) END
FROM completed AS r
"""


def _by_primary_key(ctes: str) -> str:
    """``ctes`` with the completion's status test written as BEGIN_ATOMIC's, so that a
    single completion finds its row by primary key (see BEGIN_ATOMIC)."""
    fenced = "ELSE j.lease_token = c.token AND j.status = 'running' END"
    assert fenced in ctes
    return ctes.replace(fenced, "ELSE j.lease_token = c.token AND j.status::text = 'running' END")


# An atomic attempt's completion, which travels with the COMMIT right behind it (one
# round trip). Its job's row is not locked while the handler runs, so the completion
# is refused when the lease no longer holds (the job was cancelled, deleted, or reaped
# meanwhile), or when the handler itself changed that row. Then, instead of returning
# no row, the statement fails (the int cast of a message naming the cause; guarded by
# a CASE on the row count, so it is never folded at plan time): the transaction is
# aborted and the COMMIT behind it can only roll back. The handler's writes never
# commit without the completion.
ATOMIC_REFUSED = "pgwork: atomic completion refused, the lease no longer holds its job"

COMPLETE_ATOMIC = f"""
WITH {_by_primary_key(_COMPLETE_CTES_ONE)},
result AS ({_COMPLETE_RESULT})
SELECT r.* FROM result AS r
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL
FROM (SELECT count(*) AS n FROM result) AS f
WHERE CASE WHEN f.n = 0 THEN ('{ATOMIC_REFUSED} (' || f.n || ')')::int IS NULL
           ELSE false END
"""

# A worker's turn in one statement: complete the finished batch and lease the next
# one. The two touch disjoint rows (running vs pending), so one snapshot serves both.
# The first row (``head``) carries the completions' results as parallel arrays, one
# entry per accepted completion; every other row is an acquired job.
_HEAD = """
SELECT true AS head, array_agg(x.id) AS ids, array_agg(x.chain_id) AS chain_ids,
    array_agg(x.has_dependants) AS has_dependants, array_agg(x.awaited) AS awaited,
    (SELECT array_agg(d.id) FROM deferred AS d) AS deferred
FROM completed AS x
"""

_ACQUIRED_ROWS = """
SELECT false, NULL::uuid[], NULL::uuid[], NULL::bool[], NULL::bool[], NULL::uuid[], a.*
FROM acquired AS a
"""


def _complete_and_acquire(candidates: str) -> str:
    return (
        f"WITH {_COMPLETE_CTES_SKIPPING},\ncompleted AS ({_COMPLETE_RESULT}),{candidates},"
        f"{_LEASES},"
        f"{_LEASED},\nacquired AS ({_LEASE_CANDIDATES})"
        f"\nSELECT h.*, {', '.join(['NULL'] * ACQUIRED_WIDTH)}"
        f"\nFROM ({_HEAD}) AS h\nUNION ALL{_ACQUIRED_ROWS}"
    )


COMPLETE_AND_ACQUIRE = _complete_and_acquire(_CANDIDATES_BY_QUEUE)
COMPLETE_AND_ACQUIRE_ANY_QUEUE = _complete_and_acquire(_CANDIDATES_ANY_QUEUE)

# Ends attempts with an error: back to pending after a delay, or failed for good
# (which fails the chain). Each failure is appended to the job's history.
FAIL = """
WITH f AS (
    SELECT f.id, f.token, f.error::jsonb AS error, f.retry_seconds, f.ran_for
    FROM unnest(
        %(ids)s::uuid[], %(tokens)s::uuid[], %(errors)s::text[], %(retry_seconds)s::float8[],
        %(ran_for)s::float8[]
    ) AS f(id, token, error, retry_seconds, ran_for)
),
failed AS (
    UPDATE {jobs} AS j
    SET status = CASE WHEN f.retry_seconds IS NULL
                      THEN 'failed'::{job_status} ELSE 'pending'::{job_status} END,
        scheduled_at = CASE WHEN f.retry_seconds IS NULL THEN j.scheduled_at
                            ELSE now() + f.retry_seconds * interval '1 second' END,
        completed_at = CASE WHEN f.retry_seconds IS NULL THEN now() END,
        last_attempt_error = f.error,
        last_attempt_at = now(),
        attempt_history = <appended>,
        leased_by = NULL,
        leased_until = NULL,
        lease_token = NULL,
        chain_status = CASE WHEN j.id = j.chain_id AND f.retry_seconds IS NULL
                            THEN 'failed'::{chain_status} ELSE j.chain_status END,
        chain_completed_at = CASE WHEN j.id = j.chain_id AND f.retry_seconds IS NULL
                                  THEN now() ELSE j.chain_completed_at END
    FROM f
    WHERE j.id = f.id AND j.lease_token = f.token AND j.status::text = 'running'
    RETURNING j.id, j.chain_id, f.retry_seconds IS NULL AS terminal,
        j.chain_has_dependants AS has_dependants
),
-- A one-job chain's root is the job itself: tested on failed's own columns, no
-- primary-key probe (as in COMPLETE).
roots AS (
    UPDATE {jobs} AS r
    SET chain_status = 'failed', chain_completed_at = now()
    FROM failed
    WHERE r.id = failed.chain_id AND failed.chain_id <> failed.id AND failed.terminal
    RETURNING r.id, r.chain_has_dependants AS has_dependants
)
SELECT f.id, f.chain_id,
    f.terminal AND CASE WHEN f.id = f.chain_id THEN f.has_dependants
                        ELSE COALESCE(rt.has_dependants, false) END AS has_dependants
FROM failed AS f
LEFT JOIN roots AS rt ON rt.id = f.chain_id
""".replace("<appended>", _appended("j", "f.ran_for", "f.error"))

RESCHEDULE = """
UPDATE {jobs} AS j
SET status = 'pending',
    scheduled_at = GREATEST(now(), %(run_at)s::timestamptz,
                            now() + %(run_after)s::float8 * interval '1 second'),
    attempt = CASE WHEN %(count_attempt)s::bool THEN j.attempt ELSE j.attempt - 1 END,
    leased_by = NULL,
    leased_until = NULL,
    lease_token = NULL
WHERE j.id = %(job_id)s AND j.lease_token = %(lease_token)s AND j.status::text = 'running'
RETURNING j.id
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
""".replace("<appended>", _appended("j", "NULL", "e.error"))

GET_JOBS = f"""
SELECT {_columns("j")}
FROM {{jobs}} AS j
WHERE j.id = ANY(%(ids)s::uuid[])
"""

LIST_CHAIN_JOBS = f"""
SELECT {_columns("j")}
FROM {{jobs}} AS j
WHERE {_in_chain("j", "%(chain_id)s::uuid")}
ORDER BY j.chain_index
"""

GET_CHAINS = f"""
SELECT r.chain_status::text, r.chain_completed_at, {_columns("r")}, {_columns("cur")}
FROM {{jobs}} AS r
CROSS JOIN LATERAL {_last_job("r")} AS cur
WHERE r.id = ANY(%(ids)s::uuid[]) AND r.id = r.chain_id
"""


@dataclass(frozen=True, slots=True)
class Statements:
    """The statements above with the schema's identifiers filled in, as bytes.

    Bytes (not ``sql.Composed``) so psycopg sees the same query text each time and its
    automatic prepared statements kick in.
    """

    insert_jobs: bytes
    insert_plain_jobs: bytes
    insert_job: bytes
    insert_plain_job: bytes
    insert_plain_root: bytes
    copy_jobs: bytes
    notify_ready: bytes
    lock_dedup_keys: bytes
    find_dedup_matches: bytes
    acquire: bytes
    acquire_any_queue: bytes
    complete_and_acquire: bytes
    complete_and_acquire_any_queue: bytes
    next_due: bytes
    begin_atomic: bytes
    begin_atomic_bounded: bytes
    renew: bytes
    take_lease_line: bytes
    renew_in_line: bytes
    job_status: bytes
    complete: bytes
    complete_skipping: bytes
    complete_one: bytes
    complete_and_continue: bytes
    complete_atomic: bytes
    fail: bytes
    reschedule: bytes
    release: bytes
    reap: bytes
    get_jobs: bytes
    list_chain_jobs: bytes
    get_chains: bytes


def render(schema: str) -> Statements:
    """Fill every template with ``schema``'s quoted identifiers."""
    schema = validate_schema_name(schema)
    names = {
        "jobs": sql.Identifier(schema, "jobs"),
        "queues": sql.Identifier(schema, "queues"),
        "job_blockers": sql.Identifier(schema, "job_blockers"),
        "job_status": sql.Identifier(schema, "job_status"),
        "chain_status": sql.Identifier(schema, "chain_status"),
        "lease_line": sql.Literal(LEASE_LINE_LOCK),
    }
    rendered = {}
    for f in fields(Statements):
        template = globals()[f.name.upper()]
        rendered[f.name] = sql.SQL(template).format(**names).as_bytes(None)
    return Statements(**rendered)
