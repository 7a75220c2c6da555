"""SQL of flow limits changed at run time: overrides and pauses written to
``job_limits``, what runs against them read back, and the rows no acquire needs any
more deleted (``PRUNE_LIMITS``).

A row per job type (``limit_key`` '') or per key of one; a NULL column keeps what the
code declares. ``cursor_key`` belongs to the acquire (``limits``): no statement here
writes it, and the upsert leaves it as it is. Reads are run unprepared, as the other
operator views: each counts an index range of the limited jobs (``jobs_limit_running_idx``,
``jobs_limit_pending_idx``) and of the starts a rate counts (``job_starts``, which the
acquire keeps to its longest window), never the jobs table.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LimitControlStatements"]

# Each column is set only when its ``set_*`` flag is true (None clears it); the row is
# created when missing. ``paused_until``: the time given, or now plus ``pause_for_s`` on
# the database's clock; with ``extend_pause``, the later of the stored pause and this
# one. Returns the queues of the workers running the type, to announce ready.
CHANGE_LIMITS = """
WITH changed AS (
    INSERT INTO {job_limits} AS o (
        type_name, limit_key, concurrency, key_concurrency, rate_n, rate_per_s,
        key_rate_n, key_rate_per_s, paused_until, updated_at
    )
    VALUES (
        %(type_name)s::text, %(limit_key)s::text, %(concurrency)s::int,
        %(key_concurrency)s::int, %(rate_n)s::int, %(rate_per_s)s::float8,
        %(key_rate_n)s::int, %(key_rate_per_s)s::float8,
        CASE WHEN %(set_pause)s::boolean THEN COALESCE(
            %(paused_until)s::timestamptz, now() + %(pause_for_s)s::float8 * interval '1 second'
        ) END,
        now()
    )
    ON CONFLICT (type_name, limit_key) DO UPDATE SET
        concurrency = CASE WHEN %(set_concurrency)s::boolean
            THEN EXCLUDED.concurrency ELSE o.concurrency END,
        key_concurrency = CASE WHEN %(set_key_concurrency)s::boolean
            THEN EXCLUDED.key_concurrency ELSE o.key_concurrency END,
        rate_n = CASE WHEN %(set_rate)s::boolean THEN EXCLUDED.rate_n ELSE o.rate_n END,
        rate_per_s = CASE WHEN %(set_rate)s::boolean
            THEN EXCLUDED.rate_per_s ELSE o.rate_per_s END,
        key_rate_n = CASE WHEN %(set_key_rate)s::boolean
            THEN EXCLUDED.key_rate_n ELSE o.key_rate_n END,
        key_rate_per_s = CASE WHEN %(set_key_rate)s::boolean
            THEN EXCLUDED.key_rate_per_s ELSE o.key_rate_per_s END,
        paused_until = CASE
            WHEN NOT %(set_pause)s::boolean THEN o.paused_until
            WHEN %(extend_pause)s::boolean THEN greatest(o.paused_until, EXCLUDED.paused_until)
            ELSE EXCLUDED.paused_until END,
        updated_at = now()
    RETURNING 1
)
SELECT DISTINCT q.name
FROM {workers} AS w
CROSS JOIN unnest(w.queues) AS q(name)
WHERE w.status <> 'stopped' AND %(type_name)s::text = ANY(w.job_types)
ORDER BY 1
"""

# Each type asked about and each type with a row: its row's overrides and pause (a pause
# that has passed reads NULL), its limited jobs running, those pending and due, and the
# attempts started in the window of its effective rate (its row's, else the declared
# one given; NULL without a rate) ending now: every start of the type the acquire
# recorded in ``job_starts``, whatever its group (a keyed type records each start under
# its key, or '' without one), as the acquire counts them against the type's rate.
TYPE_USAGE = """
WITH names AS (
    SELECT n AS name FROM unnest(%(type_names)s::text[]) AS n
    UNION
    SELECT o.type_name FROM {job_limits} AS o
)
SELECT n.name, o.concurrency, o.key_concurrency, o.rate_n, o.rate_per_s, o.key_rate_n,
    o.key_rate_per_s, CASE WHEN o.paused_until > now() THEN o.paused_until END,
    (SELECT count(*) FROM {jobs} AS j
     WHERE j.status = 'running' AND j.limit_group IS NOT NULL AND j.type_name = n.name),
    (SELECT count(*) FROM {jobs} AS j
     WHERE j.status = 'pending' AND j.limit_group IS NOT NULL AND j.type_name = n.name
       AND j.scheduled_at <= now()),
    now(),
    CASE WHEN COALESCE(o.rate_n, d.rate_n) IS NOT NULL THEN (
        SELECT count(*) FROM {job_starts} AS s
        WHERE s.type_name = n.name
          AND s.started_at > now() - make_interval(secs => COALESCE(o.rate_per_s, d.rate_per_s))
    ) END
FROM names AS n
LEFT JOIN {job_limits} AS o ON o.type_name = n.name AND o.limit_key = ''
LEFT JOIN unnest(
    %(rated_names)s::text[], %(rate_n)s::int[], %(rate_per_s)s::float8[]
) AS d(name, rate_n, rate_per_s) ON d.name = n.name
ORDER BY n.name
"""

# Per type, up to ``keys`` of its groups closest to their limits, and up to ``keys``
# keys paused now or overridden; each with its running and due pending jobs, its own
# row, and the attempts started in the window of its key rate. A group's limits are
# its key's own row's, else the type's per-key ones (its row's override, else the
# declaration given), as the acquire reads them; its closeness is the larger of running
# over its concurrency limit and started over its rate's count (with neither, its
# running jobs). A group has started attempts only under a key rate: those of its own
# window.
KEY_USAGE = """
WITH types AS (
    SELECT t.name, COALESCE(o.key_concurrency, t.key_concurrency) AS key_concurrency,
        COALESCE(o.key_rate_n, t.key_rate_n) AS key_rate_n,
        COALESCE(o.key_rate_per_s, t.key_rate_per_s) AS key_rate_per_s
    FROM unnest(
        %(type_names)s::text[], %(key_concurrency)s::int[], %(key_rate_n)s::int[],
        %(key_rate_per_s)s::float8[]
    ) AS t(name, key_concurrency, key_rate_n, key_rate_per_s)
    LEFT JOIN {job_limits} AS o ON o.type_name = t.name AND o.limit_key = ''
),
key_rows AS (
    SELECT o.type_name, o.limit_key AS limit_group, o.key_concurrency, o.key_rate_n,
        o.key_rate_per_s, CASE WHEN o.paused_until > now() THEN o.paused_until END AS paused_until
    FROM {job_limits} AS o
    WHERE o.type_name = ANY(%(type_names)s::text[]) AND o.limit_key <> ''
),
running AS (
    SELECT j.type_name, j.limit_group, count(*) AS n
    FROM {jobs} AS j
    WHERE j.status = 'running' AND j.limit_group IS NOT NULL
      AND j.type_name = ANY(%(type_names)s::text[])
    GROUP BY j.type_name, j.limit_group
),
started AS (
    SELECT s.type_name, s.limit_group, count(*) AS n
    FROM types AS t
    JOIN {job_starts} AS s ON s.type_name = t.name
        -- the longest of the type's key rates' windows: one index range, none without
        AND s.started_at > now() - make_interval(secs => greatest(
            t.key_rate_per_s,
            (SELECT max(m.key_rate_per_s) FROM key_rows AS m WHERE m.type_name = t.name)))
    LEFT JOIN key_rows AS k ON k.type_name = s.type_name AND k.limit_group = s.limit_group
    WHERE COALESCE(k.key_rate_n, t.key_rate_n) IS NOT NULL
      AND s.started_at > now() - make_interval(secs => COALESCE(k.key_rate_per_s, t.key_rate_per_s))
    GROUP BY s.type_name, s.limit_group
),
closest AS (
    SELECT g.type_name, g.limit_group,
        row_number() OVER (
            PARTITION BY g.type_name
            ORDER BY COALESCE(greatest(
                r.n::float8 / COALESCE(k.key_concurrency, t.key_concurrency),
                s.n::float8 / COALESCE(k.key_rate_n, t.key_rate_n)
            ), r.n) DESC, g.limit_group
        ) AS rank
    FROM (
        SELECT r.type_name, r.limit_group FROM running AS r
        UNION
        SELECT s.type_name, s.limit_group FROM started AS s
    ) AS g
    JOIN types AS t ON t.name = g.type_name
    LEFT JOIN running AS r ON r.type_name = g.type_name AND r.limit_group = g.limit_group
    LEFT JOIN started AS s ON s.type_name = g.type_name AND s.limit_group = g.limit_group
    LEFT JOIN key_rows AS k ON k.type_name = g.type_name AND k.limit_group = g.limit_group
),
marked AS (
    SELECT k.type_name, k.limit_group,
        row_number() OVER (
            PARTITION BY k.type_name ORDER BY k.paused_until DESC NULLS LAST, k.limit_group
        ) AS rank
    FROM key_rows AS k
    WHERE k.paused_until IS NOT NULL OR k.key_concurrency IS NOT NULL OR k.key_rate_n IS NOT NULL
),
chosen AS (
    SELECT c.type_name, c.limit_group FROM closest AS c WHERE c.rank <= %(keys)s
    UNION
    SELECT m.type_name, m.limit_group FROM marked AS m WHERE m.rank <= %(keys)s
)
SELECT c.type_name, c.limit_group, COALESCE(r.n, 0),
    (SELECT count(*) FROM {jobs} AS j
     WHERE j.status = 'pending' AND j.limit_group = c.limit_group
       AND j.type_name = c.type_name AND j.scheduled_at <= now()),
    k.key_concurrency, k.key_rate_n, k.key_rate_per_s, k.paused_until,
    CASE WHEN COALESCE(k.key_rate_n, t.key_rate_n) IS NOT NULL THEN COALESCE(s.n, 0) END
FROM chosen AS c
JOIN types AS t ON t.name = c.type_name
LEFT JOIN running AS r ON r.type_name = c.type_name AND r.limit_group = c.limit_group
LEFT JOIN started AS s ON s.type_name = c.type_name AND s.limit_group = c.limit_group
LEFT JOIN key_rows AS k ON k.type_name = c.type_name AND k.limit_group = c.limit_group
ORDER BY c.type_name, c.limit_group
"""


# A key's row that holds nothing: no override, no pause to come, no waiting mark. The
# acquire writes its marks and cursor on the type's row alone, so a key's row with a
# mark is none of its own; it is kept all the same, as the age of a mark does not say
# that nobody waits on it (a mark keeps the time of the first acquire that came back
# short for as long as workers go on waiting). A missing key row reads as one whose
# pause has passed, so deleting it changes no acquire.
_IDLE_KEY = """o.limit_key <> ''
      AND (o.paused_until IS NULL OR o.paused_until <= now())
      AND o.concurrency IS NULL AND o.key_concurrency IS NULL
      AND o.rate_n IS NULL AND o.rate_per_s IS NULL
      AND o.key_rate_n IS NULL AND o.key_rate_per_s IS NULL
      AND o.waiting_since IS NULL"""

# Up to ``limit`` idle key rows, and up to ``limit`` recorded starts older than the
# longest window a rate can have, deleted; returns how many of each.
#
# Races: only ``CHANGE_LIMITS`` writes a key's row (an operator's change, in a caller's
# transaction maybe, or an attempt pausing its key). A row it holds locked is skipped
# (SKIP LOCKED: maintenance never waits on a caller's transaction), and left for a
# later round. A row it changed and
# committed after this statement's snapshot is re-read when locked: under READ
# COMMITTED (the adapter's sessions, ``configure_session``) a locking read or a DELETE
# that meets a row updated since its snapshot re-evaluates its WHERE on the newest
# version, so a row given a pause or an override meanwhile no longer qualifies and
# stays. The DELETE repeats the conditions for that reason, rather than trusting the
# ids it was handed. A change that comes after the delete finds no row and inserts
# one (its upsert waits for this statement's commit if it meets the deleted row).
#
# The starts: found type by type (a loose scan of ``job_starts_type_idx``, as there are
# few rated types and many starts), oldest first. Nothing updates a start, so its ctid
# names it until it is deleted; an acquire deleting the same expired starts holds them
# locked, and they are skipped.
PRUNE_LIMITS = f"""
WITH RECURSIVE idle_keys AS (
    SELECT o.type_name, o.limit_key FROM {{job_limits}} AS o
    WHERE {_IDLE_KEY}
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
keys_gone AS (
    DELETE FROM {{job_limits}} AS o
    USING idle_keys AS i
    WHERE o.type_name = i.type_name AND o.limit_key = i.limit_key
      AND {_IDLE_KEY}
    RETURNING 1
),
start_types(name) AS (
    (SELECT s.type_name FROM {{job_starts}} AS s ORDER BY s.type_name LIMIT 1)
    UNION ALL
    SELECT (SELECT s.type_name FROM {{job_starts}} AS s
            WHERE s.type_name > t.name ORDER BY s.type_name LIMIT 1)
    FROM start_types AS t
    WHERE t.name IS NOT NULL
),
old_starts AS (
    SELECT o.ctid
    FROM start_types AS t
    CROSS JOIN LATERAL (
        SELECT s.ctid FROM {{job_starts}} AS s
        WHERE s.type_name = t.name
          AND s.started_at < now() - make_interval(secs => %(starts_older_than_s)s::float8)
        ORDER BY s.started_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS o
    WHERE t.name IS NOT NULL
    LIMIT %(limit)s
),
starts_gone AS (
    DELETE FROM {{job_starts}} AS s
    WHERE s.ctid = ANY(ARRAY(SELECT o.ctid FROM old_starts AS o))
    RETURNING 1
)
SELECT (SELECT count(*) FROM keys_gone), (SELECT count(*) FROM starts_gone)
"""


@dataclass(frozen=True, slots=True)
class LimitControlStatements:
    change_limits: bytes
    type_usage: bytes
    key_usage: bytes
    prune_limits: bytes
