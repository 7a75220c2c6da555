"""The acquire statement stays an index range scan however many jobs are queued.

A worker runs ACQUIRE many times a second; if the planner ever chose a sequential scan
of ``jobs`` its cost would grow with the table. This pins the plan on a realistic
table: tens of thousands of pending jobs plus finished ones, freshly analyzed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgwork.postgres.sql import render

PENDING = 20_000
FINISHED = 20_000

# Rows as start_chains writes them (each job the root of its own chain).
LOAD = """
INSERT INTO pgwork.jobs (
    id, type_name, chain_id, chain_type_name, chain_index, input, status, queue,
    priority, max_attempts, scheduled_at, chain_status, completed_at
)
SELECT u, t, u, t, 0, jsonb_build_object('n', g), s::pgwork.job_status, q, 0, 5,
       now() - interval '1 minute', c::pgwork.chain_status,
       CASE WHEN s = 'completed' THEN now() END
FROM (
    SELECT g, gen_random_uuid() AS u,
           CASE WHEN g %% 4 = 0 THEN 'other' ELSE 'noop' END AS t,
           CASE WHEN g %% 10 = 0 THEN 'mail' ELSE 'default' END AS q,
           CASE WHEN g < %(pending)s THEN 'pending' ELSE 'completed' END AS s,
           CASE WHEN g < %(pending)s THEN 'active' ELSE 'completed' END AS c
    FROM generate_series(0, %(total)s - 1) AS g
) AS rows
"""


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


# An acquire of up to 10 ``noop`` jobs by the plan tests' worker.
ACQUIRE_PARAMS: dict[str, Any] = {
    "worker_id": "plan-test-worker",
    "type_names": ["noop"],
    "lease_seconds": [60.0],
    "queues": ["default"],
    "limit": 10,
}


def _acquire_plan(dsn: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LOAD, {"pending": PENDING, "total": PENDING + FINISHED})
        conn.execute("ANALYZE pgwork.jobs")
        row = conn.execute(
            b"EXPLAIN (FORMAT JSON) " + render("pgwork").leases.acquire, params
        ).fetchone()
    assert row is not None
    document = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return list(_nodes(document[0]["Plan"]))


@pytest.mark.parametrize(
    ("queues", "type_names"),
    [
        (["default"], ["noop"]),
        (["default", "mail"], ["noop", "other"]),
    ],
    ids=["one-queue-one-type", "two-queues-two-types"],
)
def test_acquire_reads_pending_jobs_through_the_acquire_index(
    pgwork_dsn: str, queues: list[str], type_names: list[str]
) -> None:
    nodes = _acquire_plan(
        pgwork_dsn,
        {
            "worker_id": "plan-test-worker",
            "type_names": type_names,
            "lease_seconds": [60.0] * len(type_names),
            "queues": queues,
            "limit": 10,
        },
    )
    on_jobs = [n for n in nodes if n.get("Relation Name") == "jobs"]
    assert not [n for n in on_jobs if n["Node Type"] == "Seq Scan"], on_jobs
    assert any(n.get("Index Name") == "jobs_acquire_idx" for n in on_jobs), on_jobs


# --- a worker's turn: completions of one-job chains probe no chain root -------------

TURN_LOAD = """
INSERT INTO pgwork.jobs (
    id, type_name, chain_id, chain_type_name, chain_index, input, status, queue,
    priority, max_attempts, scheduled_at, chain_status, lease_token, leased_by, leased_until
)
SELECT u, 'noop', u, 'noop', 0, '{}'::jsonb, s::pgwork.job_status, 'default', 0, 5,
       now() - interval '1 minute', 'active',
       CASE WHEN s = 'running' THEN gen_random_uuid() END,
       CASE WHEN s = 'running' THEN 'plan-test-worker' END,
       CASE WHEN s = 'running' THEN now() + interval '1 minute' END
FROM (
    SELECT gen_random_uuid() AS u, CASE WHEN g < %(running)s THEN 'running' ELSE 'pending' END AS s
    FROM generate_series(0, %(total)s - 1) AS g
) AS rows
"""

RUNNING = 20


def _roots_probes(dsn: str, statement: bytes) -> int:
    """How many times the statement's ``roots`` update probed the primary key for a
    chain root, ending ``RUNNING`` one-job chains — completed by a turn, or failed for
    good by ``FAIL`` (run under EXPLAIN ANALYZE, rolled back)."""
    with psycopg.connect(dsn) as conn:
        conn.execute(TURN_LOAD, {"running": RUNNING, "total": RUNNING + 1_000})
        conn.execute("ANALYZE pgwork.jobs")
        rows = conn.execute(
            "SELECT id, lease_token FROM pgwork.jobs WHERE status = 'running'"
        ).fetchall()
        conn.commit()
        params = {
            "ids": [r[0] for r in rows],
            "tokens": [r[1] for r in rows],
            "outputs": ["null"] * len(rows),
            "ends_chain": [True] * len(rows),
            **ACQUIRE_PARAMS,  # the turn's acquire
            "errors": ['{"type": "Boom"}'] * len(rows),
            "retry_seconds": [None] * len(rows),
            "ran_for": [None] * len(rows),
        }
        explain = b"EXPLAIN (ANALYZE, FORMAT JSON) " + statement
        [(document,)] = conn.execute(explain, params).fetchall()
        conn.rollback()
    if isinstance(document, str):
        document = json.loads(document)
    [roots] = [n for n in _nodes(document[0]["Plan"]) if n.get("Subplan Name") == "CTE roots"]
    return sum(
        int(n["Actual Loops"])
        for n in _nodes(roots)
        if n.get("Index Name") == "jobs_pkey" and n.get("Relation Name") == "jobs"
    )


def test_a_turn_completing_one_job_chains_probes_no_chain_root(pgwork_dsn: str) -> None:
    # A one-job chain's job is its own root, already updated by the completion: the
    # ``roots`` update skips it on the completion's own columns, before any probe.
    assert _roots_probes(pgwork_dsn, render("pgwork").outcomes.complete_and_acquire) == 0


def test_the_turn_testing_the_root_on_the_probed_row_probes_every_one(pgwork_dsn: str) -> None:
    # Control: with the test written on the probed row (``r.id <> done.id``), the
    # primary key is probed once per completion.
    statement = render("pgwork").outcomes.complete_and_acquire
    control = statement.replace(b"done.chain_id <> done.id", b"r.id <> done.id")
    assert control != statement
    assert _roots_probes(pgwork_dsn, control) == RUNNING


def test_a_terminal_failure_of_one_job_chains_probes_no_chain_root(pgwork_dsn: str) -> None:
    # ``FAIL`` ends a chain the same way when an attempt fails for good: the one-job
    # chain's job is its own root, skipped on the failed row's own columns.
    assert _roots_probes(pgwork_dsn, render("pgwork").outcomes.fail) == 0


def test_the_failure_testing_the_root_on_the_probed_row_probes_every_one(
    pgwork_dsn: str,
) -> None:
    # Control: written on the probed row, the failure probes the primary key once per job.
    statement = render("pgwork").outcomes.fail
    control = statement.replace(b"failed.chain_id <> failed.id", b"r.id <> failed.id")
    assert control != statement
    assert _roots_probes(pgwork_dsn, control) == RUNNING


def _lease_scans(dsn: str, statement: bytes, cte: str = "leased") -> list[str]:
    """The scans of ``jobs`` under the acquire's lease update ``cte`` (not its
    candidates')."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LOAD, {"pending": PENDING, "total": PENDING + FINISHED})
        conn.execute("ANALYZE pgwork.jobs")
        explain = b"EXPLAIN (FORMAT JSON) " + statement
        [(document,)] = conn.execute(explain, ACQUIRE_PARAMS).fetchall()
    if isinstance(document, str):
        document = json.loads(document)
    [update] = [n for n in _nodes(document[0]["Plan"]) if n.get("Subplan Name") == f"CTE {cte}"]
    assert update["Node Type"] == "ModifyTable"
    return [
        f"{n['Node Type']}:{n.get('Index Name', '')}"
        for n in _own_nodes(update)
        if n.get("Relation Name") == "jobs" and n is not update
    ]


def _own_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``plan``'s nodes, leaving out the CTEs and subplans it evaluates."""
    yield plan
    for child in plan.get("Plans", []):
        if child.get("Parent Relationship") not in ("InitPlan", "SubPlan"):
            yield from _own_nodes(child)


def test_the_acquire_finds_its_locked_candidates_again_by_row_version(
    pgwork_dsn: str,
) -> None:
    # The lease update re-reads each locked candidate by its ctid (one page), not by a
    # primary-key probe (three or four).
    assert _lease_scans(pgwork_dsn, render("pgwork").leases.acquire) == ["Tid Scan:"]


def test_the_acquire_matching_candidates_by_id_probes_the_primary_key(pgwork_dsn: str) -> None:
    # Control: matched by id alone, the lease update probes jobs_pkey for each candidate.
    statement = render("pgwork").leases.acquire
    control = statement.replace(b"j.ctid = c.ctid AND ", b"")
    assert control != statement
    assert _lease_scans(pgwork_dsn, control) == ["Index Scan:jobs_pkey"]


# --- ... and says it missed a candidate only when it did ---

MISSED_GATE = b"WHERE (SELECT count(*) FROM leased) < (SELECT count(*) FROM candidates)"


def _acquired_rows(dsn: str, statement: bytes) -> tuple[int, int, int]:
    """Rows an acquire of 10 returned with nothing concurrent (rolled back): leased
    jobs, ``missed`` markers (id NULL), and the ``jobs`` updates in its plan."""
    with psycopg.connect(dsn) as conn:
        conn.execute(LOAD, {"pending": PENDING, "total": PENDING + FINISHED})
        conn.execute("ANALYZE pgwork.jobs")
        conn.commit()
        query = statement.replace(b"%(limit)s", b"10")
        rows = conn.execute(query, ACQUIRE_PARAMS).fetchall()
        [(document,)] = conn.execute(b"EXPLAIN (FORMAT JSON) " + query, ACQUIRE_PARAMS).fetchall()
        conn.rollback()
    if isinstance(document, str):
        document = json.loads(document)
    updates = [
        n
        for n in _nodes(document[0]["Plan"])
        if n["Node Type"] == "ModifyTable" and n.get("Relation Name") == "jobs"
    ]
    leased = sum(1 for row in rows if row[0] is not None)
    return leased, len(rows) - leased, len(updates)


def test_a_quiet_acquire_updates_jobs_once_and_reports_no_miss(pgwork_dsn: str) -> None:
    # Every candidate kept its row version: ten jobs, no marker, and a single UPDATE
    # of jobs in the plan (no second one initialised on each run for the rare miss).
    assert _acquired_rows(pgwork_dsn, render("pgwork").leases.acquire) == (10, 0, 1)


def test_an_acquire_whose_marker_ignores_the_counts_reports_a_miss(pgwork_dsn: str) -> None:
    # Control: without the test of the counts the marker row is always there, and
    # every acquire would be followed by another.
    statement = render("pgwork").leases.acquire
    control = statement.replace(MISSED_GATE, b"WHERE true")
    assert control != statement
    assert _acquired_rows(pgwork_dsn, control) == (10, 1, 1)
