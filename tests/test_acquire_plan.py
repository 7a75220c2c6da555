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

from pgwork.postgres._statements import render

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


def _acquire_plan(dsn: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LOAD, {"pending": PENDING, "total": PENDING + FINISHED})
        conn.execute("ANALYZE pgwork.jobs")
        row = conn.execute(b"EXPLAIN (FORMAT JSON) " + render("pgwork").acquire, params).fetchone()
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
