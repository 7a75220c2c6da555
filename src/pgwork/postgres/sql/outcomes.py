"""SQL of an attempt's outcome: complete (batched, one, with a continuation, atomic,
with the next acquire), fail, reschedule.

Completions are fenced by the lease token (a workerless completion by the job not being
final yet); a chain ends when its last job completes, and its root row records that.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgwork.postgres.sql.fragments import appended_history
from pgwork.postgres.sql.leases import (
    ACQUIRED_WIDTH,
    CANDIDATES_ANY_QUEUE,
    CANDIDATES_BY_QUEUE,
    LEASE_CANDIDATES,
    LEASED,
    LEASES,
)

__all__ = ["ATOMIC_REFUSED", "OutcomeStatements", "complete_and_acquire"]

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
        j.chain_has_dependants AS has_dependants, j.type_name, j.limit_group
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
        priority, max_attempts, scheduled_at, trace_context, context, limit_key,
        limit_group
    )
    SELECT %(next_id)s::uuid, %(next_type_name)s::text, %(next_chain_id)s::uuid,
        %(next_chain_type_name)s::text, %(next_chain_index)s::int, %(next_input)s::jsonb,
        'pending', %(next_queue)s::text, %(next_priority)s::smallint,
        %(next_max_attempts)s::int,
        GREATEST(
            now(), %(next_run_at)s::timestamptz,
            now() + %(next_run_after)s::float8 * interval '1 second'
        ),
        %(next_trace_context)s::jsonb, %(next_context)s::jsonb, %(next_limit_key)s::text,
        %(next_limit_group)s::text
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


def complete_and_acquire(
    candidates: str, *, after_lease: str = "", rows: str = LEASE_CANDIDATES
) -> str:
    """A turn's statement over ``candidates`` (a CTE naming the rows to lease);
    ``after_lease``: more CTEs that follow the lease (``leased``); ``rows``: what it
    hands back of the lease (``LEASE_CANDIDATES``, or more marker rows)."""
    more = f",{after_lease}" if after_lease else ""
    return (
        f"WITH {_COMPLETE_CTES_SKIPPING},\ncompleted AS ({_COMPLETE_RESULT}),{candidates},"
        f"{LEASES},"
        f"{LEASED}{more},\nacquired AS ({rows})"
        f"\nSELECT h.*, {', '.join(['NULL'] * ACQUIRED_WIDTH)}"
        f"\nFROM ({_HEAD}) AS h\nUNION ALL{_ACQUIRED_ROWS}"
    )


COMPLETE_AND_ACQUIRE = complete_and_acquire(CANDIDATES_BY_QUEUE)
COMPLETE_AND_ACQUIRE_ANY_QUEUE = complete_and_acquire(CANDIDATES_ANY_QUEUE)

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
""".replace("<appended>", appended_history("j", "f.ran_for", "f.error"))

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


@dataclass(frozen=True, slots=True)
class OutcomeStatements:
    complete: bytes
    complete_skipping: bytes
    complete_one: bytes
    complete_and_continue: bytes
    complete_atomic: bytes
    complete_and_acquire: bytes
    complete_and_acquire_any_queue: bytes
    fail: bytes
    reschedule: bytes
