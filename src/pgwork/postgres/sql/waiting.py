"""SQL of the read side of waiting: what a chain's current step waits for, the
listing of waiting steps, and the listing of signals (docs/chains.md, "Seeing what
waits").

A step *waits* while it has not started and something other than a worker must
happen first. What it waits for is read from its row alone, by one expression
(``wait_kind``) that every statement here shares:

- ``signal``: the signal rule of the match itself (``signals.step_waits``): blocked
  without a timeout, pending at its timeout still to come;
- ``debounce``: a debounced chain's first job that a later enqueue of its key may
  still move (pending, never started, not yet due);
- ``sleep``: any other job pending for a time still to come that has not run (a
  ``Continue(..., after=...)``, a chain started later, a snoozed attempt handed back);
  a retry's backoff (``attempt`` above 0) is not a wait;
- ``blockers``: blocked on other chains (``job_blockers``), with how many have ended,
  from the step's counters (BLOCKER_COUNTS), never by counting its edges.

A new kind of wait is one more arm of the expression and one more branch of the
listing. The listing is newest first by the step's id (ids are UUIDv7: the order the
steps were written), like ``list_jobs``; each kind is read from the partial index its
rows are in (``jobs_wait_signal_idx``, ``jobs_attention_idx``, ``jobs_acquire_idx``
walked one (queue, priority) at a time from now on), never the table.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgwork.postgres.sql.fragments import last_job
from pgwork.postgres.sql.signals import step_waits

__all__ = ["BLOCKER_COUNTS", "WAIT_KINDS", "WaitingStatements", "wait_kind"]

# Every kind, in the order ``wait_kind`` tests them.
WAIT_KINDS = ("signal", "debounce", "sleep", "blockers")


def _sleeps(alias: str) -> str:
    """SQL: ``alias`` is pending for a time still to come, never having run, and waits
    for no signal (``debounce`` or ``sleep``): a step that started without its signal
    and put itself back for later waits for that time, not for the signal."""
    return (
        f"{alias}.status = 'pending' AND {alias}.scheduled_at > now()"
        f" AND {alias}.attempt = 0"
        f" AND ({alias}.wait_signal IS NULL OR {alias}.started_at IS NOT NULL)"
    )


def _debouncing(alias: str) -> str:
    return f"{alias}.debounce_deadline IS NOT NULL AND {alias}.started_at IS NULL"


def _blocked(alias: str) -> str:
    return f"{alias}.status = 'blocked' AND {alias}.wait_signal IS NULL"


def wait_kind(alias: str) -> str:
    """SQL: what job ``alias`` waits for (one of ``WAIT_KINDS``), NULL if nothing."""
    return f"""CASE
        WHEN {step_waits(alias)} THEN 'signal'
        WHEN {_sleeps(alias)} AND {_debouncing(alias)} THEN 'debounce'
        WHEN {_sleeps(alias)} THEN 'sleep'
        WHEN {_blocked(alias)} THEN 'blockers'
    END"""


# The columns of a wait (``_waiting.waiting_from_row`` reads them in this order), for
# a job row ``w`` whose kind is ``w_kind``: the kind, the step, when it was written,
# until when it waits (a signal's timeout, a sleep's end, a debounce's next start),
# the signal, the debounce's deadline, its blockers and how many of them ended
# (BLOCKER_COUNTS), and the database clock.
_WAIT_COLUMNS = """
    w.kind, w.id, w.type_name, w.chain_id, w.chain_type_name, w.chain_index, w.queue,
    w.created_at,
    CASE WHEN w.status = 'pending' THEN w.scheduled_at END,
    CASE WHEN w.kind = 'signal' THEN w.wait_signal END,
    CASE WHEN w.kind = 'debounce' THEN w.debounce_deadline END,
    b.total, b.ended, now()"""

# How many chains a blocked step ``w`` waits for, and how many of them ended, read
# without counting its edges (a step may wait for 10,000 children). The total is its
# last edge's position + 1: a job's edges are numbered from 0, one per distinct
# blocker, as they are inserted (one entry of job_blockers_position_idx, read from its
# end). Those that ended are the total less the step's ``blockers_open``, the edges its
# counters have not seen end (a failed one counts ended, as a met one does). So the
# figure is the step's own, the one its release goes by: a blocker whose end is not
# settled yet (in the moment after it ends, or until the blockers' sweep after a
# crash) is not ended here, and one that failed and was retried since stays ended
# until it ends again or the sweep counts the step afresh.
BLOCKER_COUNTS = """(
    SELECT t.total, t.total - w.blockers_open AS ended
    FROM (
        SELECT COALESCE(max(e.position) + 1, 0) AS total
        FROM {job_blockers} AS e
        WHERE e.job_id = w.id
    ) AS t
    WHERE w.kind = 'blockers'
)"""

# What the current step (the newest job) of each active chain of ``ids`` waits for;
# no row for a chain whose step waits for nothing (it is ready, running, retrying) or
# that has ended.
CHAIN_WAITS = f"""
SELECT {_WAIT_COLUMNS}
FROM {{jobs}} AS r
CROSS JOIN LATERAL (
    SELECT cur.*, {wait_kind("cur")} AS kind
    FROM {last_job("r")} AS cur
) AS w
LEFT JOIN LATERAL {BLOCKER_COUNTS} AS b ON true
WHERE r.id = ANY(%(ids)s::uuid[]) AND r.id = r.chain_id AND r.chain_status = 'active'
  AND w.kind IS NOT NULL
"""

# The filters every branch of LIST_WAITING shares, on job ``j``.
_LISTED = """
      AND (%(chain_type)s::text IS NULL OR j.chain_type_name = %(chain_type)s::text)
      AND (%(after_id)s::uuid IS NULL OR j.id < %(after_id)s::uuid)
    ORDER BY j.id DESC
    LIMIT %(limit)s"""

# Waiting steps, newest first. Each kind is a branch of its own over the partial index
# its rows are in, and a branch for a kind not asked for is folded away when planned
# (the statement is sent unprepared). Each branch reads its index range whole and
# sorts it (``OFFSET 0`` keeps the planner from walking the primary key newest first
# instead, past every other job). A signal name is a range of
# jobs_wait_signal_idx; a prefix is read from where it starts (``>=``, which holds for
# every name that starts with it) and checked with ``starts_with``. Sleeping steps
# come from jobs_acquire_idx one (queue, priority) at a time, each from now on (a
# loose index scan, as NEXT_DUE's; ``OFFSET 0`` keeps the planner from flattening it
# into one scan of every pending entry): ready jobs, however many, are not read. Only
# the page's rows are read whole again, by primary key.
LIST_WAITING = f"""
WITH RECURSIVE slots AS (
    (SELECT j.queue, j.priority FROM {{jobs}} AS j
     WHERE j.status = 'pending'
       AND (%(kinds)s::text[] && ARRAY['sleep', 'debounce'])
     ORDER BY j.queue, j.priority
     LIMIT 1)
    UNION ALL
    SELECT n.queue, n.priority
    FROM slots AS s
    CROSS JOIN LATERAL (
        SELECT j.queue, j.priority FROM {{jobs}} AS j
        WHERE j.status = 'pending' AND (j.queue, j.priority) > (s.queue, s.priority)
        ORDER BY j.queue, j.priority
        LIMIT 1
    ) AS n
),
page AS (
    (SELECT j.id FROM (
         SELECT j.id, j.chain_type_name FROM {{jobs}} AS j
         WHERE {step_waits("j")}
           AND 'signal' = ANY(%(kinds)s::text[])
           AND (%(signal)s::text IS NULL OR j.wait_signal = %(signal)s::text)
           AND (%(prefix)s::text IS NULL
                OR (j.wait_signal >= %(prefix)s::text
                    AND starts_with(j.wait_signal, %(prefix)s::text)))
         OFFSET 0
     ) AS j
     WHERE true{_LISTED})
    UNION ALL
    (SELECT j.id FROM (
         SELECT j.id, j.chain_type_name FROM {{jobs}} AS j
         WHERE {_blocked("j")} AND 'blockers' = ANY(%(kinds)s::text[])
         OFFSET 0
     ) AS j
     WHERE true{_LISTED})
    UNION ALL
    (SELECT j.id FROM slots AS s
     CROSS JOIN LATERAL (
         SELECT j.id FROM {{jobs}} AS j
         WHERE j.status = 'pending' AND j.queue = s.queue AND j.priority = s.priority
           AND {_sleeps("j")}
           AND (CASE WHEN {_debouncing("j")} THEN 'debounce' ELSE 'sleep' END)
               = ANY(%(kinds)s::text[])
           AND (%(chain_type)s::text IS NULL OR j.chain_type_name = %(chain_type)s::text)
           AND (%(after_id)s::uuid IS NULL OR j.id < %(after_id)s::uuid)
         OFFSET 0
     ) AS j
     ORDER BY j.id DESC
     LIMIT %(limit)s)
    ORDER BY id DESC
    LIMIT %(limit)s
)
SELECT {_WAIT_COLUMNS}
FROM page AS p
CROSS JOIN LATERAL (
    SELECT j.*, {wait_kind("j")} AS kind FROM {{jobs}} AS j WHERE j.id = p.id
) AS w
LEFT JOIN LATERAL {BLOCKER_COUNTS} AS b ON true
WHERE w.kind IS NOT NULL
ORDER BY w.id DESC
"""

# Signals, newest first (ids are UUIDv7, made as each is sent): pending ones from
# signals_pending_idx (one name is a range of it; a prefix starts where it does, as in
# LIST_WAITING), or every signal kept, consumed ones included, by primary key.
LIST_SIGNALS = """
SELECT s.id, s.name, s.payload::text, s.sent_at, s.consumed_by, s.consumed_at, now()
FROM {signals} AS s
WHERE (NOT %(pending)s::bool OR s.consumed_by IS NULL)
  AND (%(name)s::text IS NULL OR s.name = %(name)s::text)
  AND (%(prefix)s::text IS NULL
       OR (s.name >= %(prefix)s::text AND starts_with(s.name, %(prefix)s::text)))
  AND (%(after_id)s::uuid IS NULL OR s.id < %(after_id)s::uuid)
ORDER BY s.id DESC
LIMIT %(limit)s
"""


@dataclass(frozen=True, slots=True)
class WaitingStatements:
    chain_waits: bytes
    list_waiting: bytes
    list_signals: bytes
