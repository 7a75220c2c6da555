"""An atomic attempt's row lock and completion, and a lease's renewal, failure,
rescheduling and release, find their rows by primary key.

Both name the job by id and test ``status = 'running'``, which the partial indexes of
running jobs (their leases, ``jobs_lease_expiry_idx``; their flow-limit keys,
``jobs_limit_running_idx``) also have as their predicate. With statistics taken while
no job ran (a loaded queue, freshly analyzed) such an index looks nearly empty, and the
planner read it whole, filtering by id: every job finished since the last vacuum leaves
a dead entry there, so each atomic job cost more than the last. This pins the plans on
such a table.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg

from pgwork.postgres.sql import render

FINISHED = 3_000
# The partial indexes whose predicate is ``status = 'running'``.
RUNNING_INDEXES = {"jobs_lease_expiry_idx", "jobs_limit_running_idx"}

LOAD = """
INSERT INTO pgwork.jobs (
    id, type_name, chain_id, chain_type_name, chain_index, input, status, queue,
    priority, max_attempts, scheduled_at, chain_status
)
SELECT u, 'noop', u, 'noop', 0, '{}'::jsonb, 'pending', 'default', 0, 5,
       now() - interval '1 minute', 'active'
FROM (SELECT gen_random_uuid() AS u FROM generate_series(1, %(count)s)) AS rows
"""

# What a drain does to those rows: lease them, then finish all but one.
LEASE = """
UPDATE pgwork.jobs SET status = 'running', lease_token = gen_random_uuid(),
    leased_by = 'w', leased_until = now() + interval '1 minute'
"""
FINISH = """
UPDATE pgwork.jobs SET status = 'completed', completed_at = now(), lease_token = NULL,
    leased_by = NULL, leased_until = NULL
WHERE id <> %(id)s
"""


def _indexes(plan: dict[str, Any]) -> Iterator[str]:
    if "Index Name" in plan:
        yield plan["Index Name"]
    for child in plan.get("Plans", []):
        yield from _indexes(child)


def _plans(dsn: str, statements: dict[str, bytes]) -> dict[str, set[str]]:
    """The indexes each statement reads, on a table a drain has been through."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LOAD, {"count": FINISHED + 1})
        conn.execute("ANALYZE pgwork.jobs")
        conn.execute(LEASE)
        row = conn.execute("SELECT id, lease_token FROM pgwork.jobs LIMIT 1").fetchone()
        assert row is not None
        job_id, token = row
        conn.execute(FINISH, {"id": job_id})
        params = {
            "job_id": job_id,
            "lease_token": token,
            "idle_ms": "30000",
            "id": job_id,
            "token": token,
            "output": "null",
            "ends_chain": True,
            "ids": [job_id],
            "tokens": [token],
            "seconds": [30.0],
            "errors": ["{}"],
            "retry_seconds": [None],
            "ran_for": [None],
            "run_at": None,
            "run_after": 0.0,
            "count_attempt": True,
        }
        out = {}
        for name, statement in statements.items():
            [(document,)] = conn.execute(b"EXPLAIN (FORMAT JSON) " + statement, params).fetchall()
            if isinstance(document, str):
                document = json.loads(document)
            out[name] = set(_indexes(document[0]["Plan"]))
    return out


def test_statements_on_leased_jobs_read_them_by_primary_key(pgwork_dsn: str) -> None:
    statements = render("pgwork")
    plans = _plans(
        pgwork_dsn,
        {
            "lock": statements.leases.begin_atomic,
            "bounded lock": statements.leases.begin_atomic_bounded,
            "completion": statements.outcomes.complete_atomic,
            "renewal": statements.leases.renew,
            "failure": statements.outcomes.fail,
            "rescheduling": statements.outcomes.reschedule,
            "release": statements.leases.release,
        },
    )
    for name, indexes in plans.items():
        assert "jobs_pkey" in indexes, (name, indexes)
        assert not indexes & RUNNING_INDEXES, (name, indexes)


def test_the_same_statements_testing_the_status_as_an_enum_read_the_lease_index(
    pgwork_dsn: str,
) -> None:
    # Control: the trap is real on this table. Written with ``status = 'running'`` the
    # lock and the renewal are planned on a partial index of running jobs.
    statements = render("pgwork")
    enum_tests = {}
    for name, statement in (
        ("lock", statements.leases.begin_atomic),
        ("renewal", statements.leases.renew),
    ):
        enum_tests[name] = statement.replace(b"j.status::text = 'running'", b"j.status = 'running'")
        assert enum_tests[name] != statement
    plans = _plans(pgwork_dsn, enum_tests)
    for name, indexes in plans.items():
        assert indexes & RUNNING_INDEXES, (name, plans)
