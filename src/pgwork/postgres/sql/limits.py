"""SQL of flow control: acquiring within each job type's limits, fairly across keys.

A limited acquire runs in a transaction of its own that first takes, in name order, a
transaction-level advisory lock per limited type it may lease (``LOCK_TYPES``), and
only then the acquire (``ACQUIRE_LIMITED``, or ``COMPLETE_AND_ACQUIRE_LIMITED`` with
the finished batch's completions). Under READ COMMITTED each statement takes its
snapshot when it starts, so the acquire's snapshot is taken after the locks: every
other acquire that leased jobs of those types has committed by then, and the jobs it
counts as running are all of them. Jobs leave ``running`` without the lock (completed,
failed, reaped): a snapshot that still counts one only under-fills, it never lets more
run than the limit.

Jobs of a limited type carry a ``limit_group`` from their enqueue: the limit key given,
or ``''`` (a type limited as a whole, or a keyed type's jobs enqueued without a key,
which share one group). Jobs of other types have none, so the two indexes over groups
(pending, running) hold limited jobs only and cost nothing to the rest.

Fair service across groups: the acquire walks the groups that have pending jobs in
key order, starting after the group it served last (``job_limits.cursor_key``) and
wrapping around, a few index probes per group, and takes the first job of each group
before the second of any; the walk stops once it has found as many groups with room
as it can fill, passing over those at their key limit or paused. The cursor moves to
the last group served.

Every limit is the declaration unless an operator's row in ``job_limits`` overrides
it: the type's row (``limit_key`` '') for the type's limits, its default key limit
and its pause; a key's own row for that key's limit and pause.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pgwork.postgres.sql.leases import ACQUIRED_WIDTH, LEASE_CANDIDATES, LEASED, LEASES
from pgwork.postgres.sql.outcomes import complete_and_acquire

__all__ = [
    "KINDS",
    "LIMIT_LOCK",
    "OPENING_HORIZON_S",
    "OPENS",
    "WAITED",
    "LimitStatements",
    "variant",
]

# The first key of a limited type's lock (a two-key advisory lock; the second key is the
# type name's hash): "pgwl" read as an int4. Two types whose names hash alike share a
# lock, which only serialises their acquires.
LIMIT_LOCK = 0x7067776C

# Also sets ``plan_cache_mode`` for the transaction: the acquire's custom plans cost
# more to make than the statement costs to run, and its generic plan is as good (the
# parameters are a worker's constant arrays), so it is planned once per connection
# (``python -m bench.cpu --only drain,limited`` measures both).
LOCK_TYPES = """
SELECT set_config('plan_cache_mode', 'force_generic_plan', true), (
    SELECT count(pg_advisory_xact_lock({limit_lock}, hashtext(t.name)))
    FROM (SELECT n AS name FROM unnest(%(lock_names)s::text[]) AS n ORDER BY n) AS t
)
"""

# The limited types this acquire may lease: the worker's declared limits (NULL: none),
# overridden by an operator's row in ``job_limits``, less what runs now; ``most`` caps
# what this acquire takes of the type (the worker's own cap less what it holds). A type
# paused until later has no room.
_ROOM = """
clock AS MATERIALIZED (SELECT clock_timestamp() AS at),
declared AS (
    SELECT t.name,
        COALESCE(o.concurrency, t.concurrency) AS concurrency,
        COALESCE(o.key_concurrency, t.key_concurrency) AS key_concurrency,
        COALESCE(o.rate_n, t.rate_n) AS rate_n,
        COALESCE(o.rate_per_s, t.rate_per_s) AS rate_per_s,
        COALESCE(o.key_rate_n, t.key_rate_n) AS key_rate_n,
        COALESCE(o.key_rate_per_s, t.key_rate_per_s) AS key_rate_per_s,
        t.most,
        COALESCE(o.cursor_key, '') AS cursor_key,
        COALESCE(o.paused_until > now(), false) AS paused,
        t.key_concurrency IS NOT NULL OR t.key_rate_n IS NOT NULL AS keyed,
        o.waiting_since
    FROM unnest(
        %(limited_names)s::text[], %(limited_concurrency)s::int[],
        %(limited_key_concurrency)s::int[], %(limited_most)s::int[],
        %(limited_rate_n)s::int[], %(limited_rate_per_s)s::float8[],
        %(limited_key_rate_n)s::int[], %(limited_key_rate_per_s)s::float8[]
    ) AS t(name, concurrency, key_concurrency, most, rate_n, rate_per_s, key_rate_n,
           key_rate_per_s)
    LEFT JOIN {job_limits} AS o ON o.type_name = t.name AND o.limit_key = ''
),
room AS (
    SELECT d.name, d.key_concurrency, d.cursor_key, d.keyed, d.waiting_since, d.rate_n,
        d.rate_per_s, d.key_rate_n, d.key_rate_per_s,
        CASE WHEN d.paused THEN 0 ELSE greatest(least(
            d.concurrency - (SELECT count(*) FROM {jobs} AS r
                             WHERE r.status = 'running' AND r.limit_group IS NOT NULL
                               AND r.type_name = d.name)/*freed-type*/,
            d.most,
            %(limit)s/*rate-type*/
        ), 0) END::int AS room
    FROM declared AS d
)"""

# The next group after ``{after}`` with pending jobs of the type, or (``{wrap}``) the
# first from the start of the key order up to the cursor.
_NEXT_GROUP = """
        (SELECT j.limit_group, {wrapped} AS wrapped FROM {{jobs}} AS j
         WHERE j.status = 'pending' AND j.limit_group IS NOT NULL
           AND j.type_name = rm.name AND j.limit_group > {after}{bound}
         ORDER BY j.limit_group LIMIT 1)
        UNION ALL
        (SELECT j.limit_group, true FROM {{jobs}} AS j
         WHERE {wrap} AND j.status = 'pending' AND j.limit_group IS NOT NULL
           AND j.type_name = rm.name AND j.limit_group <= rm.cursor_key
         ORDER BY j.limit_group LIMIT 1)
        LIMIT 1"""

_FIRST_GROUP = _NEXT_GROUP.format(wrapped="false", after="rm.cursor_key", bound="", wrap="true")
_FOLLOWING_GROUP = _NEXT_GROUP.format(
    wrapped="w.wrapped",
    after="w.limit_group",
    bound="\n           AND (NOT w.wrapped OR j.limit_group <= rm.cursor_key)",
    wrap="NOT w.wrapped",
)

# What one group ``{g}`` may start: its key limit (the key's own row in ``job_limits``,
# else the type's) less what runs in it; nothing while the key is paused. A type
# limited as a whole (no key limit) leaves each group the type's room.
_GROUP_ROOM = """
        CROSS JOIN LATERAL (
            SELECT CASE WHEN COALESCE(k.paused_until > now(), false) THEN 0
                ELSE greatest(least(
                    COALESCE(k.key_concurrency, rm.key_concurrency) - (
                        SELECT count(*) FROM {{jobs}} AS r
                        WHERE r.status = 'running' AND r.limit_group = {g}.limit_group
                          AND r.type_name = rm.name)/*freed-group:{g}*/,
                    rm.room/*rate-group:{g}*/
                ), 0) END::int AS room
            FROM (SELECT 1) AS one
            LEFT JOIN {{job_limits}} AS k
                ON k.type_name = rm.name AND k.limit_key = {g}.limit_group
                AND {g}.limit_group <> ''
        ) AS {g}r"""

# The groups to serve, in the walk's order (``pos``), each with the room it has. The
# walk stops once it has found as many groups with room as the type has room (each has
# a pending job; a group at its key limit or paused is passed over, not waited on), or
# when it has come round to where it started.
_GROUPS = f"""
groups AS (
    SELECT rm.name, w.limit_group, w.pos, w.room
    FROM room AS rm
    CROSS JOIN LATERAL (
        WITH RECURSIVE walk(limit_group, pos, wrapped, room, filled) AS (
            SELECT f.limit_group, 1, f.wrapped, fr.room, (fr.room > 0)::int
            FROM ({_FIRST_GROUP}
            ) AS f{_GROUP_ROOM.format(g="f")}
            UNION ALL
            SELECT n.limit_group, w.pos + 1, n.wrapped, nr.room, w.filled + (nr.room > 0)::int
            FROM walk AS w
            CROSS JOIN LATERAL ({_FOLLOWING_GROUP}
            ) AS n{_GROUP_ROOM.format(g="n")}
            WHERE w.filled < rm.room
        )
        SELECT walk.limit_group, walk.pos, walk.room FROM walk WHERE walk.room > 0
    ) AS w
    WHERE rm.room > 0 AND rm.keyed
)"""

# Each group's first jobs, as many as its room allows; ``round`` is a job's place
# within its group, so sorting by it takes every group's first job before any group's
# second.
_LIMITED = """
limited AS (
    SELECT g.name, g.limit_group, g.pos, rm.room, c.id, c.ctid, c.queue, c.priority,
        c.scheduled_at,
        row_number() OVER (PARTITION BY g.name, g.limit_group
                           ORDER BY c.priority, c.scheduled_at) AS round
    FROM groups AS g
    JOIN room AS rm ON rm.name = g.name
    CROSS JOIN LATERAL (
        SELECT j.id, j.ctid, j.queue, j.priority, j.scheduled_at
        FROM {jobs} AS j
        WHERE j.status = 'pending' AND j.limit_group = g.limit_group AND j.type_name = g.name
          AND j.scheduled_at <= now() AND j.queue = ANY(%(queues)s::text[])
        ORDER BY j.priority, j.scheduled_at
        LIMIT g.room
        FOR UPDATE OF j SKIP LOCKED
    ) AS c
),
within AS (
    SELECT l.*, row_number() OVER (PARTITION BY l.name ORDER BY l.round, l.pos) AS nth
    FROM limited AS l
)"""

# A type limited as a whole has one group and no walk: its first jobs, as many as its
# room allows.
_WHOLE = """
whole AS (
    SELECT rm.name, c.id, c.ctid, c.queue, c.priority, c.scheduled_at
    FROM room AS rm
    CROSS JOIN LATERAL (
        SELECT j.id, j.ctid, j.queue, j.priority, j.scheduled_at
        FROM {jobs} AS j
        WHERE j.status = 'pending' AND j.limit_group = '' AND j.type_name = rm.name
          AND j.scheduled_at <= now() AND j.queue = ANY(%(queues)s::text[])
        ORDER BY j.priority, j.scheduled_at
        LIMIT rm.room
        FOR UPDATE OF j SKIP LOCKED
    ) AS c
    WHERE rm.room > 0 AND NOT rm.keyed
)"""

# The worker's other types, as an acquire without limits takes them.
_FREE = """
free AS (
    SELECT c.id, c.ctid, c.queue, c.priority, c.scheduled_at
    FROM unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT j.id, j.ctid, j.queue, j.priority, j.scheduled_at
        FROM {jobs} AS j
        WHERE j.status = 'pending' AND j.queue = q.name AND j.scheduled_at <= now()
          AND j.type_name = ANY(%(free_names)s::text[])
        ORDER BY j.priority, j.scheduled_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    -- No other type: no scan of the queues at all.
    WHERE cardinality(%(free_names)s::text[]) > 0
)"""

# The types only this worker caps (``most``, no limit shared with other workers): as
# many as each cap leaves room for, with no lock and no group.
_CAPPED = """
capped AS (
    SELECT c.id, c.ctid, c.queue, c.priority, c.scheduled_at
    FROM unnest(%(capped_names)s::text[], %(capped_most)s::int[]) AS t(name, most)
    CROSS JOIN LATERAL (
        SELECT j.id, j.ctid, j.queue, j.priority, j.scheduled_at
        FROM {jobs} AS j
        WHERE j.status = 'pending' AND j.queue = ANY(%(queues)s::text[])
          AND j.scheduled_at <= now() AND j.type_name = t.name
        ORDER BY j.priority, j.scheduled_at
        LIMIT greatest(least(t.most, %(limit)s), 0)
        FOR UPDATE SKIP LOCKED
    ) AS c
)"""

# Each kind of type a limited acquire may lease, as a branch of its candidates: the
# columns are (id, ctid, queue, round, priority, scheduled_at, name, limit_group, pos).
_BRANCHES = {
    "free": """
        SELECT f.id, f.ctid, f.queue, 1::bigint, f.priority, f.scheduled_at,
            NULL::text, NULL::text, 0
        FROM free AS f""",
    "capped": """
        SELECT k.id, k.ctid, k.queue, 1::bigint, k.priority, k.scheduled_at,
            NULL::text, NULL::text, 0
        FROM capped AS k""",
    "whole": """
        SELECT h.id, h.ctid, h.queue, 1::bigint, h.priority, h.scheduled_at, h.name,
            NULL::text, 0
        FROM whole AS h""",
    "keyed": """
        SELECT w.id, w.ctid, w.queue, w.round, w.priority, w.scheduled_at, w.name,
            w.limit_group, w.pos
        FROM within AS w
        WHERE w.nth <= w.room""",
}
_CTES = {
    "free": [_FREE],
    "capped": [_CAPPED],
    "whole": [_WHOLE],
    "keyed": [_GROUPS, _LIMITED],
}


# What a turn's own completions free (``done``: its completed jobs, which its snapshot
# still counts as running): the room they leave is taken in the same statement.
_FREED = {
    "/*freed-type*/": """ + (SELECT count(*) FROM done AS x
                                WHERE x.type_name = d.name AND x.limit_group IS NOT NULL)""",
    "/*freed-group:f*/": """ + (SELECT count(*) FROM done AS x
                           WHERE x.type_name = rm.name AND x.limit_group = f.limit_group)""",
    "/*freed-group:n*/": """ + (SELECT count(*) FROM done AS x
                           WHERE x.type_name = rm.name AND x.limit_group = n.limit_group)""",
}


# What a rate leaves: its count less the attempts started in its last window (one
# index range of ``job_starts``, its clock read once per statement, after the locks).
_RATED = {
    "/*rate-type*/": """,
            CASE WHEN d.rate_n IS NULL THEN NULL ELSE d.rate_n - (
                SELECT count(*) FROM {job_starts} AS s
                WHERE s.type_name = d.name
                  AND s.started_at > (SELECT c.at FROM clock AS c)
                      - make_interval(secs => d.rate_per_s)) END""",
    **{
        f"/*rate-group:{g}*/": f""",
                    CASE WHEN COALESCE(k.key_rate_n, rm.key_rate_n) IS NULL THEN NULL
                    ELSE COALESCE(k.key_rate_n, rm.key_rate_n) - (
                        SELECT count(*) FROM {{job_starts}} AS s
                        WHERE s.type_name = rm.name AND s.limit_group = {g}.limit_group
                          AND s.started_at > (SELECT c.at FROM clock AS c) - make_interval(
                              secs => COALESCE(k.key_rate_per_s, rm.key_rate_per_s))) END"""
        for g in ("f", "n")
    },
}


def _counting(text: str, completing: bool, rated: bool = False) -> str:
    """``text`` with the room a turn's completions free counted in (``completing``),
    or without; and with what the rates leave (``rated``), or without."""
    for marker, freed in _FREED.items():
        text = text.replace(marker, freed if completing else "")
    for marker, rate in _RATED.items():
        text = text.replace(marker, rate if rated else "")
    return text


def _candidates(kinds: frozenset[str], completing: bool = False) -> str:
    """The candidates of an acquire whose types are of ``kinds``: the branches of those
    kinds only, so that the statement plans and starts no part it never runs. In the
    worker's queue order; within a queue every group's first job comes before any
    group's second, then priority and due time. Rows locked beyond the LIMIT are
    released at commit, as in any acquire."""
    order = [kind for kind in _BRANCHES if kind in kinds]
    ctes = ([_ROOM] if kinds & {"whole", "keyed"} else []) + [
        cte for kind in order for cte in _CTES[kind]
    ]
    union = "\n        UNION ALL".join(_BRANCHES[kind] for kind in order)
    return (
        _counting(",".join(ctes), completing, "rated" in kinds)
        + f""",
candidates AS (
    SELECT c.id, c.ctid, c.name, c.limit_group, c.pos
    FROM ({union}
    ) AS c(id, ctid, queue, round, priority, scheduled_at, name, limit_group, pos)
    JOIN unnest(%(queues)s::text[]) WITH ORDINALITY AS q(name, rank) ON q.name = c.queue
    WHERE NOT EXISTS (SELECT 1 FROM {{queues}} AS p WHERE p.name = q.name AND p.paused)
    ORDER BY q.rank, c.round, c.priority, c.scheduled_at, c.pos
    LIMIT %(limit)s
)"""
    )


# Written to each type's row, once the jobs are leased: the cursor (the next acquire of
# a keyed type starts after the last group this one served), and that a worker waits
# for room in the type: this acquire came back short, and jobs of the type it could
# not start are left pending in its queues (more than it leased of them). An attempt
# of the type that ends then frees room somebody waits for (``CLEAR_WAITING``). Only
# a short acquire looks for jobs left, so a drain that never waits on its limits
# writes nothing but the cursor.
_WAITS = """
waits AS (
    SELECT rm.name
    FROM room AS rm
    CROSS JOIN LATERAL (SELECT count(*) AS n FROM leased AS x WHERE x.type_name = rm.name) AS got
    WHERE CASE WHEN rm.waiting_since IS NULL AND (SELECT count(*) FROM leased) < %(limit)s
        THEN (SELECT count(*) FROM (
            SELECT 1 FROM {jobs} AS j
            WHERE j.status = 'pending' AND j.limit_group IS NOT NULL AND j.type_name = rm.name
              AND j.scheduled_at <= now() AND j.queue = ANY(%(queues)s::text[])
            ORDER BY j.limit_group, j.priority, j.scheduled_at  -- by its pending index
            LIMIT got.n + 1) AS p) > got.n
        ELSE false END
)"""

# The marks, and the cursors of keyed types.
_CURSORS = """
cursors AS (
    INSERT INTO {job_limits} AS o (type_name, limit_key, cursor_key, waiting_since)
    SELECT COALESCE(k.name, w.name), '', k.cursor_key,
        CASE WHEN w.name IS NOT NULL THEN now() END
    FROM (
        SELECT DISTINCT ON (c.name) c.name, c.limit_group AS cursor_key
        FROM candidates AS c
        JOIN leased AS x ON x.id = c.id
        WHERE c.limit_group IS NOT NULL  -- a group of a keyed type's walk
        ORDER BY c.name, c.pos DESC
    ) AS k
    FULL JOIN waits AS w ON w.name = k.name
    ON CONFLICT (type_name, limit_key) DO UPDATE
    SET cursor_key = COALESCE(EXCLUDED.cursor_key, o.cursor_key),
        waiting_since = COALESCE(o.waiting_since, EXCLUDED.waiting_since)
)"""

# The marks alone, where no type is keyed.
_MARKS = """
cursors AS (
    INSERT INTO {job_limits} AS o (type_name, limit_key, waiting_since)
    SELECT w.name, '', now() FROM waits AS w
    ON CONFLICT (type_name, limit_key) DO UPDATE
    SET waiting_since = COALESCE(o.waiting_since, EXCLUDED.waiting_since)
)"""

# After the acquire, in its transaction (so under its locks, seeing its leases): the
# types a worker has waited for since before this transaction, that have room left
# now: for a keyed type, in a group where an attempt of the caller's ended (a key limit
# held the waiting workers back, and only such a group can have let them on). Their
# marks are cleared and returned, and the worker announces their jobs: the waiting
# workers wake, and one that is still held back marks the type again. A mark this
# transaction's own acquire wrote (``now()``) is left for a later one: the worker that
# wrote it took what it could.
CLEAR_WAITING = """
UPDATE {job_limits} AS o SET waiting_since = NULL
FROM unnest(
    %(limited_names)s::text[], %(limited_concurrency)s::int[],
    %(limited_key_concurrency)s::int[], %(limited_rate_n)s::int[],
    %(limited_rate_per_s)s::float8[], %(limited_key_rate_n)s::int[],
    %(limited_key_rate_per_s)s::float8[]
) AS t(name, concurrency, key_concurrency, rate_n, rate_per_s, key_rate_n, key_rate_per_s)
WHERE o.type_name = t.name AND o.limit_key = '' AND o.waiting_since < now()
  AND NOT COALESCE(o.paused_until > now(), false)
  AND COALESCE(COALESCE(o.concurrency, t.concurrency) > (
      SELECT count(*) FROM {jobs} AS r
      WHERE r.status = 'running' AND r.limit_group IS NOT NULL AND r.type_name = t.name
  ), true)
  -- A full rate window has no room either: the waiting workers' own timers say when
  -- it opens (an announcement now would only wake them to find it full).
  AND COALESCE(COALESCE(o.rate_n, t.rate_n) > (
      SELECT count(*) FROM {job_starts} AS s
      WHERE s.type_name = t.name AND s.started_at > clock_timestamp()
          - make_interval(secs => COALESCE(o.rate_per_s, t.rate_per_s))
  ), true)
  AND (t.key_concurrency IS NULL AND t.key_rate_n IS NULL OR EXISTS (
      SELECT 1
      FROM unnest(%(freed_types)s::text[], %(freed_groups)s::text[]) AS f(name, limit_group)
      LEFT JOIN {job_limits} AS k
          ON k.type_name = f.name AND k.limit_key = f.limit_group AND f.limit_group <> ''
      WHERE f.name = t.name
        AND NOT COALESCE(k.paused_until > now(), false)
        AND COALESCE(COALESCE(k.key_concurrency, o.key_concurrency, t.key_concurrency) > (
            SELECT count(*) FROM {jobs} AS r
            WHERE r.status = 'running' AND r.limit_group = f.limit_group
              AND r.type_name = t.name), true)
        AND COALESCE(COALESCE(k.key_rate_n, o.key_rate_n, t.key_rate_n) > (
            SELECT count(*) FROM {job_starts} AS s
            WHERE s.type_name = t.name AND s.limit_group = f.limit_group
              AND s.started_at > clock_timestamp() - make_interval(
                  secs => COALESCE(k.key_rate_per_s, o.key_rate_per_s, t.key_rate_per_s))
        ), true)
        AND EXISTS (
            SELECT 1 FROM {jobs} AS j
            WHERE j.status = 'pending' AND j.limit_group = f.limit_group
              AND j.type_name = t.name AND j.scheduled_at <= now())
  ))
RETURNING o.type_name
"""

# The kinds of job type a limited acquire serves: limited as a whole, keyed (either
# of them also ``rated``: a rate counts its starts), capped by the worker alone, free
# of limits. A statement per combination (``variant``).
KINDS = ("whole", "keyed", "rated", "capped", "free")


def variant(kinds: Iterable[str]) -> str:
    """The name of the statement for an acquire whose types are of ``kinds``."""
    return "+".join(kind for kind in KINDS if kind in kinds)


# A keyed type's cursors alone, for an acquire that leaves no marks.
_CURSORS_ONLY = """
cursors AS (
    INSERT INTO {job_limits} AS o (type_name, limit_key, cursor_key)
    SELECT DISTINCT ON (c.name) c.name, '', c.limit_group
    FROM candidates AS c
    JOIN leased AS x ON x.id = c.id
    WHERE c.limit_group IS NOT NULL  -- a group of a keyed type's walk
    ORDER BY c.name, c.pos DESC
    ON CONFLICT (type_name, limit_key) DO UPDATE
    SET cursor_key = EXCLUDED.cursor_key
)"""


# The attempts a rated type started, recorded at the statement's one reading of the
# clock, and those that no window of the type can count any more, deleted.
_STARTS = """
starts AS (
    INSERT INTO {job_starts} (type_name, limit_group, started_at)
    SELECT x.type_name, CASE WHEN rm.keyed THEN COALESCE(x.limit_key, '') ELSE '' END, c.at
    FROM leased AS x
    JOIN room AS rm ON rm.name = x.type_name
    CROSS JOIN clock AS c
    WHERE rm.rate_n IS NOT NULL OR rm.key_rate_n IS NOT NULL
),
expired AS (
    DELETE FROM {job_starts} AS s
    USING room AS rm, clock AS c
    WHERE s.type_name = rm.name AND (rm.rate_n IS NOT NULL OR rm.key_rate_n IS NOT NULL)
      AND s.started_at <= c.at - make_interval(secs => greatest(
          rm.rate_per_s, rm.key_rate_per_s,
          (SELECT max(k.key_rate_per_s) FROM {job_limits} AS k WHERE k.type_name = rm.name)))
)"""


def _after_lease(kinds: frozenset[str], marks: bool) -> str:
    parts = []
    if "keyed" in kinds:
        parts += [_WAITS, _CURSORS] if marks else [_CURSORS_ONLY]
    elif "whole" in kinds and marks:
        parts += [_WAITS, _MARKS]
    if "rated" in kinds:
        parts.append(_STARTS)
    return ",".join(parts)


_VARIANTS = [
    frozenset(k for k, on in zip(KINDS, bits, strict=True) if on)
    for bits in itertools.product((False, True), repeat=len(KINDS))
]
_VARIANTS = [
    kinds
    for kinds in _VARIANTS
    if kinds & {"whole", "keyed", "capped"} and ("rated" not in kinds or kinds & {"whole", "keyed"})
]


# The leased rows and the marker of candidates missed (``LEASE_CANDIDATES``), then,
# for an acquire that leaves the marks out, the marker of a type some worker waits for
# (a row whose id is NULL and whose type is ``WAITED``): its caller then sends
# ``CLEAR_WAITING`` in the same transaction (see ``_state_worker``).
WAITED = "(waited for)"
_WAITED_ROWS = f"""{LEASE_CANDIDATES}UNION ALL
SELECT NULL, '{WAITED}', {", ".join(["NULL"] * (ACQUIRED_WIDTH - 2))}
WHERE EXISTS (SELECT 1 FROM room AS rm WHERE rm.waiting_since IS NOT NULL)
"""


# And, after a short acquire, the marker of when a limit that holds its types' pending
# jobs back may next let one start (a row whose id is NULL, whose type is ``OPENS`` and
# whose lease end is that moment): the earliest of a start leaving a rate's window and
# a pause ending. Never later than the true moment, sometimes earlier (the worker's
# acquire then finds nothing and learns the next one): its worker sets a timer for it.
OPENS = "(opens)"
_BEFORE_AT = ", ".join(["NULL"] * 9)  # the columns before ``leased_until``
_AFTER_AT = ", ".join(["NULL"] * (ACQUIRED_WIDTH - 12))
_OPENS_ROWS = f"""UNION ALL
SELECT NULL, '{OPENS}', {_BEFORE_AT}, o.at, {_AFTER_AT}
FROM (
    SELECT min(w.at) AS at
    FROM room AS rm
    CROSS JOIN clock AS c
    CROSS JOIN LATERAL (
        SELECT COALESCE((
            SELECT min(s.started_at) FROM {{job_starts}} AS s
            WHERE s.type_name = rm.name
              AND s.started_at > c.at - make_interval(secs => rm.rate_per_s)
        ), c.at) + make_interval(secs => rm.rate_per_s) AS at
        WHERE rm.rate_n IS NOT NULL
        UNION ALL
        SELECT COALESCE((
            SELECT min(s.started_at) FROM {{job_starts}} AS s
            WHERE s.type_name = rm.name
              AND s.started_at > c.at - make_interval(secs => rm.key_rate_per_s)
        ), c.at) + make_interval(secs => rm.key_rate_per_s)
        WHERE rm.key_rate_n IS NOT NULL
        UNION ALL
        SELECT min(k.paused_until) FROM {{job_limits}} AS k
        WHERE k.type_name = rm.name AND k.paused_until > now()
    ) AS w
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM leased AS x WHERE x.type_name = rm.name
    ) AS got
    WHERE (SELECT count(*) FROM leased) < %(limit)s
      AND (SELECT count(*) FROM (
          SELECT 1 FROM {{jobs}} AS j
          WHERE j.status = 'pending' AND j.limit_group IS NOT NULL AND j.type_name = rm.name
            AND j.scheduled_at <= now() AND j.queue = ANY(%(queues)s::text[])
          ORDER BY j.limit_group, j.priority, j.scheduled_at  -- by its pending index
          LIMIT got.n + 1) AS p) > got.n  -- more pending than it leased (its snapshot's)
) AS o
WHERE o.at IS NOT NULL
"""


def _rows(kinds: frozenset[str], marks: bool) -> str:
    if not kinds & {"whole", "keyed"}:
        return LEASE_CANDIDATES
    return (_WAITED_ROWS if not marks else LEASE_CANDIDATES) + _OPENS_ROWS


def _acquire(kinds: frozenset[str], marks: bool) -> str:
    after = _after_lease(kinds, marks)
    return (
        f"WITH {_candidates(kinds)},{LEASES},{LEASED}"
        f"{',' + after if after else ''}{_rows(kinds, marks)}"
    )


def _name(kinds: frozenset[str], marks: bool) -> str:
    return variant(kinds) + ("+marks" if marks else "")


# Each combination of kinds, with and without the marks of a short acquire (an
# acquire that expects to take what it asks for leaves them out: they cost the
# statement a data-modifying part, see ``python -m bench.cpu --only drain,limited``).
ACQUIRE_LIMITED = {
    _name(kinds, marks): _acquire(kinds, marks) for kinds in _VARIANTS for marks in (True, False)
}
COMPLETE_AND_ACQUIRE_LIMITED = {
    _name(kinds, marks): complete_and_acquire(
        _candidates(kinds, completing=True),
        after_lease=_after_lease(kinds, marks),
        rows=_rows(kinds, marks),
    )
    for kinds in _VARIANTS
    for marks in (True, False)
}


# How long a rated acquire may wait for its window to open (seconds): see
# ``AWAIT_OPENING``. A worker held back by a rate sends its acquire a little before the
# opening it was told of, within this.
OPENING_HORIZON_S = 0.05

# Sent first, before the locks, by an acquire of a type with a rate: when the window of
# one of its types' rates is full and the next start leaves it within
# ``OPENING_HORIZON_S``, the session sleeps until that moment, holding no lock; else it
# goes on at once. The acquire that follows then reads its clock as the window opens,
# rather than a worker's timer and a round trip later, and the place is taken again as
# soon as the rate lets it: a rate loses the time from an opening to the acquire that
# fills it once per window, and this makes that time the locks' alone. Exactness is
# the acquire's, under the locks, as ever: waiting changes when it counts, not how.
# The opening is the newest ``n``-th start of the window leaving it (the type's
# ``job_starts`` index, newest first, ``n`` entries at most).
AWAIT_OPENING = f"""
SELECT pg_sleep(COALESCE((
    SELECT greatest(extract(epoch FROM min(o.at) - clock_timestamp()), 0)::float8
    FROM (
        SELECT (
            SELECT s.started_at FROM {{job_starts}} AS s
            WHERE s.type_name = t.name
              AND s.started_at > clock_timestamp() - make_interval(
                  secs => COALESCE(l.rate_per_s, t.rate_per_s))
            ORDER BY s.started_at DESC
            OFFSET COALESCE(l.rate_n, t.rate_n) - 1 LIMIT 1
        ) + make_interval(secs => COALESCE(l.rate_per_s, t.rate_per_s)) AS at
        FROM unnest(%(limited_names)s::text[], %(limited_rate_n)s::int[],
                    %(limited_rate_per_s)s::float8[]) AS t(name, rate_n, rate_per_s)
        LEFT JOIN {{job_limits}} AS l ON l.type_name = t.name AND l.limit_key = ''
        WHERE COALESCE(l.rate_n, t.rate_n) IS NOT NULL
    ) AS o
    HAVING min(o.at) <= clock_timestamp() + make_interval(secs => {OPENING_HORIZON_S})
), 0))
"""


@dataclass(frozen=True, slots=True)
class LimitStatements:
    lock_types: bytes
    acquire_limited: Mapping[str, bytes]
    complete_and_acquire_limited: Mapping[str, bytes]
    clear_waiting: bytes
    await_opening: bytes
