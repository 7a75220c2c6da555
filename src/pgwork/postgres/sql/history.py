"""SQL of the job history: rolling ended jobs up into buckets, pruning, reading.

The histogram's bins (``DURATION_BINS_S``) are constants of the stored format, written into
the text once here.

How the rollup stays exact with several workers and with retention:

* ``job_history_progress.rolled_up_to`` (W): every job that ended before W is counted.
  A rollup locks that row (``LOCK_PROGRESS``, SKIP LOCKED: a second maintenance run
  skips), counts the ended jobs in ``[W, E)`` from jobs_ended_idx and moves W to E in
  the same transaction (``ROLL_UP``), so a range is counted once.
* E never passes the *horizon*: a job's ``completed_at`` is its ending transaction's
  ``now()``, its start, so a transaction still open can commit an end before the
  present. The horizon is the start of the oldest transaction open in this database
  (``pg_stat_activity``, read in the statement before the one whose snapshot reads the
  jobs), a second before now at the latest: every end before it was committed before
  that snapshot. A transaction open longer than ``max_lag`` no longer holds it back.
* Retention locks the same row before it deletes, and counts the ended jobs it deletes
  at or after W (``queries.DELETE_EXPIRED_CHAINS``): what it removes before
  the rollup reached it is counted by retention, what it removes after, by the rollup.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgwork.adapters.history import DURATION_BINS_S

__all__ = ["HistoryStatements", "count_into_history", "ended_row"]

_BINS = "ARRAY[" + ", ".join(repr(float(b)) for b in DURATION_BINS_S) + "]::float8[]"
_SLOTS = range(len(DURATION_BINS_S) + 1)

# The figures of one ended job, from a row ``{alias}`` with the jobs' columns (see
# ``pgwork.adapters.history`` for what wait and run are).
_ENDED_ROW = """
    {alias}.queue, {alias}.type_name, {alias}.status, {alias}.completed_at,
    CASE WHEN {alias}.attempt = 1 AND {alias}.started_at IS NOT NULL
         THEN GREATEST(extract(epoch FROM {alias}.started_at - {alias}.scheduled_at), 0)
    END::float8 AS wait_s,
    CASE WHEN {alias}.started_at IS NOT NULL
         THEN GREATEST(extract(epoch FROM {alias}.completed_at
                       - GREATEST({alias}.started_at, {alias}.scheduled_at)), 0)
    END::float8 AS run_s"""


def _histogram(column: str) -> str:
    counts = (f"count(*) FILTER (WHERE width_bucket(e.{column}, {_BINS}) = {k})" for k in _SLOTS)
    return "ARRAY[" + ", ".join(counts) + "]::bigint[]"


def _added(column: str) -> str:
    sums = (f"h.{column}[{k + 1}] + EXCLUDED.{column}[{k + 1}]" for k in _SLOTS)
    return "ARRAY[" + ", ".join(sums) + "]::bigint[]"


def _summed(column: str) -> str:
    sums = (f"sum(h.{column}[{k + 1}])" for k in _SLOTS)
    return "ARRAY[" + ", ".join(sums) + "]::bigint[]"


_COLUMNS = """bucket_seconds, queue, type_name, bucket_start, completed, failed,
        wait_count, wait_sum_s, wait_max_s, wait_hist,
        run_count, run_sum_s, run_max_s, run_hist"""


def count_into_history(ended: str, widths: str) -> str:
    """An ``INSERT`` adding the jobs of CTE ``ended`` (columns of ``_ENDED_ROW``) to
    the buckets of each width in ``widths`` (an expression of ``int[]`` seconds): of
    their queue and type, of their queue (type ''), and of all (queue and type '')."""
    return f"""
    INSERT INTO {{job_history}} AS h ({_COLUMNS})
    SELECT e.seconds, COALESCE(e.queue, ''), COALESCE(e.type_name, ''), e.bucket_start,
           count(*) FILTER (WHERE e.status = 'completed'),
           count(*) FILTER (WHERE e.status = 'failed'),
           count(e.wait_s), COALESCE(sum(e.wait_s), 0), COALESCE(max(e.wait_s), 0),
           {_histogram("wait_s")},
           count(e.run_s), COALESCE(sum(e.run_s), 0), COALESCE(max(e.run_s), 0),
           {_histogram("run_s")}
    FROM (
        SELECT w.seconds,
               to_timestamp(floor(extract(epoch FROM x.completed_at) / w.seconds) * w.seconds)
                   AS bucket_start,
               x.*
        FROM {ended} AS x CROSS JOIN unnest({widths}) AS w(seconds)
    ) AS e
    GROUP BY GROUPING SETS (
        (e.seconds, e.bucket_start, e.queue, e.type_name),
        (e.seconds, e.bucket_start, e.queue),
        (e.seconds, e.bucket_start)
    )
    ON CONFLICT (bucket_seconds, queue, type_name, bucket_start) DO UPDATE SET
        completed = h.completed + EXCLUDED.completed,
        failed = h.failed + EXCLUDED.failed,
        wait_count = h.wait_count + EXCLUDED.wait_count,
        wait_sum_s = h.wait_sum_s + EXCLUDED.wait_sum_s,
        wait_max_s = GREATEST(h.wait_max_s, EXCLUDED.wait_max_s),
        wait_hist = {_added("wait_hist")},
        run_count = h.run_count + EXCLUDED.run_count,
        run_sum_s = h.run_sum_s + EXCLUDED.run_sum_s,
        run_max_s = GREATEST(h.run_max_s, EXCLUDED.run_max_s),
        run_hist = {_added("run_hist")}
    RETURNING 1"""


def ended_row(alias: str) -> str:
    """The select list of ``_ENDED_ROW`` over row ``alias``."""
    return _ENDED_ROW.format(alias=alias)


# The progress row, locked for this transaction: where the next batch starts (the
# progress, or the start of the keep period when that is later) and the horizon
# (module docstring). No row: another rollup or a retention sweep holds it.
LOCK_PROGRESS = """
SELECT GREATEST(p.rolled_up_to, now() - %(keep_s)s * interval '1 second'),
       GREATEST(
           now() - %(max_lag_s)s * interval '1 second',
           LEAST(now() - %(settle_s)s * interval '1 second',
                 (SELECT min(a.xact_start) FROM pg_stat_activity AS a
                  WHERE a.datname = current_database()
                    AND a.backend_type = 'client backend'
                    AND a.pid <> pg_backend_pid())))
FROM {job_history_progress} AS p
FOR UPDATE OF p SKIP LOCKED
"""

# Count the jobs that ended in [since, upto) into every width's buckets and move the
# progress there. ``upto`` is the end time of the ``limit``-th job after ``since``
# (jobs_ended_idx in order; a job that ended at the same instant stays for the next
# batch), or the horizon when fewer are left. When more than ``limit`` jobs share the
# instant ``since`` they are taken whole. The first row: jobs counted, the new
# progress, whether the horizon was reached.
ROLL_UP = f"""
WITH cut AS (
    SELECT j.completed_at
    FROM {{jobs}} AS j
    WHERE j.status IN ('completed', 'failed')
      AND j.completed_at >= %(since)s AND j.completed_at < %(horizon)s
    ORDER BY j.completed_at
    OFFSET %(limit)s
    LIMIT 1
), bound AS (
    SELECT COALESCE(
        (SELECT c.completed_at FROM cut AS c WHERE c.completed_at > %(since)s),
        (SELECT min(j.completed_at) FROM {{jobs}} AS j, cut AS c
         WHERE j.status IN ('completed', 'failed')
           AND j.completed_at > %(since)s AND j.completed_at < %(horizon)s),
        %(horizon)s::timestamptz) AS upto
), ended AS (
    SELECT {ended_row("j")}
    FROM {{jobs}} AS j, bound AS b
    WHERE j.status IN ('completed', 'failed')
      AND j.completed_at >= %(since)s AND j.completed_at < b.upto
), counted AS ({count_into_history("ended", "%(widths)s::int[]")}
), moved AS (
    UPDATE {{job_history_progress}} AS p
    SET rolled_up_to = GREATEST(p.rolled_up_to, b.upto), updated_at = now()
    FROM bound AS b
    RETURNING p.rolled_up_to
)
SELECT (SELECT count(*) FROM ended), (SELECT m.rolled_up_to FROM moved AS m),
       (SELECT b.upto >= %(horizon)s FROM bound AS b), (SELECT count(*) FROM counted)
"""

# Buckets of each width older than that width's keep period.
PRUNE_HISTORY = """
WITH gone AS (
    DELETE FROM {job_history} AS h
    USING unnest(%(widths)s::int[], %(keep_s)s::float8[]) AS k(seconds, keep_s)
    WHERE h.bucket_seconds = k.seconds
      AND h.bucket_start < now() - k.keep_s * interval '1 second'
    RETURNING 1
)
SELECT count(*) FROM gone
"""

_SINCE = """to_timestamp(
    floor((extract(epoch FROM now()) - %(window_s)s) / %(align)s) * %(align)s)"""

_SUMS = f"""
       sum(h.completed), sum(h.failed),
       sum(h.wait_count), sum(h.wait_sum_s), max(h.wait_max_s), {_summed("wait_hist")},
       sum(h.run_count), sum(h.run_sum_s), max(h.run_max_s), {_summed("run_hist")}"""

# A window ending now, from the start of the ``align`` seconds it begins in. Kind 1:
# the window summed per ``step`` seconds from buckets of width ``width``, over one row
# per bucket: the grand total (queue and type ''), a queue's total (type ''), one
# queue and type, or one type in every queue (queue <> ''), as the filters ask; the
# key leads with width, queue and type, so that is one range per queue read. Kind 2:
# each queue and type, summed over the window from the buckets of width ``group_width``
# (coarser: fewer rows per queue and type). The first row (kind 0) carries the clock,
# the progress and the window's start.
READ_HISTORY = f"""
SELECT 0 AS kind, now(), NULL::text, NULL::text, 0::numeric, 0::numeric,
       0::numeric, 0::float8, 0::float8, NULL::bigint[],
       0::numeric, 0::float8, 0::float8, NULL::bigint[],
       (SELECT NULLIF(p.rolled_up_to, '-infinity') FROM {{job_history_progress}} AS p),
       {_SINCE}
UNION ALL
(SELECT 1, to_timestamp(floor(extract(epoch FROM h.bucket_start) / %(step)s) * %(step)s),
       NULL, NULL, {_SUMS}, NULL, NULL
FROM {{job_history}} AS h
WHERE h.bucket_seconds = %(width)s
  AND h.type_name = COALESCE(%(type_name)s::text, '')
  AND CASE WHEN %(queue)s::text IS NOT NULL THEN h.queue = %(queue)s::text
           WHEN %(type_name)s::text IS NOT NULL THEN h.queue <> ''
           ELSE h.queue = '' END
  AND h.bucket_start >= {_SINCE}
GROUP BY 2
ORDER BY 2)
UNION ALL
(SELECT 2, NULL, h.queue, h.type_name, {_SUMS}, NULL, NULL
FROM {{job_history}} AS h
WHERE h.bucket_seconds = %(group_width)s
  AND h.queue <> '' AND h.type_name <> ''
  AND (%(queue)s::text IS NULL OR h.queue = %(queue)s::text)
  AND (%(type_name)s::text IS NULL OR h.type_name = %(type_name)s::text)
  AND h.bucket_start >= {_SINCE}
GROUP BY 3, 4)
"""


@dataclass(frozen=True, slots=True)
class HistoryStatements:
    lock_progress: bytes
    roll_up: bytes
    prune_history: bytes
    read_history: bytes
