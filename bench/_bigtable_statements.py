"""pgwork's own statements timed on the big table (``python -m bench.bigtable``).

Each statement is pgwork's text (``pgwork.postgres.sql.render``) with the parameters
its adapter sends, executed ``runs`` times, each in a transaction rolled back, so every
run finds the table as the one before did: the reaper's one expired lease is there to
take back every time, the retention sweep finds the same batch. One more run under
``EXPLAIN (ANALYZE, BUFFERS)`` gives the server's own time and the pages it touched.

What is there to find (``prepare``): ``READY`` ready jobs of the benchmark's ``noop``
type, of which ``HELD`` run with live leases (a worker of 50 slots holds up to twice
that many) and one lease expired a minute ago; a registered worker; and whatever
chains the big table holds that are past their retention (about one sweep's batch).
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from bench._bigtable_load import TYPES
from bench._pgwork_app import SCHEMA, bulk_load
from bench._plan import percentile
from pgwork import Retention
from pgwork.postgres.sql import render

__all__ = ["READY", "StatementTime", "prepare", "time_statements"]

READY = 1000
HELD = 100
WORKER = "bigtable-worker"
LEASE_S = 60.0  # a job type's default lease
ACQUIRE_LIMIT = 10
RETENTION_LIMIT = 5000  # the worker's retention batch
WARM_UP = 6

# The jobs running under live leases, and one whose lease ran out a minute ago.
_HOLD = """
WITH picked AS (
    SELECT id FROM {jobs}
    WHERE status = 'pending' AND type_name = 'noop'
    ORDER BY id
    LIMIT %(count)s
)
UPDATE {jobs} AS j
SET status = 'running', attempt = 1, started_at = now(), leased_by = %(worker)s,
    lease_token = gen_random_uuid(), leased_until = now() + %(seconds)s * interval '1 second'
FROM picked
WHERE j.id = picked.id
RETURNING j.id, j.lease_token
"""


@dataclass(frozen=True)
class StatementTime:
    """One statement's figures: median and p95 of the client's wall clock around the
    execute and fetch, ms; the server's execution time and the shared buffers it hit
    and read in the one ``EXPLAIN (ANALYZE, BUFFERS)`` run; rows it returned."""

    name: str
    statement: str  # pgwork's name for it: group.name
    what: str
    median_ms: float
    p95_ms: float
    runs: int
    rows: int
    server_ms: float
    hit: int
    read: int


@dataclass(frozen=True)
class Fixture:
    held: list[tuple[uuid.UUID, uuid.UUID]]


async def prepare(dsn: str) -> Fixture:
    """Load the ready jobs, lease ``HELD`` of them to ``WORKER`` and expire one other
    lease, register ``WORKER``; committed. Vacuumed and analyzed, as autovacuum would
    have it after such a change."""
    await bulk_load(dsn, READY)
    names = {"jobs": sql.Identifier(SCHEMA, "jobs")}
    statements = render(SCHEMA)
    with psycopg.connect(dsn, autocommit=True) as conn:
        hold = sql.SQL(_HOLD).format(**names)
        rows = conn.execute(hold, {"count": HELD, "worker": WORKER, "seconds": 3600}).fetchall()
        conn.execute(hold, {"count": 1, "worker": "bigtable-gone", "seconds": -60})
        conn.execute(
            statements.workers.register_worker,
            {
                "id": WORKER,
                "host": "bench",
                "pid": 1,
                "queues": ["default"],
                "job_types": ["noop"],
                "max_slots": 50,
                "metadata": "{}",
            },
        )
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(names["jobs"]))
    return Fixture(held=[(r[0], r[1]) for r in rows])


def _retention_policy() -> dict[str, Any]:
    """LOCK_EXPIRED_CHAINS's parameters for every loaded type under pgwork's default
    retention, as the adapter builds them."""
    ranges = [
        (name, ending, period.total_seconds())
        for _, name in TYPES
        for ending, period in Retention().periods()
    ]
    return {
        "type_names": [r[0] for r in ranges],
        "endings": [r[1] for r in ranges],
        "seconds": [r[2] for r in ranges],
        "limit": RETENTION_LIMIT,
    }


def _history_widths() -> list[int]:
    from pgwork.postgres._history import HISTORY_WIDTHS_S

    return list(HISTORY_WIDTHS_S)


def _explain(conn: psycopg.Connection[Any], query: bytes, params: Any) -> tuple[float, int, int]:
    plan = conn.execute(b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params).fetchone()
    assert plan is not None
    top = plan[0][0]
    return (
        float(top["Execution Time"]),
        int(top["Plan"].get("Shared Hit Blocks", 0)),
        int(top["Plan"].get("Shared Read Blocks", 0)),
    )


def _timed(
    conn: psycopg.Connection[Any],
    name: str,
    statement: str,
    what: str,
    query: bytes,
    params: Any,
    runs: int,
    before: Sequence[tuple[bytes, Any]] = (),
) -> StatementTime:
    """``runs`` timed executions of ``query`` (after ``WARM_UP`` untimed), each in a
    transaction rolled back after ``before``'s statements (untimed) and it. Prepared,
    as a worker's statements are after their first few executions: the server plans
    it once, and from the sixth execution on may keep a generic plan."""
    took = []
    rows = 0
    for index in range(runs + WARM_UP):
        with conn.transaction(force_rollback=True):
            for text, args in before:
                conn.execute(text, args, prepare=True)
            started = time.perf_counter()
            found = conn.execute(query, params, prepare=True).fetchall()
            if index >= WARM_UP:
                took.append((time.perf_counter() - started) * 1000)
            rows = len(found)
    with conn.transaction(force_rollback=True):
        for text, args in before:
            conn.execute(text, args)
        server_ms, hit, read = _explain(conn, query, params)
    return StatementTime(
        name,
        statement,
        what,
        statistics.median(took),
        percentile(took, 95),
        runs,
        rows,
        server_ms,
        hit,
        read,
    )


def time_statements(dsn: str, fixture: Fixture, runs: int) -> list[StatementTime]:
    """Each statement of the module, ``runs`` times (see there)."""
    s = render(SCHEMA)
    held_ids = [job for job, _ in fixture.held]
    held_tokens = [token for _, token in fixture.held]
    out = []
    with psycopg.connect(dsn) as conn:
        reap = {
            "type_names": ["noop"],
            "worker_id": WORKER,
            "limit": 1,
            "dead_workers": [],
            "held": held_tokens,
        }
        out.append(
            _timed(
                conn,
                "reaper: one expired lease among the running",
                "leases.reap",
                f"takes back 1 expired lease; {len(held_ids)} others live",
                s.leases.reap,
                reap,
                runs,
            )
        )
        out.append(
            _timed(
                conn,
                "reaper: no expired lease of its types",
                "leases.reap",
                "a worker of another type looks: nothing to take",
                s.leases.reap,
                {**reap, "type_names": ["noop_atomic"]},
                runs,
            )
        )
        renew = {"ids": held_ids, "tokens": held_tokens, "seconds": [LEASE_S] * len(held_ids)}
        out.append(
            _timed(
                conn,
                f"lease renewal of {len(held_ids)} jobs",
                "leases.renew",
                "one worker renews every lease it holds",
                s.leases.renew,
                renew,
                runs,
            )
        )
        heartbeat = {"id": WORKER, "active_slots": 50, "status": "busy", "abandoned": 0}
        out.append(
            _timed(
                conn,
                "worker heartbeat",
                "workers.heartbeat",
                "the worker's row in pgwork.workers",
                s.workers.heartbeat,
                heartbeat,
                runs,
            )
        )
        acquire = {
            "worker_id": WORKER,
            "type_names": ["noop"],
            "lease_seconds": [LEASE_S],
            "queues": ["default"],
        }
        query = s.leases.acquire.replace(b"%(limit)s", str(ACQUIRE_LIMIT).encode())
        out.append(
            _timed(
                conn,
                f"acquire {ACQUIRE_LIMIT} ready jobs",
                "leases.acquire",
                f"{READY - len(held_ids) - 1} ready in the queue",
                query,
                acquire,
                runs,
            )
        )
        out.append(
            _timed(
                conn,
                "acquire from an empty queue",
                "leases.acquire",
                "an idle worker's poll",
                query,
                {**acquire, "queues": ["nothing-here"]},
                runs,
            )
        )
        out += _retention(conn, s, runs)
    return out


def _retention(conn: psycopg.Connection[Any], s: Any, runs: int) -> list[StatementTime]:
    """The retention sweep's batch: its locks (untimed), the expired chains found and
    locked, then deleted; as one transaction of the adapter's
    ``delete_expired_chains``."""
    from pgwork.postgres.sql.queries import retention_lock_key

    policy = _retention_policy()
    locks = [
        (s.queries.try_retention_lock, {"key": retention_lock_key(SCHEMA)}),
        (s.queries.lock_history_progress, {}),
    ]
    found = _timed(
        conn,
        f"retention: find and lock expired chains (limit {RETENTION_LIMIT:,})",
        "queries.lock_expired_chains",
        f"{len(TYPES)} types x 3 endings, pgwork's default periods",
        s.queries.lock_expired_chains,
        policy,
        runs,
        before=locks,
    )
    with conn.transaction(force_rollback=True):
        for text, args in locks:
            conn.execute(text, args)
        ids = [row[0] for row in conn.execute(s.queries.lock_expired_chains, policy)]
    delete = {"ids": ids, "widths": _history_widths()}
    deleted = _timed(
        conn,
        "retention: delete the batch",
        "queries.delete_expired_chains",
        f"{len(ids):,} chains and their jobs, by primary key",
        s.queries.delete_expired_chains,
        delete,
        runs,
        before=[*locks, (s.queries.lock_expired_chains, policy)],
    )
    return [found, deleted]
