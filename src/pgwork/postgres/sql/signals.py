"""SQL of signals and the steps that wait for them (docs/design/signals.md).

A signal is a row of ``signals``, inserted in the sender's transaction; a waiting step
is a job with ``wait_signal`` set, inserted by the hand-on that continues its chain.
Neither write looks for the other. Matching pairs them afterwards, in a transaction of
its own at READ COMMITTED: MATCHABLE_NAMES takes, without waiting, the advisory lock of
each name that has something to pair and whose lock no other match holds, then
MATCH_SIGNALS, as the next statement (so under a snapshot taken after the locks),
pairs the oldest pending signals of those names with their oldest waiting steps, both
locked ``FOR UPDATE``. The lock makes the matches of one name take turns: the next
sees what the last committed, so no signal goes to two steps and no two matches each
take half of a pair. A match waits for no lock: a name whose lock another holds is
the caller's to ask for again shortly (the holder's snapshot may predate the commit
that asked). Before that transaction, the same MATCHABLE_NAMES runs alone, in
autocommit, as a probe: every worker that hears a name's notice asks for it, and most
find nothing left to pair, or the name being paired, without a transaction. The sweep
(FIND_UNMATCHED) waits for its names' locks instead (LOCK_SIGNAL_NAMES).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SIGNAL_LOCK", "SignalStatements", "step_waits"]

# The first key of a signal name's lock (a two-key advisory lock; the second key is the
# name's hash): "pgws" read as an int4. Two names whose hashes collide share a lock,
# which only makes their matches take turns.
SIGNAL_LOCK = 0x70677773

# The signal, in the sender's transaction: an insert that reads nothing and locks no
# row but its own, so the sender's isolation level changes nothing. With a channel,
# the ``signal`` notice (already encoded) rides in the same statement, delivered on
# commit.
SEND_SIGNALS = """
WITH sent AS (
    INSERT INTO {signals} (id, name, payload, sent_at)
    SELECT s.id, s.name, s.payload::jsonb, now()
    FROM unnest(%(ids)s::uuid[], %(names)s::text[], %(payloads)s::text[])
        AS s(id, name, payload)
)
SELECT pg_notify(%(channel)s::text, n) FROM unnest(%(notices)s::text[]) AS n
WHERE %(channel)s::text IS NOT NULL
"""

# The sweep's locks: each name's, waited for, in the order of its key, so two sweeps
# of overlapping names cannot deadlock (the lock function is volatile: PostgreSQL
# calls it after sorting). A match's try-locks never wait, so they close no cycle.
LOCK_SIGNAL_NAMES = """
SELECT pg_advisory_xact_lock({signal_lock}, l.k)
FROM (SELECT DISTINCT hashtext(n) AS k FROM unnest(%(names)s::text[]) AS n) AS l
ORDER BY l.k
"""


def step_waits(alias: str) -> str:
    """SQL: job ``alias`` is a step waiting for its signal (``wait_signal``).

    A step is waiting while it has not started: never leased (``started_at``, set by
    its first lease and kept), and blocked (no timeout) or pending and scheduled at its
    timeout still to come. A timed step whose timeout has passed is due to start
    without a signal, whether a worker has leased it yet or not; a step that ran and
    was handed back (``attempt`` back to 0) is past its timeout, or, had its attempt
    put it back for later (``reschedule``, which does not count), has started. The one
    rule: the match, the sweep and the read side (``sql.waiting``) all use it."""
    return (
        f"{alias}.wait_signal IS NOT NULL AND {alias}.attempt = 0"
        f" AND {alias}.started_at IS NULL"
        f"\n              AND ({alias}.status = 'blocked'"
        f" OR ({alias}.status = 'pending' AND {alias}.scheduled_at > now()))"
    )


_WAITING = f"j.wait_signal = n.name AND {step_waits('j')}"

# Run after the names' locks (MATCHABLE_NAMES's, or LOCK_SIGNAL_NAMES for the
# sweep), in the same transaction, for the names locked. Up to ``limit`` of each
# side per name are locked (pending signals, then waiting steps, each in id order);
# ``FOR UPDATE`` re-reads a row another transaction changed meanwhile and drops it if
# it no longer qualifies (a step that started, a signal pruned). The n-th signal of a
# name goes to its n-th step: the signal is consumed, the step becomes pending now.
MATCH_SIGNALS = f"""
WITH names AS (
    SELECT DISTINCT n AS name FROM unnest(%(names)s::text[]) AS n
),
pending AS (
    SELECT s.id, s.name FROM {{signals}} AS s
    WHERE s.id IN (
        SELECT p.id FROM names AS n
        CROSS JOIN LATERAL (
            SELECT s.id FROM {{signals}} AS s
            WHERE s.name = n.name AND s.consumed_by IS NULL
            ORDER BY s.id
            LIMIT %(limit)s
        ) AS p
    ) AND s.consumed_by IS NULL
    ORDER BY s.name, s.id
    FOR UPDATE
),
waiting AS (
    SELECT j.id, j.wait_signal AS name FROM {{jobs}} AS j
    WHERE j.id IN (
        SELECT w.id FROM names AS n
        CROSS JOIN LATERAL (
            SELECT j.id FROM {{jobs}} AS j
            WHERE {_WAITING}
            ORDER BY j.id
            LIMIT %(limit)s
        ) AS w
    ) AND {step_waits("j")}
    ORDER BY j.wait_signal, j.id
    FOR UPDATE
),
pairs AS (
    SELECT p.id AS signal_id, w.id AS job_id, p.name
    FROM (SELECT id, name, row_number() OVER (PARTITION BY name ORDER BY id) AS n
          FROM pending) AS p
    JOIN (SELECT id, name, row_number() OVER (PARTITION BY name ORDER BY id) AS n
          FROM waiting) AS w ON w.name = p.name AND w.n = p.n
),
consumed AS (
    UPDATE {{signals}} AS s
    SET consumed_by = pairs.job_id, consumed_at = now()
    FROM pairs
    WHERE s.id = pairs.signal_id
    RETURNING s.id
),
released AS (
    UPDATE {{jobs}} AS j
    SET status = 'pending', scheduled_at = now(), wait_signal = NULL
    FROM pairs
    WHERE j.id = pairs.job_id
    RETURNING j.id, j.queue
)
SELECT pairs.signal_id, pairs.job_id, pairs.name, r.queue
FROM pairs
JOIN released AS r ON r.id = pairs.job_id
JOIN consumed AS c ON c.id = pairs.signal_id
ORDER BY pairs.name, pairs.signal_id
"""

# Which of ``names`` have both a pending signal and a waiting step, and, of those,
# whether this transaction got the name's lock (``pg_try_advisory_xact_lock``, which
# waits for nothing: false while another transaction holds it). Run twice by a match:
#
# - First as a probe, in autocommit, so the lock is let go as the statement ends: a
#   name it leaves out has nothing to pair as of its snapshot, taken after the commit
#   whose notice (or hand-on) asked for the name. Whatever commits later that could
#   pair it asks for it again, and the sweep catches a name whose asking was lost; so
#   no match need run for it. A name whose lock was held is being paired: the caller
#   asks for it again shortly, without a transaction now.
# - Then as the first statement of the match's transaction, for the names the probe
#   found free: the locks it gets are held to the commit. Its check is of a snapshot
#   taken just before the locks, so a match that committed since the probe (every
#   worker heard the same notice) leaves nothing to pair, and no lock is taken for it.
#
# Two probes of two partial indexes a name, no row locked or written.
MATCHABLE_NAMES = f"""
SELECT n.name, pg_try_advisory_xact_lock({{signal_lock}}, hashtext(n.name)) AS locked
FROM (SELECT DISTINCT n AS name FROM unnest(%(names)s::text[]) AS n) AS n
WHERE EXISTS (SELECT 1 FROM {{signals}} AS s WHERE s.name = n.name AND s.consumed_by IS NULL)
  AND EXISTS (SELECT 1 FROM {{jobs}} AS j WHERE {_WAITING})
ORDER BY n.name
"""

# Names with both a pending signal and a waiting step: each was to be matched after
# its second write committed, which a worker that died then (or a notice lost) left
# undone. A merge of the two partial indexes in name order, stopping at ``limit``.
FIND_UNMATCHED = f"""
SELECT n.name
FROM {{signals}} AS n
WHERE n.consumed_by IS NULL
  AND EXISTS (SELECT 1 FROM {{jobs}} AS j WHERE {_WAITING})
GROUP BY n.name
ORDER BY n.name
LIMIT %(limit)s
"""

# A step's signal, as its attempts read it (none: it started without one).
RECEIVED_SIGNAL = """
SELECT s.id, s.name, s.payload, s.sent_at
FROM {signals} AS s
WHERE s.consumed_by = %(job_id)s::uuid
ORDER BY s.id
LIMIT 1
"""

# Signals sent longer than the retention ago that nothing will read: pending ones
# nobody took, and consumed ones whose step is gone or ended for good (a failed step
# may still be retried, and reads its signal again then). A row a match holds is
# skipped, left for a later call.
PRUNE_SIGNALS = """
WITH gone AS (
    SELECT s.id FROM {signals} AS s
    WHERE s.sent_at < now() - %(older_than_s)s::float8 * interval '1 second'
      AND (s.consumed_by IS NULL OR NOT EXISTS (
          SELECT 1 FROM {jobs} AS j
          WHERE j.id = s.consumed_by
            AND j.status IN ('blocked', 'pending', 'running', 'failed')
      ))
    ORDER BY s.sent_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {signals} AS s
USING gone
WHERE s.id = gone.id
RETURNING s.id
"""

# A waiting continuation: its own statement, apart from the enqueue's (whose hot
# paths know nothing of waiting). Blocked without a timeout; with one (``run_afters``,
# seconds) pending, scheduled when it passes.
INSERT_WAITING_JOBS = """
INSERT INTO {jobs} (
    id, type_name, chain_id, chain_type_name, chain_index, input, status, queue,
    priority, max_attempts, scheduled_at, trace_context, context, limit_key,
    limit_group, wait_signal
)
SELECT
    w.id, w.type_name, w.chain_id, w.chain_type_name, w.chain_index, w.input::jsonb,
    CASE WHEN w.run_after IS NULL THEN 'blocked'::{job_status}
         ELSE 'pending'::{job_status} END,
    w.queue, w.priority, w.max_attempts,
    now() + COALESCE(w.run_after, 0) * interval '1 second',
    w.trace_context::jsonb, w.context::jsonb, w.limit_key, w.limit_group, w.wait_signal
FROM unnest(
    %(ids)s::uuid[], %(type_names)s::text[], %(chain_ids)s::uuid[],
    %(chain_type_names)s::text[], %(chain_indexes)s::int[], %(inputs)s::text[],
    %(queues)s::text[], %(priorities)s::smallint[], %(max_attempts)s::int[],
    %(run_afters)s::float8[], %(trace_contexts)s::text[], %(contexts)s::text[],
    %(limit_keys)s::text[], %(limit_groups)s::text[], %(wait_signals)s::text[]
) AS w(
    id, type_name, chain_id, chain_type_name, chain_index, input, queue, priority,
    max_attempts, run_after, trace_context, context, limit_key, limit_group, wait_signal
)
"""


@dataclass(frozen=True, slots=True)
class SignalStatements:
    send_signals: bytes
    lock_signal_names: bytes
    match_signals: bytes
    matchable_names: bytes
    find_unmatched: bytes
    received_signal: bytes
    prune_signals: bytes
    insert_waiting_jobs: bytes
