"""SQL for chain orchestration: blockers, cancel, retry, trigger, pause, awaiting.

Blocked jobs are always chain roots (only ``start_chain`` takes blockers). Resolving
them is two statements in one transaction: LOCK_BLOCKED_DEPENDANTS first, so two
transactions ending two blockers of one job serialise on that job's row, then
RESOLVE_BLOCKED under a fresh snapshot that sees whichever committed first.
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
# wait for the enqueue to commit.
LOCK_BLOCKER_CHAINS = """
WITH target AS (
    SELECT r.id FROM {jobs} AS r
    WHERE r.id = ANY(%(ids)s::uuid[]) AND r.id = r.chain_id
    ORDER BY r.id
    FOR NO KEY UPDATE
)
UPDATE {jobs} AS r
SET chain_has_dependants = true
FROM target AS t
WHERE r.id = t.id
RETURNING r.id, r.chain_status::text,
    CASE WHEN r.status = 'pending' THEN r.queue END,
    CASE WHEN r.status = 'pending' AND r.scheduled_at > now()
         THEN extract(epoch FROM r.scheduled_at)::float8 END
"""

INSERT_BLOCKERS = """
INSERT INTO {job_blockers} (job_id, blocker_chain_id, position, on_failure)
SELECT * FROM unnest(
    %(job_ids)s::uuid[], %(chain_ids)s::uuid[], %(positions)s::smallint[], %(policies)s::text[]
)
"""

LOCK_BLOCKED_DEPENDANTS = """
SELECT d.id
FROM {jobs} AS d
WHERE d.status = 'blocked'
  AND d.id IN (
      SELECT b.job_id FROM {job_blockers} AS b
      WHERE b.blocker_chain_id = ANY(%(chain_ids)s::uuid[])
  )
ORDER BY d.id
FOR UPDATE
"""

# Decide each blocked job from its blockers' chain status: all completed (or ended but
# the edge says "unblock") -> pending; an ended blocker whose edge says fail/cancel ->
# that, and the job's chain ends with it. Returns what changed, for notices (with the
# due time, in seconds since the epoch, of a pending job scheduled later) and for
# resolving the next level of dependants.
RESOLVE_BLOCKED = """
WITH verdict AS (
    SELECT d.id,
        bool_and(r.chain_status IS NULL OR r.chain_status = 'completed'
                 OR (r.chain_status <> 'active' AND b.on_failure = 'unblock')) AS ready,
        bool_or(r.chain_status IN ('failed', 'cancelled') AND b.on_failure = 'fail') AS fail,
        bool_or(r.chain_status IN ('failed', 'cancelled') AND b.on_failure = 'cancel')
            AS cancel,
        min(r.id::text) FILTER (WHERE r.chain_status IN ('failed', 'cancelled')) AS culprit
    FROM {jobs} AS d
    JOIN {job_blockers} AS b ON b.job_id = d.id
    LEFT JOIN {jobs} AS r ON r.id = b.blocker_chain_id AND r.id = r.chain_id
    WHERE d.id = ANY(%(job_ids)s::uuid[]) AND d.status = 'blocked'
    GROUP BY d.id
),
changed AS (
    UPDATE {jobs} AS j
    SET status = CASE WHEN v.fail THEN 'failed'::{job_status}
                      WHEN v.cancel THEN 'cancelled'::{job_status}
                      ELSE 'pending'::{job_status} END,
        scheduled_at = GREATEST(j.scheduled_at, now()),
        completed_at = CASE WHEN v.fail OR v.cancel THEN now() END,
        last_attempt_error = CASE WHEN v.fail OR v.cancel THEN jsonb_build_object(
            'type', 'BlockerChainEnded',
            'message', 'blocker chain ' || v.culprit || ' failed or was cancelled',
            'traceback', NULL) ELSE j.last_attempt_error END,
        chain_status = CASE WHEN v.fail THEN 'failed'::{chain_status}
                            WHEN v.cancel THEN 'cancelled'::{chain_status}
                            ELSE j.chain_status END,
        chain_completed_at = CASE WHEN v.fail OR v.cancel THEN now()
                                  ELSE j.chain_completed_at END
    FROM verdict AS v
    WHERE j.id = v.id AND (v.fail OR v.cancel OR v.ready)
    RETURNING j.id, j.chain_id, j.status::text, j.queue, j.chain_awaited,
        CASE WHEN j.scheduled_at > now() THEN extract(epoch FROM j.scheduled_at) END AS due
)
SELECT id, chain_id, status, queue, chain_awaited, due FROM changed
"""

# Blocked jobs whose blockers have all ended: normally resolved when the last blocker
# ended; this catches a worker that died between completing and resolving. A step
# waiting for a signal is blocked too, on no chain: it is not this sweep's to settle.
FIND_RESOLVABLE_BLOCKED = """
SELECT d.id
FROM {jobs} AS d
WHERE d.status = 'blocked' AND d.wait_signal IS NULL
  AND NOT EXISTS (
      SELECT 1 FROM {job_blockers} AS b
      JOIN {jobs} AS r ON r.id = b.blocker_chain_id AND r.id = r.chain_id
      WHERE b.job_id = d.id AND r.chain_status = 'active'
  )
ORDER BY d.created_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

HAS_DEPENDANTS = """
SELECT DISTINCT b.blocker_chain_id
FROM {job_blockers} AS b
WHERE b.blocker_chain_id = ANY(%(chain_ids)s::uuid[])
"""

# Outputs of a job's blocker chains, in declaration order: the output of each chain's
# last job once the chain completed.
BLOCKER_OUTPUTS = f"""
SELECT b.blocker_chain_id, r.chain_status::text, last.type_name, last.output
FROM {{job_blockers}} AS b
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
    resolve_blocked: bytes
    find_resolvable_blocked: bytes
    has_dependants: bytes
    blocker_outputs: bytes
    lock_active_chains: bytes
    cancel_chains: bytes
    chains_of: bytes
    retry_failed: bytes
    reopen_chains: bytes
    trigger: bytes
    set_queue_paused: bytes
    mark_awaited: bytes
