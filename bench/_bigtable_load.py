"""The big table of ``python -m bench.bigtable``: what a steady state holds, loaded fast.

A queue that ends chains at a steady rate and keeps them as ``pgwork.Retention``'s
defaults say (completed chains a day, failed and cancelled ones a week) holds, at any
moment, a day of completed chains and a week of failed and cancelled ones, plus the
chains that came due since the last retention sweep. ``Timeline`` finds the rate at
which that holds about ``finished`` jobs, and numbers the chains made over the week
in order of creation, one every ``1 / rate`` seconds up to now; ``load`` inserts the
ones still there, with ``INSERT ... SELECT`` over ``generate_series``, a chunk of
chains per statement, in creation order (ids are UUIDv7 of the creation time, as
pgwork makes them, so the primary key grows at its end as it does in production).

The mix, by chain number ``c`` and a hash of it: 2 % of chains fail and 1 % are
cancelled (``c % 100``, evenly spread); 70 % are one job long, 20 % two, 10 % three;
thirty job types on ten queues, a few types far busier than the rest; a failed chain
ends at one of its steps after three attempts, with its error and attempt history; a
dedup key on about one chain in a hundred. A small live part comes last: pending
chains scheduled within the hour, blocked jobs waiting on them, stopped workers.

``churn`` then leaves a day's dead tuples: the completed chains loaded just before
the window (``churn`` x ``finished`` jobs, older than their retention) are deleted,
as retention deletes them, and as many jobs again (of all ages) are moved to running
and back, as a claim and a completion update a row (neither is a HOT update: the
status is in the partial indexes' predicates).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from bench._pgwork_app import SCHEMA
from pgwork import Retention
from pgwork.testing import uuid7_sql

__all__ = ["QUEUES", "TYPES", "Churn", "Loaded", "Timeline", "churn", "load"]

# Job types and the queue each runs on: (queue, type). Heavier first: the type of a
# chain is picked with a skew towards the start of the list.
TYPES = (
    ("mail", "mail.send"),
    ("default", "default.sync_account"),
    ("webhooks", "webhooks.deliver"),
    ("notify", "notify.push"),
    ("media", "media.thumbnail"),
    ("search", "search.index"),
    ("billing", "billing.charge"),
    ("mail", "mail.digest"),
    ("reports", "reports.daily"),
    ("exports", "exports.csv"),
    ("default", "default.cleanup"),
    ("media", "media.transcode"),
    ("search", "search.reindex"),
    ("notify", "notify.sms"),
    ("billing", "billing.invoice"),
    ("webhooks", "webhooks.retry"),
    ("maintenance", "maintenance.vacuum_files"),
    ("reports", "reports.weekly"),
    ("exports", "exports.pdf"),
    ("mail", "mail.bounce"),
    ("default", "default.import"),
    ("media", "media.scan"),
    ("billing", "billing.refund"),
    ("notify", "notify.email_fallback"),
    ("search", "search.suggest"),
    ("maintenance", "maintenance.rotate_keys"),
    ("reports", "reports.audit"),
    ("exports", "exports.archive"),
    ("webhooks", "webhooks.verify"),
    ("default", "default.rebuild_cache"),
)
QUEUES = tuple(dict.fromkeys(queue for queue, _ in TYPES))

# The chains' lengths (a third of the chain hash's low bits picks one) and the jobs of
# each kind of chain that stay in the table, on average: a completed chain keeps its
# every job, a failed or cancelled one those up to the step it ended at (uniform).
_ONE, _TWO = 717, 922  # of 1024: 70 % one job, 20 % two, 10 % three
_JOBS_COMPLETED = 1 * 0.7 + 2 * 0.2 + 3 * 0.1
_JOBS_ENDED_EARLY = 1 * 0.7 + 1.5 * 0.2 + 2 * 0.1
# Of 100 chains by number: 0 and 1 fail, 2 is cancelled.
_BAD_PER_100 = 3
# The retention sweep's batch (pgwork.worker's RETENTION_BATCH): the chains that came
# due since the last sweep are about one batch, and never under a minute's worth nor
# over an hour's.
_DUE_CHAINS = 5000
_DUE_MIN_S, _DUE_MAX_S = 60.0, 3600.0
# Chains per INSERT statement.
CHUNK_CHAINS = 100_000


@dataclass(frozen=True)
class Timeline:
    """Chains numbered 0..``total`` - 1 in creation order, one every 1 / ``rate``
    seconds, the last made now; which of them the table holds.

    ``due_s``: how far past its retention the oldest chain still there is (the sweep
    deletes a batch at a time); ``churn_s``: completed chains older still, loaded to
    be deleted by ``churn``. Chains ``[0, churned)`` are loaded only if they failed or
    were cancelled, ``[churned, kept)`` all (their completed ones are churn's), and
    ``[kept, total)`` all."""

    finished: int
    rate: float  # chains a second
    due_s: float
    churn_s: float
    total: int
    churned: int
    kept: int
    completed_s: float
    ended_early_s: float

    @classmethod
    def plan(cls, finished: int, churn: float, retention: Retention | None = None) -> Timeline:
        """The timeline whose table holds about ``finished`` jobs under ``retention``
        (default: pgwork's), with ``churn`` x ``finished`` jobs more to delete."""
        retention = retention or Retention()
        completed_s = _seconds(retention.completed)
        ended_early_s = max(_seconds(retention.failed), _seconds(retention.cancelled))
        good = 1 - _BAD_PER_100 / 100
        bad = _BAD_PER_100 / 100
        rate, due = 1.0, _DUE_MIN_S
        for _ in range(20):  # the due span depends on the rate and the rate on it
            held = (
                good * (completed_s + due) * _JOBS_COMPLETED
                + bad * (ended_early_s + due) * _JOBS_ENDED_EARLY
            )
            rate = finished / held
            due = min(max(_DUE_CHAINS / (rate * good), _DUE_MIN_S), _DUE_MAX_S)
        churn_s = churn * finished / (rate * good * _JOBS_COMPLETED)
        span = ended_early_s + due
        total = max(1, math.ceil(rate * span))
        kept = max(0, total - math.floor(rate * (completed_s + due)))
        churned = max(0, total - math.floor(rate * (completed_s + due + churn_s)))
        return cls(finished, rate, due, churn_s, total, churned, kept, completed_s, ended_early_s)

    def chunks(self, size: int = CHUNK_CHAINS) -> list[tuple[int, int, bool]]:
        """``(first, end, ended_early_only)`` ranges of chain numbers, in order, none
        straddling the start of the churned range."""
        out = []
        for start, end, only in ((0, self.churned, True), (self.churned, self.total, False)):
            for first in range(start, end, size):
                out.append((first, min(end, first + size), only))
        return out


def _seconds(period: Any) -> float:
    if period is None:
        raise ValueError("the big table needs a retention period for every ending")
    return float(period.total_seconds())


def _uuid7(ms: str, k: str, c: str) -> str:
    """SQL for a UUIDv7 of the Unix time ``ms`` (milliseconds) whose other bits are
    the job's step ``k`` and chain number ``c``: unique, time-ordered like pgwork's
    ids, and far cheaper to make than random bits (``gen_random_uuid`` reads the
    kernel's random source on every call). The expressions are pasted as they stand:
    columns of the statement, never values from outside it."""
    return (
        f"encode(int8send((({ms}) << 16) | 28672 | ({k}))"
        f" || int8send((-9223372036854775808)::bigint | ({c})), 'hex')::uuid"
    )


# One chain a row, from ``source`` (a select of chain numbers ``c``). Times are seconds
# before ``now`` (``ago``), as float8: cheaper than timestamp arithmetic per row.
_CHAINS = f"""
WITH numbered AS (
    SELECT c, h, g, born, outcome, len,
           CASE WHEN outcome = 'completed' THEN len - 1 ELSE (g & 1023) %% len END AS last,
           wait_s, run_s, t
    FROM (
        SELECT c, h, g,
               (%(total)s - 1 - c) / %(rate)s::float8 AS born,
               CASE WHEN c %% 100 < 2 THEN 'failed' WHEN c %% 100 < 3 THEN 'cancelled'
                    ELSE 'completed' END AS outcome,
               CASE WHEN (h & 1023) < {_ONE} THEN 1 WHEN (h & 1023) < {_TWO} THEN 2
                    ELSE 3 END AS len,
               0.02 + ((h >> 10) & 255)::float8 / 512 AS wait_s,
               0.05 + ((h >> 18) & 1023)::float8 / 341 AS run_s,
               1 + floor(%(types)s * power(((g >> 10) & 1023)::float8 / 1024, 2))::int AS t
        FROM (SELECT c, hashint8(c) AS h, hashint8(-1 - c) AS g FROM ({{source}}) AS s) AS x
    ) AS y
)"""

_SOURCE_ALL = "SELECT generate_series(%(first)s::bigint, %(end)s::bigint - 1) AS c"
_SOURCE_ENDED_EARLY = f"""
SELECT 100 * i + j AS c
FROM generate_series(%(first)s::bigint / 100, (%(end)s::bigint - 1) / 100) AS i,
     generate_series(0, {_BAD_PER_100 - 1}) AS j
WHERE 100 * i + j >= %(first)s AND 100 * i + j < %(end)s"""

_AT = "%(now)s::timestamptz - {ago} * interval '1 second'"

# Every job of the chains: step k made when step k - 1 ended, waited ``wait_s`` and ran
# ``run_s``; a failed step ran three attempts and ended 90 s after it was made; a
# cancelled one never started and was cancelled 30 s after it was made.
_JOBS = f"""
{_CHAINS}
INSERT INTO {{jobs}} (
    id, type_name, chain_id, chain_type_name, chain_index, input, output, status, queue,
    priority, created_at, scheduled_at, started_at, completed_at, attempt, max_attempts,
    last_attempt_error, last_attempt_at, attempt_history, chain_status, chain_completed_at,
    dedup_key
)
SELECT {_uuid7("%(now_ms)s::bigint - (made * 1000)::bigint", "k", "n.c")},
       CASE WHEN k = 0 THEN tn ELSE tn || '.step' || (k + 1) END,
       {_uuid7("%(now_ms)s::bigint - (n.born * 1000)::bigint", "0", "n.c")}, tn, k,
       CASE WHEN k = 0 THEN jsonb_build_object('n', n.c, 'email', 'user' || n.c || '@example.com')
            ELSE jsonb_build_object('n', n.c, 'step', k + 1) END,
       CASE WHEN st = 'completed' THEN jsonb_build_object('ok', true, 'n', n.c) END,
       st::{{job_status}}, (%(queues)s::text[])[n.t], 0,
       {_AT.format(ago="made")}, {_AT.format(ago="made")},
       CASE WHEN st <> 'cancelled' THEN {_AT.format(ago="(made - n.wait_s)")} END,
       {_AT.format(ago="ended")},
       CASE st WHEN 'completed' THEN 1 WHEN 'failed' THEN 3 ELSE 0 END,
       3,
       CASE WHEN st = 'failed' THEN jsonb_build_object(
           'type', 'TimeoutError', 'message', 'upstream timed out after 30 s (chain ' || n.c || ')',
           'traceback', 'Traceback (most recent call last):\n  File "app.py", line 1\n') END,
       CASE WHEN st <> 'cancelled' THEN {_AT.format(ago="ended")} END,
       CASE WHEN st = 'failed' THEN (
           SELECT jsonb_agg(jsonb_build_object(
               'attempt', a, 'at', {_AT.format(ago="(made - a * 30)")},
               'worker', 'worker-' || (n.c %% 7), 'ran_for', 30.0,
               'error', jsonb_build_object('type', 'TimeoutError',
                                           'message', 'upstream timed out after 30 s')))
           FROM generate_series(1, 3) AS a) END,
       CASE WHEN k = 0 THEN n.outcome::{{chain_status}} END,
       CASE WHEN k = 0 THEN {_AT.format(ago="n.chain_end")} END,
       CASE WHEN k = 0 AND ((n.g >> 20) & 127) = 0 THEN 'key-' || n.c END
FROM (
    SELECT numbered.*, (%(type_names)s::text[])[t] AS tn,
           born - last * (wait_s + run_s) - CASE outcome
               WHEN 'completed' THEN wait_s + run_s WHEN 'failed' THEN 90 ELSE 30 END
               AS chain_end
    FROM numbered
) AS n
CROSS JOIN LATERAL generate_series(0, n.last) AS k
CROSS JOIN LATERAL (
    SELECT CASE WHEN k < n.last OR n.outcome = 'completed' THEN 'completed'
                ELSE n.outcome END AS st,
           n.born - k * (n.wait_s + n.run_s) AS made
) AS s
CROSS JOIN LATERAL (
    SELECT made - CASE st WHEN 'completed' THEN n.wait_s + n.run_s WHEN 'failed' THEN 90
                  ELSE 30 END AS ended
) AS e
"""

# The live part: pending chains due within the hour (of the types above, none a
# benchmark worker runs), blocked jobs each waiting on one of them, stopped workers.
_PENDING = f"""
INSERT INTO {{jobs}} (
    id, type_name, chain_id, chain_type_name, chain_index, input, status, queue, priority,
    created_at, scheduled_at, max_attempts, chain_status)
SELECT u, t, u, t, 0, jsonb_build_object('n', -1 - g, 'email', 'later' || g || '@example.com'),
       'pending', q, 0, now(), now() + (1 + g %% 59) * interval '1 minute', 3, 'active'
FROM (
    SELECT g, (%(type_names)s::text[])[1 + g %% %(types)s] AS t,
           (%(queues)s::text[])[1 + g %% %(types)s] AS q, {uuid7_sql("now()")} AS u
    FROM generate_series(0, %(pending)s - 1) AS g
) AS s
"""

_BLOCKED = f"""
WITH blockers AS (
    SELECT id, row_number() OVER (ORDER BY id) AS n FROM {{jobs}}
    WHERE status = 'pending' AND id = chain_id AND chain_type_name = ANY(%(type_names)s::text[])
    ORDER BY id LIMIT %(blocked)s
), blocked AS (
    INSERT INTO {{jobs}} (
        id, type_name, chain_id, chain_type_name, chain_index, input, status, queue,
        priority, max_attempts, chain_status, blockers_needed, blockers_met, blockers_open)
    SELECT u, 'reports.audit', u, 'reports.audit', 0, jsonb_build_object('n', -1 - b.n),
           'blocked', 'reports', 0, 3, 'active', 1, 0, 1
    FROM (SELECT n, {uuid7_sql("now()")} AS u FROM blockers) AS b
    RETURNING id, (input ->> 'n')::bigint AS n
)
INSERT INTO {{job_blockers}} (job_id, blocker_chain_id, position)
SELECT d.id, b.id, 0 FROM blocked AS d JOIN blockers AS b ON -1 - b.n = d.n
"""

_BLOCKER_FLAGS = """
UPDATE {jobs} SET chain_has_dependants = true
WHERE id IN (SELECT blocker_chain_id FROM {job_blockers})
"""

_WORKERS = """
INSERT INTO {workers} (id, host, pid, queues, job_types, max_slots, active_slots, status,
                       started_at, heartbeat_at)
SELECT 'gone-worker-' || w, 'host-' || (w %% 3), 1000 + w, %(queues)s::text[],
       %(type_names)s::text[], 50, 0, 'stopped', now() - interval '5 hours',
       now() - (w + 1) * interval '10 minutes'
FROM generate_series(0, 5) AS w
"""

_COUNT = "SELECT count(*), count(*) FILTER (WHERE id = chain_id) FROM {jobs}"


@dataclass(frozen=True)
class Loaded:
    """What ``load`` wrote: jobs (finished, and the live part) and chains, and how long
    it took."""

    jobs: int
    chains: int
    live: int
    seconds: float


def _names() -> dict[str, sql.Composable]:
    return {
        name: sql.Identifier(SCHEMA, name)
        for name in ("jobs", "job_blockers", "workers", "job_status", "chain_status")
    }


def _type_params() -> dict[str, Any]:
    return {
        "type_names": [name for _, name in TYPES],
        "queues": [queue for queue, _ in TYPES],
        "types": len(TYPES),
    }


def load(
    dsn: str, timeline: Timeline, *, on_chunk: Callable[[int, int], None] | None = None
) -> Loaded:
    """Insert the timeline's chains and the live part into ``dsn``'s migrated, empty
    schema (autocommit, a statement per chunk); ``on_chunk(done, total)`` after each."""
    names = _names()
    statements = {
        only: sql.SQL(
            _JOBS.replace("{source}", _SOURCE_ENDED_EARLY if only else _SOURCE_ALL)
        ).format(**names)
        for only in (True, False)
    }
    live = max(10, timeline.finished // 2000)
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET jit = off")  # a statement per chunk: compiling costs more
        now = conn.execute("SELECT now(), floor(extract(epoch FROM now()) * 1000)").fetchone()
        assert now is not None
        params = {
            "now": now[0],
            "now_ms": int(now[1]),
            "total": timeline.total,
            "rate": timeline.rate,
        }
        params.update(_type_params())
        chunks = timeline.chunks()
        for index, (first, end, only) in enumerate(chunks):
            conn.execute(statements[only], {**params, "first": first, "end": end})
            if on_chunk is not None:
                on_chunk(index + 1, len(chunks))
        live_params = {**_type_params(), "pending": live, "blocked": max(5, live // 10)}
        for text in (_PENDING, _BLOCKED, _BLOCKER_FLAGS, _WORKERS):
            conn.execute(sql.SQL(text).format(**names), live_params)
        row = conn.execute(sql.SQL(_COUNT).format(**names)).fetchone()
    assert row is not None
    seconds = time.perf_counter() - started
    blocked = max(5, live // 10)
    return Loaded(jobs=int(row[0]), chains=int(row[1]), live=live + blocked, seconds=seconds)


@dataclass(frozen=True)
class Churn:
    """What ``churn`` did: jobs deleted (the completed chains past their retention)
    and jobs updated twice (to running and back)."""

    deleted: int
    updated: int
    seconds: float


# The churned chains' jobs: completed chains numbered [churned, kept) (every job
# carries its chain's number as input ``n``).
_DELETE_CHURNED = """
DELETE FROM {jobs}
WHERE (input ->> 'n')::bigint >= %(churned)s AND (input ->> 'n')::bigint < %(kept)s
  AND (input ->> 'n')::bigint %% 100 >= %(bad)s
"""

# A claim and a completion, as far as the row goes: running with a lease, then back to
# how it ended. ``leased_by`` keeps that status meanwhile. Rows are picked by their
# ids' random last byte: ``fraction`` of every age.
_TO_RUNNING = """
UPDATE {jobs}
SET status = 'running', leased_by = status::text, leased_until = now() + interval '1 minute',
    lease_token = gen_random_uuid()
WHERE get_byte(uuid_send(id), 15) < %(cut)s AND status IN ('completed', 'failed', 'cancelled')
"""

_BACK = """
UPDATE {jobs}
SET status = leased_by::{job_status}, leased_by = NULL, leased_until = NULL,
    lease_token = NULL
WHERE status = 'running' AND leased_by IN ('completed', 'failed', 'cancelled')
"""


def churn(dsn: str, timeline: Timeline, fraction: float) -> Churn:
    """Delete the churned chains and update ``fraction`` of the remaining jobs twice
    (see the module); autocommit, one statement each."""
    names = _names()
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET jit = off")
        deleted = conn.execute(
            sql.SQL(_DELETE_CHURNED).format(**names),
            {"churned": timeline.churned, "kept": timeline.kept, "bad": _BAD_PER_100},
        ).rowcount
        updated = 0
        cut = round(256 * fraction)
        if cut > 0:
            updated = conn.execute(sql.SQL(_TO_RUNNING).format(**names), {"cut": cut}).rowcount
            conn.execute(sql.SQL(_BACK).format(**names))
    return Churn(deleted=deleted, updated=updated, seconds=time.perf_counter() - started)
