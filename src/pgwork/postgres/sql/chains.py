"""SQL for chain orchestration: blockers, cancel, retry, trigger, pause, awaiting.

A blocked job waits for other chains through its ``job_blockers`` edges: a chain's
first job (``start_chain(blockers=...)``) or a later job of its chain, a step waiting
for the children its parent's completion started (docs/design/fan-out.md). Its row
keeps three counters: ``blockers_needed`` (how many blockers must be met: all, or the
first n), ``blockers_met`` and ``blockers_open`` (not yet counted); each edge records
how it was counted (``counted``: NULL while its chain runs, ``'met'`` or ``'failed'``).
A blocker's end (or its retry) is settled by SETTLE_ENDED: it flips that blocker's
edges and adds what it flipped to each job's counters, reading nothing of the job's
other edges; a statement that runs twice flips nothing the second time.
COUNT_BLOCKERS counts a job's edges from scratch: as the job is inserted, and in the
sweep, for a job some of whose blockers ended unsettled.

Settling is two statements in one transaction: LOCK_BLOCKED_DEPENDANTS first (the
dependants' chain roots ``FOR KEY SHARE``, then the dependants ``FOR UPDATE``, each in
id order: a cancel or a delete locks a chain's root before its jobs, so settling a
later job of a chain takes its turn with them rather than deadlocking), then
SETTLE_ENDED under a fresh snapshot that sees whoever held those rows before.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgwork.postgres.sql.fragments import in_chain, last_job

__all__ = ["ChainStatements"]

# Mark the blocker chains' roots as having dependants, in the enqueueing transaction.
# Writing the row makes a concurrent end of that chain wait for us and then read the
# flag from our committed version (see migration 0002); roots are taken in id order so
# two enqueues cannot deadlock. A root still pending stays locked until we commit, so
# an acquire meanwhile skips it (SKIP LOCKED) and its worker may take the queue for
# drained: such roots' queues are returned (with the due time of one not yet due,
# as epoch seconds) for the enqueue to announce, delivered as the lock ends. The lock
# is the update's own (``FOR NO KEY UPDATE``), not ``FOR UPDATE``: a hand-on of the
# chain, which locks its root ``FOR KEY SHARE`` (see ``_COMPLETE_CTES_ONE``), need not
# wait for the enqueue to commit. Children written in the same transaction (fan-out)
# are marked the same way: no other transaction sees them yet. ``ids`` hold no
# duplicate; when one names no chain its snapshot sees, nothing is locked or written:
# the roots found are returned with no status, and the enqueue refuses with the
# others' ids while the caller's transaction goes on.
LOCK_BLOCKER_CHAINS = """
WITH found AS (
    SELECT r.id FROM {jobs} AS r
    WHERE r.id = ANY(%(ids)s::uuid[]) AND r.id = r.chain_id
),
target AS (
    SELECT r.id FROM {jobs} AS r
    WHERE r.id IN (SELECT f.id FROM found AS f)
      AND (SELECT count(*) FROM found) = cardinality(%(ids)s::uuid[])
    ORDER BY r.id
    FOR NO KEY UPDATE
),
marked AS (
    UPDATE {jobs} AS r
    SET chain_has_dependants = true
    FROM target AS t
    WHERE r.id = t.id
    RETURNING r.id, r.chain_status::text,
        CASE WHEN r.status = 'pending' THEN r.queue END,
        CASE WHEN r.status = 'pending' AND r.scheduled_at > now()
             THEN extract(epoch FROM r.scheduled_at)::float8 END
)
SELECT * FROM marked
UNION ALL
SELECT f.id, NULL, NULL, NULL FROM found AS f
WHERE (SELECT count(*) FROM found) < cardinality(%(ids)s::uuid[])
"""

INSERT_BLOCKERS = """
INSERT INTO {job_blockers} (job_id, blocker_chain_id, position, on_failure)
SELECT * FROM unnest(
    %(job_ids)s::uuid[], %(chain_ids)s::uuid[], %(positions)s::int[], %(policies)s::text[]
)
"""

# How an edge counts for its job, from its blocker chain's root ``r`` (NULL: deleted):
# NULL while the chain runs; met once it completed (or was deleted, or ended under
# "unblock"); failed once it failed or was cancelled otherwise.
_COUNTED = """CASE WHEN r.id IS NULL OR r.chain_status = 'completed' THEN 'met'
             WHEN r.chain_status = 'active' THEN NULL
             WHEN b.on_failure = 'unblock' THEN 'met'
             ELSE 'failed' END"""

# The dependants of ended chains, locked for SETTLE_ENDED: their chains' roots first
# (a later job's; a first job is its own root), ``FOR KEY SHARE`` as a hand-on locks
# one, then the jobs. ``d`` reads the roots' lock as a one-time filter, so the roots
# are locked before any job's row. Edges are found by blocker (job_blockers_blocker_idx):
# one per dependant, whatever else each dependant waits for.
LOCK_BLOCKED_DEPENDANTS = """
WITH dependants AS (
    SELECT d.id, d.chain_id
    FROM {jobs} AS d
    WHERE d.status = 'blocked'
      AND d.id IN (
          SELECT b.job_id FROM {job_blockers} AS b
          WHERE b.blocker_chain_id = ANY(%(chain_ids)s::uuid[])
      )
),
roots AS (
    SELECT r.id FROM {jobs} AS r
    WHERE r.id IN (SELECT p.chain_id FROM dependants AS p WHERE p.id <> p.chain_id)
    ORDER BY r.id
    FOR KEY SHARE OF r
)
SELECT d.id
FROM {jobs} AS d
WHERE d.id IN (SELECT p.id FROM dependants AS p) AND d.status = 'blocked'
  AND (SELECT count(*) FROM roots) >= 0
ORDER BY d.id
FOR UPDATE OF d
"""

# The end of SETTLE_ENDED and COUNT_BLOCKERS: ``v`` holds each blocked job's counters
# as they are to be (id, needed, met, open) and what a failure does (fail, culprit).
# Met reaching the need makes the job pending; met and open together falling short of
# it fails or cancels the job (its first failed edge's policy "fail" wins) and its
# chain, on the root row (the job's own for a first job). Returns the jobs whose status
# changed, for notices (the due time, in seconds since the epoch, of a pending job
# scheduled later) and for settling the next level: the chains that ended.
_SETTLE = """
verdict AS (
    SELECT v.*,
        CASE WHEN v.met >= v.needed THEN 'pending'
             WHEN v.met + v.open >= v.needed THEN 'blocked'
             WHEN v.fail THEN 'failed'
             ELSE 'cancelled' END AS status
    FROM v
),
changed AS (
    UPDATE {jobs} AS j
    SET blockers_needed = w.needed,
        blockers_met = w.met,
        blockers_open = w.open,
        status = w.status::{job_status},
        scheduled_at = CASE WHEN w.status = 'pending' THEN GREATEST(j.scheduled_at, now())
                            ELSE j.scheduled_at END,
        completed_at = CASE WHEN w.status IN ('failed', 'cancelled') THEN now()
                            ELSE j.completed_at END,
        last_attempt_error = CASE WHEN w.status IN ('failed', 'cancelled')
            THEN jsonb_build_object(
                'type', 'BlockerChainEnded',
                'message', 'blocker chain ' || w.culprit || ' failed or was cancelled',
                'traceback', NULL)
            ELSE j.last_attempt_error END,
        chain_status = CASE WHEN j.id = j.chain_id AND w.status IN ('failed', 'cancelled')
                            THEN w.status::{chain_status} ELSE j.chain_status END,
        chain_completed_at = CASE WHEN j.id = j.chain_id AND w.status IN ('failed', 'cancelled')
                                  THEN now() ELSE j.chain_completed_at END
    FROM verdict AS w
    WHERE j.id = w.id AND j.status = 'blocked'
    RETURNING j.id, j.chain_id, w.status, j.queue, j.chain_awaited AS awaited,
        CASE WHEN j.scheduled_at > now() THEN extract(epoch FROM j.scheduled_at) END AS due
),
roots AS (
    UPDATE {jobs} AS r
    SET chain_status = c.status::{chain_status}, chain_completed_at = now()
    FROM changed AS c
    WHERE r.id = c.chain_id AND c.chain_id <> c.id AND c.status IN ('failed', 'cancelled')
    RETURNING r.id, r.chain_awaited AS awaited
)
SELECT c.id, c.chain_id, c.status, c.queue,
    CASE WHEN c.id = c.chain_id THEN c.awaited ELSE COALESCE(rt.awaited, false) END,
    c.due
FROM changed AS c
LEFT JOIN roots AS rt ON rt.id = c.chain_id
WHERE c.status <> 'blocked'
"""

# Settle the status of ``chain_ids`` for the locked dependants ``job_ids``: an end, or a
# failed chain active again after a retry. Each chain's edges to them (by blocker, one
# edge per dependant) are counted as its status now says (``_COUNTED``), and what was
# flipped is added to their counters. An edge already counted so is left alone, so
# settling an end twice changes nothing; one counted failed whose chain was retried
# turns open again (and met once it completes). Never reads a dependant's other edges:
# a child's end costs the same with ten siblings as with ten thousand.
SETTLE_ENDED = f"""
WITH settled AS (
    SELECT r.id, r.chain_status
    FROM {{jobs}} AS r
    WHERE r.id = ANY(%(chain_ids)s::uuid[]) AND r.id = r.chain_id
),
edges AS (
    SELECT b.job_id, b.blocker_chain_id, b.on_failure, b.counted AS was,
        {_COUNTED} AS counted
    FROM settled AS r
    JOIN {{job_blockers}} AS b ON b.blocker_chain_id = r.id
    WHERE b.job_id = ANY(%(job_ids)s::uuid[])
),
flipped AS (
    UPDATE {{job_blockers}} AS b
    SET counted = e.counted
    FROM edges AS e
    WHERE b.job_id = e.job_id AND b.blocker_chain_id = e.blocker_chain_id
      AND e.was IS DISTINCT FROM e.counted
    RETURNING e.job_id, e.blocker_chain_id, e.on_failure, e.was, e.counted
),
tally AS (
    SELECT f.job_id,
        count(*) FILTER (WHERE f.counted = 'met') - count(*) FILTER (WHERE f.was = 'met')
            AS met,
        count(*) FILTER (WHERE f.was IS NULL) - count(*) FILTER (WHERE f.counted IS NULL)
            AS closed,
        bool_or(f.counted = 'failed' AND f.on_failure = 'fail') AS fail,
        min(f.blocker_chain_id::text) FILTER (WHERE f.counted = 'failed') AS culprit
    FROM flipped AS f
    GROUP BY f.job_id
),
v AS (
    SELECT d.id, d.blockers_needed AS needed, d.blockers_met + y.met AS met,
        d.blockers_open - y.closed AS open, y.fail, y.culprit
    FROM tally AS y
    JOIN {{jobs}} AS d ON d.id = y.job_id
    WHERE d.status = 'blocked'
),
{_SETTLE}"""

# Count blocked jobs' edges from scratch (each edge set to how it counts now), with
# ``needs`` (NULL: the job's own, or all its edges for a job that has none yet): as a
# blocked job is inserted, and in the sweep. Reads every edge of each job: once per
# job inserted, and for the few jobs the sweep finds.
COUNT_BLOCKERS = f"""
WITH target AS (
    SELECT t.id, t.need FROM unnest(%(job_ids)s::uuid[], %(needs)s::int[]) AS t(id, need)
),
edges AS (
    SELECT b.job_id, b.blocker_chain_id, b.on_failure, b.counted AS was,
        {_COUNTED} AS counted
    FROM target AS t
    JOIN {{job_blockers}} AS b ON b.job_id = t.id
    LEFT JOIN {{jobs}} AS r ON r.id = b.blocker_chain_id AND r.id = r.chain_id
),
marked AS (
    UPDATE {{job_blockers}} AS b
    SET counted = e.counted
    FROM edges AS e
    WHERE b.job_id = e.job_id AND b.blocker_chain_id = e.blocker_chain_id
      AND e.was IS DISTINCT FROM e.counted
),
tally AS (
    SELECT e.job_id, count(*) AS total,
        count(*) FILTER (WHERE e.counted = 'met') AS met,
        count(*) FILTER (WHERE e.counted IS NULL) AS open,
        bool_or(e.counted = 'failed' AND e.on_failure = 'fail') AS fail,
        min(e.blocker_chain_id::text) FILTER (WHERE e.counted = 'failed') AS culprit
    FROM edges AS e
    GROUP BY e.job_id
),
v AS (
    SELECT d.id, LEAST(COALESCE(t.need, d.blockers_needed, y.total), y.total) AS needed,
        y.met, y.open, y.fail, y.culprit
    FROM target AS t
    JOIN tally AS y ON y.job_id = t.id
    JOIN {{jobs}} AS d ON d.id = t.id
    WHERE d.status = 'blocked'
),
{_SETTLE}"""

# Blocked jobs with an edge not counted as its chain's status says (the chain ended,
# or was retried, and nobody settled it: a process died between ending the chain and
# settling its dependants), locked for COUNT_BLOCKERS as LOCK_BLOCKED_DEPENDANTS locks
# them, but skipping what another transaction holds. A step waiting for a signal is
# blocked too, on no chain: it is not this sweep's to settle. Reads the edges of each
# blocked job up to the first such one.
FIND_RESOLVABLE_BLOCKED = f"""
WITH found AS (
    SELECT d.id, d.chain_id
    FROM {{jobs}} AS d
    WHERE d.status = 'blocked' AND d.wait_signal IS NULL
      AND EXISTS (
          SELECT 1 FROM {{job_blockers}} AS b
          LEFT JOIN {{jobs}} AS r ON r.id = b.blocker_chain_id AND r.id = r.chain_id
          WHERE b.job_id = d.id AND b.counted IS DISTINCT FROM {_COUNTED}
      )
    ORDER BY d.created_at
    LIMIT %(limit)s
),
roots AS (
    SELECT r.id FROM {{jobs}} AS r
    WHERE r.id IN (SELECT f.chain_id FROM found AS f WHERE f.id <> f.chain_id)
    ORDER BY r.id
    FOR KEY SHARE OF r SKIP LOCKED
)
SELECT d.id
FROM {{jobs}} AS d
WHERE d.status = 'blocked'
  AND d.id IN (
      SELECT f.id FROM found AS f
      WHERE f.id = f.chain_id OR f.chain_id IN (SELECT x.id FROM roots AS x)
  )
ORDER BY d.id
FOR UPDATE OF d SKIP LOCKED
"""

# Outputs of a job's blocker chains, in declaration order: the output of each chain's
# last job once the chain completed, and whether the edge counts as met: counted met,
# and among the first ``blockers_needed`` so counted, by position. Chains that end in
# one transaction are settled together, so the edges counted met may be more than the
# need: the step reads the first of them, as many as it needed.
BLOCKER_OUTPUTS = f"""
SELECT b.blocker_chain_id, r.chain_status::text, last.type_name, last.output,
    b.counted IS NOT DISTINCT FROM 'met' AND (
        d.blockers_needed IS NULL
        OR count(*) FILTER (WHERE b.counted = 'met') OVER (ORDER BY b.position)
            <= d.blockers_needed)
FROM {{job_blockers}} AS b
JOIN {{jobs}} AS d ON d.id = b.job_id
LEFT JOIN {{jobs}} AS r ON r.id = b.blocker_chain_id AND r.id = r.chain_id
LEFT JOIN LATERAL {last_job("r")} AS last ON true
WHERE b.job_id = %(job_id)s
ORDER BY b.position
"""

# Cancel whole chains, in two statements. First the active chains' roots are locked
# (in id order, so two cancels cannot deadlock): a hand-on (a completion that inserts
# the chain's next job) locks its chain's root before its job's row, so from here on
# no job of these chains is handed on, and one that was handed on meanwhile has
# committed. Then CANCEL_CHAINS, under a fresh snapshot that sees it: every job not yet
# final becomes cancelled, the root records the chain as cancelled. Running jobs'
# holders learn it from their next renewal (and from the abort notice the client
# publishes in the same transaction); their completions are refused.
LOCK_ACTIVE_CHAINS = """
SELECT r.id FROM {jobs} AS r
WHERE r.id = ANY(%(chain_ids)s::uuid[]) AND r.id = r.chain_id
  AND r.chain_status = 'active'
ORDER BY r.id
FOR UPDATE
"""

CANCEL_CHAINS = f"""
WITH target AS (
    SELECT t.id FROM unnest(%(chain_ids)s::uuid[]) AS t(id)
),
jobs_cancelled AS (
    UPDATE {{jobs}} AS j
    SET status = 'cancelled',
        completed_at = now(),
        leased_by = NULL,
        leased_until = NULL,
        lease_token = NULL,
        chain_status = CASE WHEN j.id = j.chain_id THEN 'cancelled'::{{chain_status}}
                            ELSE j.chain_status END,
        chain_completed_at = CASE WHEN j.id = j.chain_id THEN now()
                                  ELSE j.chain_completed_at END
    FROM target AS t
    WHERE {in_chain("j", "t.id")} AND j.status IN ('blocked', 'pending', 'running')
    RETURNING j.id, j.chain_id, j.status
),
roots AS (
    UPDATE {{jobs}} AS r
    SET chain_status = 'cancelled', chain_completed_at = now()
    FROM target AS t
    WHERE r.id = t.id AND NOT EXISTS (SELECT 1 FROM jobs_cancelled AS c WHERE c.id = r.id)
    RETURNING r.id
)
SELECT t.id, array_remove(array_agg(c.id), NULL)
FROM target AS t
LEFT JOIN jobs_cancelled AS c ON c.chain_id = t.id
GROUP BY t.id
"""

# Which of the given ids are chains or jobs, and the chain each belongs to.
CHAINS_OF = """
SELECT x.id, j.chain_id, r.chain_status::text, j.status::text, j.leased_by
FROM unnest(%(ids)s::uuid[]) AS x(id)
LEFT JOIN {jobs} AS j ON j.id = x.id
LEFT JOIN {jobs} AS r ON r.id = j.chain_id
"""

# Put failed jobs back to work with a fresh set of attempts; ``front`` moves them
# just ahead of the oldest job already waiting in their queue (at their priority), so
# queue-age figures stay meaningful.
RETRY_FAILED = """
UPDATE {jobs} AS j
SET status = 'pending',
    attempt = 0,
    completed_at = NULL,
    scheduled_at = CASE WHEN %(front)s::bool THEN LEAST(now(), (
                       SELECT min(p.scheduled_at) FROM {jobs} AS p
                       WHERE p.status = 'pending' AND p.queue = j.queue
                   )) - interval '1 millisecond'
                   ELSE now() END,
    chain_status = CASE WHEN j.id = j.chain_id THEN 'active'::{chain_status}
                        ELSE j.chain_status END,
    chain_completed_at = CASE WHEN j.id = j.chain_id THEN NULL ELSE j.chain_completed_at END
WHERE j.id = ANY(%(ids)s::uuid[]) AND j.status = 'failed'
RETURNING j.id, j.chain_id, j.queue
"""

REOPEN_CHAINS = """
UPDATE {jobs} AS r
SET chain_status = 'active', chain_completed_at = NULL
WHERE r.id = ANY(%(chain_ids)s::uuid[]) AND r.id = r.chain_id AND r.chain_status = 'failed'
"""

TRIGGER = """
UPDATE {jobs} AS j
SET scheduled_at = now()
WHERE j.id = ANY(%(ids)s::uuid[]) AND j.status = 'pending' AND j.scheduled_at > now()
RETURNING j.id, j.queue
"""

SET_QUEUE_PAUSED = """
INSERT INTO {queues} (name, paused, paused_at, updated_at)
VALUES (%(name)s, %(paused)s, CASE WHEN %(paused)s THEN now() END, now())
ON CONFLICT (name) DO UPDATE
SET paused = EXCLUDED.paused, paused_at = EXCLUDED.paused_at, updated_at = now()
"""

MARK_AWAITED = """
UPDATE {jobs} AS r
SET chain_awaited = true
WHERE r.id = %(chain_id)s AND r.id = r.chain_id AND NOT r.chain_awaited
"""


@dataclass(frozen=True, slots=True)
class ChainStatements:
    lock_blocker_chains: bytes
    insert_blockers: bytes
    lock_blocked_dependants: bytes
    settle_ended: bytes
    count_blockers: bytes
    find_resolvable_blocked: bytes
    blocker_outputs: bytes
    lock_active_chains: bytes
    cancel_chains: bytes
    chains_of: bytes
    retry_failed: bytes
    reopen_chains: bytes
    trigger: bytes
    set_queue_paused: bytes
    mark_awaited: bytes
