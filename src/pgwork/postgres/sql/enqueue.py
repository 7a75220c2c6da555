"""SQL of the enqueue: insert jobs (batched, single, copied), announce ready queues,
find deduplicated matches, insert or merge debounced jobs.

Batch statements take arrays and ``unnest`` them, so the parameter count is fixed
whatever the batch size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["EnqueueStatements"]

# Until when retention keeps a new chain for its dedup key's sake (``dedup_until``):
# ``hold`` seconds from now, the end of the key's window (``DedupSpec(scope="window")``:
# a later enqueue with that window matches the chain while its ``created_at``, this
# transaction's now(), is within it); infinity for ``scope="ever"``; NULL (no hold)
# for every other job.
_DEDUP_UNTIL = """CASE WHEN {hold} = 'Infinity'::float8 THEN 'infinity'::timestamptz
             ELSE now() + {hold} * interval '1 second' END"""

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
INSERT_JOBS = f"""
WITH inserted AS (
    INSERT INTO {{jobs}} (
        id, type_name, chain_id, chain_type_name, chain_index, input, status, queue,
        priority, max_attempts, scheduled_at, chain_status, dedup_key, dedup_until,
        trace_context, context, limit_key, limit_group
    )
    SELECT
        n.id, n.type_name, n.chain_id, n.chain_type_name, n.chain_index, n.input::jsonb,
        n.status::{{job_status}}, n.queue, n.priority, n.max_attempts,
        GREATEST(now(), n.run_at, now() + n.run_after * interval '1 second'),
        CASE WHEN n.id = n.chain_id THEN 'active'::{{chain_status}} END,
        n.dedup_key, {_DEDUP_UNTIL.format(hold="n.dedup_hold")},
        n.trace_context::jsonb, n.context::jsonb, n.limit_key, n.limit_group
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
            unnest(%(dedup_holds)s::text::float8[]) AS dedup_hold,
            unnest(%(trace_contexts)s::text::text[]) AS trace_context,
            unnest(%(statuses)s::text::text[]) AS status,
            unnest(%(contexts)s::text::text[]) AS context,
            unnest(%(limit_keys)s::text::text[]) AS limit_key,
            unnest(%(limit_groups)s::text::text[]) AS limit_group
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
        max_attempts, chain_status, trace_context, context, limit_key, limit_group
    )
    SELECT
        n.id, n.type_name, n.id, n.chain_type_name, n.input::jsonb, 'pending', n.queue,
        n.priority, n.max_attempts, 'active', n.trace_context::jsonb, n.context::jsonb,
        n.limit_key, n.limit_group
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
            unnest(%(contexts)s::text::text[]) AS context,
            unnest(%(limit_keys)s::text::text[]) AS limit_key,
            unnest(%(limit_groups)s::text::text[]) AS limit_group
    ) AS n
)
SELECT pg_notify(%(channel)s::text, p) FROM unnest(%(ready)s::text::text[]) AS p
"""

# INSERT_JOBS for one job, with scalar parameters: psycopg dumps fourteen one-element
# arrays about ten times slower than fourteen values, and a single start_chain is the
# commonest enqueue. ``%(ready)s``: the one encoded notice, or NULL for none.
INSERT_JOB = f"""
WITH inserted AS (
    INSERT INTO {{jobs}} (
        id, type_name, chain_id, chain_type_name, chain_index, input, status, queue,
        priority, max_attempts, scheduled_at, chain_status, dedup_key, dedup_until,
        trace_context, context, limit_key, limit_group
    )
    VALUES (
        %(id)s::uuid, %(type_name)s::text, %(chain_id)s::uuid, %(chain_type_name)s::text,
        %(chain_index)s::int, %(input)s::jsonb, %(status)s::text::{{job_status}},
        %(queue)s::text, %(priority)s::smallint, %(max_attempts)s::int,
        GREATEST(
            now(), %(run_at)s::timestamptz, now() + %(run_after)s::float8 * interval '1 second'
        ),
        CASE WHEN %(id)s::uuid = %(chain_id)s::uuid THEN 'active'::{{chain_status}} END,
        %(dedup_key)s::text, {_DEDUP_UNTIL.format(hold="%(dedup_hold)s::float8")},
        %(trace_context)s::jsonb, %(context)s::jsonb, %(limit_key)s::text,
        %(limit_group)s::text
    )
)
SELECT pg_notify(%(channel)s::text, %(ready)s::text) WHERE %(ready)s::text IS NOT NULL
"""

# INSERT_JOB for the commonest enqueue, one job runnable now (no schedule, no blocker,
# no dedup key): what the others compute from NULLs is written as constants, so the
# client sends fourteen parameters, not eighteen, and the server has no GREATEST/CASE over
# them to evaluate. ``%(ready)s``: the one encoded notice, or NULL for none.
INSERT_PLAIN_JOB = """
WITH inserted AS (
    INSERT INTO {jobs} (
        id, type_name, chain_id, chain_type_name, chain_index, input, status, queue,
        priority, max_attempts, chain_status, trace_context, context, limit_key,
        limit_group
    )
    VALUES (
        %(id)s::uuid, %(type_name)s::text, %(chain_id)s::uuid, %(chain_type_name)s::text,
        %(chain_index)s::int, %(input)s::jsonb, 'pending', %(queue)s::text,
        %(priority)s::smallint, %(max_attempts)s::int,
        CASE WHEN %(id)s::uuid = %(chain_id)s::uuid THEN 'active'::{chain_status} END,
        %(trace_context)s::jsonb, %(context)s::jsonb, %(limit_key)s::text,
        %(limit_group)s::text
    )
)
SELECT pg_notify(%(channel)s::text, %(ready)s::text) WHERE %(ready)s::text IS NOT NULL
"""

# INSERT_PLAIN_JOB for the first job of a new chain with no trace or logging context and
# no limit key (``start_chain``'s commonest call) that announces its queue: the chain's
# id and type are the job's own (one parameter each, used twice), its index, status and
# chain status constants, so the client sends eight parameters, not fourteen. The notice
# is sent from the FROM clause, which yields one row, so the insert runs once, and the
# statement returns no row for the driver to describe and load. ``%(ready)s``: the encoded notice.
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
    priority, max_attempts, chain_status, dedup_key, trace_context, context, limit_key,
    limit_group
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


# Debounced enqueues (``Debounce``): each row inserts a new chain's first job, due
# ``delay`` from now with its deadline ``max_wait`` from now, or, when its (chain type,
# key) already has a debounced root that is pending and has never started, merges into
# that one instead. ``jobs_debounce_idx`` (unique over exactly those roots) is the
# arbiter: of concurrent enqueues of one key, one inserts and the others wait for it,
# then merge in turn, each after the previous committed. At READ COMMITTED a merge
# sees (and changes) the latest committed row; at REPEATABLE READ or SERIALIZABLE a
# row its snapshot cannot see, or that changed since, makes PostgreSQL raise a
# serialization failure instead: never a second job. A root that starts meanwhile (a
# worker's acquire commits while the enqueue waits) leaves the index, and the
# enqueue inserts a new chain. A merge moves the start to now + delay, never earlier
# than it was, never past the deadline; the proposed row's ``scheduled_at`` is now +
# delay (``max_wait`` is at least ``delay``). Rows come one per key, sorted by the
# caller, so two batches take their keys in the same order and cannot deadlock.
# ``"last"`` replaces the input; ``"first"`` keeps it. The caller tells an insert from
# a merge by the id returned: a merge returns the existing job's.
_DEBOUNCE_JOBS = """
INSERT INTO {{jobs}} AS j (
    id, type_name, chain_id, chain_type_name, chain_index, input, status, queue,
    priority, max_attempts, scheduled_at, chain_status, dedup_key, trace_context,
    context, limit_key, limit_group, debounce_deadline
)
SELECT
    n.id, n.type_name, n.id, n.chain_type_name, 0, n.input::jsonb, 'pending', n.queue,
    n.priority, n.max_attempts, now() + LEAST(n.delay_s, n.max_wait_s) * interval '1 second',
    'active', n.key, n.trace_context::jsonb, n.context::jsonb, n.limit_key, n.limit_group,
    now() + n.max_wait_s * interval '1 second'
FROM unnest(
    %(ids)s::uuid[], %(type_names)s::text[], %(chain_type_names)s::text[],
    %(inputs)s::text[], %(queues)s::text[], %(priorities)s::smallint[],
    %(max_attempts)s::int[], %(delays)s::float8[], %(max_waits)s::float8[],
    %(keys)s::text[], %(trace_contexts)s::text[], %(contexts)s::text[],
    %(limit_keys)s::text[], %(limit_groups)s::text[]
) WITH ORDINALITY AS n(
    id, type_name, chain_type_name, input, queue, priority, max_attempts, delay_s,
    max_wait_s, key, trace_context, context, limit_key, limit_group, ord
)
ORDER BY n.ord
ON CONFLICT (chain_type_name, dedup_key)
    WHERE debounce_deadline IS NOT NULL AND status = 'pending' AND started_at IS NULL
DO UPDATE SET
    {input}scheduled_at = GREATEST(
        j.scheduled_at, LEAST(EXCLUDED.scheduled_at, j.debounce_deadline)
    )
RETURNING j.id, j.chain_type_name, j.dedup_key
"""

DEBOUNCE_JOBS = {
    "last": _DEBOUNCE_JOBS.format(input="input = EXCLUDED.input, "),
    "first": _DEBOUNCE_JOBS.format(input=""),
}


@dataclass(frozen=True, slots=True)
class EnqueueStatements:
    insert_jobs: bytes
    insert_plain_jobs: bytes
    insert_job: bytes
    insert_plain_job: bytes
    insert_plain_root: bytes
    copy_jobs: bytes
    notify_ready: bytes
    lock_dedup_keys: bytes
    find_dedup_matches: bytes
    # By ``Debounce.keep``: "last" or "first".
    debounce_jobs: Mapping[str, bytes]
