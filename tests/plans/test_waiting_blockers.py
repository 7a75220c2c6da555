"""What a step blocked on 10,000 children waits for costs the waiting views as much as
one blocked on three.

A step waits for 10,000 children (its parent's fan-out), beside 30 jobs each waiting
for three chains, among 20,000 other jobs. ``list_waiting`` (its blocked steps) and
``chain_waits`` (the step's chain) say how many of each step's blockers ended, of how
many: from the step's own counters (``blockers_open``, kept as each blocker's end is
settled) and its last edge by position (``job_blockers_position_idx``: a job's
positions run from 0, one per blocker). Each read runs under EXPLAIN ANALYZE and the
rows its scans of ``jobs`` and ``job_blockers`` handled are summed. The control is the
views' earlier count, every edge of each step and its blocker's root: 10,000 of each
for the big step.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgwork.postgres.sql import render
from pgwork.postgres.sql.waiting import BLOCKER_COUNTS

from .test_blocked_listing import _rows_read

pytestmark = pytest.mark.timeout(300)

SQL = render("pgwork").waiting
CHILDREN = 10_000
SMALL = 30
PARENT = "00000000-0000-0000-0000-00000000000a"

# Settled as the counters would be: the big step needs 5,000 of its children (the
# first 5,000 to complete): 2,500 have, 500 failed, the rest run. Each small waiter is
# blocked on three chains: one completed, one failed under "unblock", one running.
_LOAD = f"""
INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, status, max_attempts,
                         chain_status)
SELECT id, 'other', id, 'other', 'completed', 1, 'completed'
FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, 20000)) AS g;

INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, chain_index, status,
                         max_attempts, chain_status, blockers_needed, blockers_met,
                         blockers_open)
VALUES ('{PARENT}', 'split', '{PARENT}', 'split', 0, 'completed', 1, 'active', NULL, NULL,
        NULL),
       ('00000000-0000-0000-0000-00000000000b', 'collect', '{PARENT}', 'split', 1,
        'blocked', 1, NULL, 5000, 2500, 7000);
INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, status, max_attempts,
                         chain_status)
SELECT id, 'part', id, 'part', 'pending', 1,
       (CASE WHEN n <= 2500 THEN 'completed' WHEN n <= 3000 THEN 'failed'
             ELSE 'active' END)::pgwork.chain_status
FROM (SELECT gen_random_uuid() AS id, n FROM generate_series(1, {CHILDREN}) AS n) AS g;
INSERT INTO pgwork.job_blockers (job_id, blocker_chain_id, position, counted)
SELECT '00000000-0000-0000-0000-00000000000b', id,
       (row_number() OVER (ORDER BY md5(id::text)) - 1)::int,
       CASE chain_status WHEN 'completed' THEN 'met' WHEN 'failed' THEN 'failed' END
FROM pgwork.jobs WHERE type_name = 'part';

INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, status, max_attempts,
                         chain_status)
VALUES ('00000000-0000-0000-0000-0000000000c1', 'gate', '00000000-0000-0000-0000-0000000000c1',
        'gate', 'completed', 1, 'completed'),
       ('00000000-0000-0000-0000-0000000000c2', 'gate', '00000000-0000-0000-0000-0000000000c2',
        'gate', 'failed', 1, 'failed'),
       ('00000000-0000-0000-0000-0000000000c3', 'gate', '00000000-0000-0000-0000-0000000000c3',
        'gate', 'pending', 1, 'active');
INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, status, max_attempts,
                         chain_status, blockers_needed, blockers_met, blockers_open)
SELECT id, 'merge', id, 'merge', 'blocked', 1, 'active', 3, 2, 1
FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, {SMALL})) AS g;
INSERT INTO pgwork.job_blockers (job_id, blocker_chain_id, position, on_failure, counted)
SELECT m.id, g.id, g.n, g.policy, g.counted
FROM pgwork.jobs AS m
CROSS JOIN (VALUES
    ('00000000-0000-0000-0000-0000000000c1'::uuid, 0, 'fail', 'met'),
    ('00000000-0000-0000-0000-0000000000c2'::uuid, 1, 'unblock', 'met'),
    ('00000000-0000-0000-0000-0000000000c3'::uuid, 2, 'fail', NULL)
) AS g(id, n, policy, counted)
WHERE m.type_name = 'merge';
ANALYZE pgwork.jobs;
ANALYZE pgwork.job_blockers;
"""

# The count as it was: every edge of the step, and each one's chain root.
_EVERY_EDGE = """(
    SELECT count(*) AS total,
           count(*) FILTER (WHERE bc.chain_status IS DISTINCT FROM 'active') AS ended
    FROM {job_blockers} AS e
    LEFT JOIN {jobs} AS bc ON bc.id = e.blocker_chain_id AND bc.id = bc.chain_id
    WHERE e.job_id = w.id AND w.kind = 'blockers'
    HAVING w.kind = 'blockers'
)"""


def _fill(template: str) -> str:
    return template.replace("{job_blockers}", '"pgwork"."job_blockers"').replace(
        "{jobs}", '"pgwork"."jobs"'
    )


def _built(query: bytes, build: str) -> bytes:
    if build == "counters":
        return query
    counted = _fill(BLOCKER_COUNTS).encode()
    assert counted in query
    return query.replace(counted, _fill(_EVERY_EDGE).encode())


LISTING = {
    "kinds": ["blockers"],
    "signal": None,
    "prefix": None,
    "chain_type": None,
    "after_id": None,
    "limit": 51,
}


@pytest.fixture(scope="module")
def loaded(pg_server_dsn: str, pgwork_template_database: str) -> Any:
    from pgwork.testing.databases import temporary_database

    with temporary_database(pg_server_dsn, template=pgwork_template_database) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(_LOAD)
        yield dsn


@pytest.mark.parametrize("build", ["counters", "control-every-edge"])
def test_the_waiting_views_count_a_big_fan_out_from_its_counters(loaded: str, build: str) -> None:
    with psycopg.connect(loaded, autocommit=True) as conn:
        listing = _built(SQL.list_waiting, build)
        waits = _built(SQL.chain_waits, build)
        listed = _rows_read(conn, listing, LISTING)
        shown = _rows_read(conn, waits, {"ids": [PARENT]})
        rows = conn.execute(listing, LISTING, prepare=False).fetchall()
        [step] = conn.execute(waits, {"ids": [PARENT]}).fetchall()
    # The figures: (total, ended) of each listed step.
    figures = sorted((row[11], row[12]) for row in rows)
    assert figures == [(3, 2)] * SMALL + [(CHILDREN, 3000)], figures[-3:]
    assert (step[11], step[12]) == (CHILDREN, 3000)
    if build == "counters":
        # Each of the 31 steps: its row by the attention index and again by key, and
        # its last edge.
        assert listed <= 3 * (SMALL + 1), listed
        assert shown <= 10, shown
    else:
        assert listed >= 2 * CHILDREN, listed
        assert shown >= 2 * CHILDREN, shown
