"""Listing blocked jobs reads as much for a step waiting for 10,000 children as for one
waiting for ten.

A step waits for 10,000 children (its edges' positions in another order than their
ids, as a handler's children are whenever ids and starts disagree), beside 30 jobs
each waiting for three chains, among 20,000 other jobs. Each read runs under EXPLAIN
ANALYZE and the rows its scans of ``jobs`` and ``job_blockers`` handled are summed:

- a page of ``list_blocked_jobs`` (50 jobs) reads at most ``LISTED_BLOCKERS + 1``
  edges of each job, and each one's chain root;
- a page of one job's blockers (``list_blockers``), from its middle, reads that page;
- ``chain_links`` of the step's chain reads at most ``limit`` edges of each of its jobs.

The controls: the listing's earlier statement (every edge of each job, aggregated
into two arrays) reads the 10,000 edges and their 10,000 roots, and the chain links'
earlier one (every edge of the chain's jobs, sorted, then the first ``limit``) the
10,000 edges; without
``job_blockers_position_idx`` (migration 0017) the bounded statements read every edge
of the step to find its first ones by position.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgwork.adapters.state import LISTED_BLOCKERS
from pgwork.postgres.sql import render

pytestmark = pytest.mark.timeout(300)

SQL = render("pgwork")
CHILDREN = 10_000
SMALL = 30
PAGE = 50

# A chain's blocker links as they were: every edge of each of its jobs, sorted.
_UNBOUNDED_LINKS = """
SELECT j.chain_id, j.id, e.blocker_chain_id, r.chain_status::text, j.status::text
FROM {jobs} AS j
JOIN {job_blockers} AS e ON e.job_id = j.id
LEFT JOIN {jobs} AS r ON r.id = e.blocker_chain_id AND r.id = r.chain_id
WHERE ((j.id = %(chain_id)s::uuid AND j.id = j.chain_id)
       OR (j.chain_id = %(chain_id)s::uuid AND j.id <> j.chain_id))
ORDER BY j.chain_index, e.position
LIMIT %(limit)s
"""

# The listing as it was: every edge of each blocked job, aggregated.
_UNBOUNDED = """
SELECT j.id, blk.chain_ids, blk.statuses
FROM (
    SELECT b.*
    FROM {jobs} AS b
    WHERE b.status = 'blocked'
      AND (%(after_at)s::timestamptz IS NULL
           OR (b.created_at <= %(after_at)s::timestamptz
               AND (b.created_at, b.id) < (%(after_at)s::timestamptz, %(after_id)s::uuid)))
    ORDER BY b.created_at DESC, b.id DESC
    LIMIT %(limit)s
) AS j
CROSS JOIN LATERAL (
    SELECT array_agg(e.blocker_chain_id ORDER BY e.position) AS chain_ids,
           array_agg(r.chain_status::text ORDER BY e.position) AS statuses
    FROM {job_blockers} AS e
    LEFT JOIN {jobs} AS r ON r.id = e.blocker_chain_id AND r.id = r.chain_id
    WHERE e.job_id = j.id
) AS blk
ORDER BY j.created_at DESC, j.id DESC
"""

_LOAD = f"""
INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, status, max_attempts,
                         chain_status)
SELECT id, 'other', id, 'other', 'completed', 1, 'completed'
FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, 20000)) AS g;

-- The parent's chain: the parent, completed, and its step, blocked on its children.
INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, chain_index, status,
                         max_attempts, chain_status, blockers_needed, blockers_met,
                         blockers_open)
VALUES ('00000000-0000-0000-0000-00000000000a', 'split', '00000000-0000-0000-0000-00000000000a',
        'split', 0, 'completed', 1, 'active', NULL, NULL, NULL),
       ('00000000-0000-0000-0000-00000000000b', 'collect', '00000000-0000-0000-0000-00000000000a',
        'split', 1, 'blocked', 1, NULL, {CHILDREN}, 0, {CHILDREN});
INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, status, max_attempts,
                         chain_status)
SELECT id, 'part', id, 'part', 'pending', 1, 'active'
FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, {CHILDREN})) AS g;
INSERT INTO pgwork.job_blockers (job_id, blocker_chain_id, position)
SELECT '00000000-0000-0000-0000-00000000000b', id,
       (row_number() OVER (ORDER BY md5(id::text)) - 1)::int
FROM pgwork.jobs WHERE type_name = 'part';

-- Small waiters: each blocked on three of the others.
INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, status, max_attempts,
                         chain_status, blockers_needed, blockers_met, blockers_open)
SELECT id, 'merge', id, 'merge', 'blocked', 1, 'active', 3, 0, 3
FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, {SMALL})) AS g;
INSERT INTO pgwork.job_blockers (job_id, blocker_chain_id, position)
SELECT m.id, o.id, o.n - 1
FROM pgwork.jobs AS m
CROSS JOIN LATERAL (
    SELECT x.id, row_number() OVER () AS n
    FROM (SELECT id FROM pgwork.jobs WHERE type_name = 'other' LIMIT 3) AS x
) AS o
WHERE m.type_name = 'merge';
ANALYZE pgwork.jobs;
ANALYZE pgwork.job_blockers;
"""

STEP = "00000000-0000-0000-0000-00000000000b"
PARENT = "00000000-0000-0000-0000-00000000000a"


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _rows_read(conn: psycopg.Connection[Any], query: bytes, params: dict[str, Any]) -> int:
    """Rows the statement's scans of ``jobs`` and ``job_blockers`` (tables or indexes)
    handled, kept or filtered out, over every loop."""
    [(document,)] = conn.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + query, params).fetchall()
    plan = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
    read = 0
    for node in _nodes(plan):
        relation = node.get("Relation Name", "")
        index = node.get("Index Name", "")
        ours = relation in ("jobs", "job_blockers") or index.startswith(("jobs_", "job_"))
        if ours and "Scan" in node["Node Type"] and node["Node Type"] != "Bitmap Heap Scan":
            loops = node.get("Actual Loops", 1)
            read += (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * loops
    return read


def _unbounded(template: str) -> bytes:
    names = {name: sql.Identifier("pgwork", name) for name in ("jobs", "job_blockers")}
    return sql.SQL(template).format(**names).as_bytes(None)


@pytest.mark.parametrize("build", ["bounded", "control-old-query", "control-no-position-index"])
def test_a_ten_thousand_child_fan_out_costs_its_listings_a_page_of_rows(
    pgwork_dsn: str, build: str
) -> None:
    listing = {"after_at": None, "after_id": None, "limit": PAGE, "edges": LISTED_BLOCKERS + 1}
    middle = {"job_id": STEP, "after": CHILDREN // 2, "limit": PAGE + 1}
    links = {"chain_id": PARENT, "limit": 100}
    with psycopg.connect(pgwork_dsn, autocommit=True) as conn:
        conn.execute(_LOAD)
        if build == "control-no-position-index":
            conn.execute("DROP INDEX pgwork.job_blockers_position_idx")
        old = build == "control-old-query"
        listed = _rows_read(
            conn, _unbounded(_UNBOUNDED) if old else SQL.queries.list_blocked_jobs, listing
        )
        paged = _rows_read(conn, SQL.queries.list_blockers, middle)
        linked = _rows_read(
            conn, _unbounded(_UNBOUNDED_LINKS) if old else SQL.insight.chain_blockers, links
        )
        [(shown,)] = conn.execute(
            b"SELECT count(*) FROM (" + SQL.queries.list_blockers + b") AS p", middle
        ).fetchall()
    assert shown == PAGE + 1
    blocked = SMALL + 1
    # Per job: its row, at most LISTED_BLOCKERS + 1 edges, the root of each.
    bound = blocked * (1 + 2 * (LISTED_BLOCKERS + 1)) + 100
    if build == "control-old-query":
        assert listed >= 2 * CHILDREN, listed
        assert linked >= CHILDREN, linked
        return
    if build == "control-no-position-index":
        assert listed >= CHILDREN, listed
        assert paged >= CHILDREN, paged
        assert linked >= CHILDREN, linked
        return
    assert listed <= bound, (listed, bound)
    assert paged <= 2 * (PAGE + 1) + 10, paged  # the page's edges and their roots
    assert linked <= 2 * 100 + 10, linked  # the step's first 100 edges and their roots
