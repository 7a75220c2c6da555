"""Matching signals reads two small index ranges, whatever the tables hold.

A match probes the waiting steps of its names through ``jobs_wait_signal_idx`` (no
entry for a job that never waits, nor for a step matched or run) and their pending
signals through ``signals_pending_idx``; a step's attempts find its signal through
``signals_consumed_idx``; the sweep merges the two partial indexes in name order; the
probe before a match reads at most one entry of each per name. With
thousands of ordinary jobs (blocked on chains, scheduled, ended) and consumed signals
around, none of them reads more than the rows it is about. The control drops the
steps' index: the match then reads every blocked and scheduled job.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from pgwork.postgres.sql import render

SQL = render("pgwork").signals


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _load(conn: psycopg.Connection[Any]) -> None:
    """20,000 jobs that never waited (a quarter each completed, ready, blocked on chains
    and scheduled a day ahead), 5,000 consumed signals and 5,000 pending ones to names
    nothing waits for, and three steps waiting for ``payment:1`` and one signal to it."""
    conn.execute(
        """
        INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, status,
                                 max_attempts, chain_status, scheduled_at)
        SELECT id, 't', id, 't',
               (ARRAY['completed', 'pending', 'blocked', 'pending'])[n % 4 + 1]
               ::pgwork.job_status, 1, 'active',
               now() + CASE WHEN n % 4 = 3 THEN interval '1 day' ELSE interval '0' END
        FROM (SELECT gen_random_uuid() AS id, n FROM generate_series(1, 20000) AS n) AS g
        """
    )
    conn.execute(
        """
        INSERT INTO pgwork.signals (id, name, payload, consumed_by, consumed_at)
        SELECT gen_random_uuid(), 'payment:' || n, '{}',
               CASE WHEN n % 2 = 0 THEN gen_random_uuid() END,
               CASE WHEN n % 2 = 0 THEN now() END
        FROM generate_series(2, 10001) AS n
        """
    )
    conn.execute(
        "INSERT INTO pgwork.signals (id, name, payload) VALUES (%s, 'payment:1', '{}')", (uuid4(),)
    )
    root = uuid4()
    conn.execute(
        "INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, status,"
        " max_attempts, chain_status) VALUES (%s, 'order', %s, 'order', 'completed', 1,"
        " 'active')",
        (root, root),
    )
    for index in range(1, 4):
        conn.execute(
            "INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, chain_index,"
            " status, max_attempts, wait_signal) VALUES (%s, 'ship', %s, 'order', %s,"
            " 'blocked', 1, 'payment:1')",
            (uuid4(), root, index),
        )
    conn.execute("ANALYZE pgwork.jobs")
    conn.execute("ANALYZE pgwork.signals")


def _scans(conn: psycopg.Connection[Any], query: bytes, params: dict[str, Any]) -> set[str]:
    """Each scan of the plan: ``Seq Scan on jobs``, or the index it reads."""
    [(document,)] = conn.execute(b"EXPLAIN (FORMAT JSON) " + query, params).fetchall()
    plan = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
    found = set()
    for node in _nodes(plan):
        if node["Node Type"] == "Seq Scan":
            found.add(f"Seq Scan on {node['Relation Name']}")
        elif "Index Name" in node:
            found.add(node["Index Name"])
    return found


def _jobs_read(conn: psycopg.Connection[Any], query: bytes, params: dict[str, Any]) -> int:
    """Rows of ``jobs`` the statement read (every scan of the table or of one of its
    indexes, kept or filtered out), run under EXPLAIN ANALYZE and rolled back."""
    with conn.transaction(force_rollback=True):
        [(document,)] = conn.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + query, params).fetchall()
    plan = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
    read = 0
    for node in _nodes(plan):
        on_jobs = node.get("Relation Name") == "jobs" or node.get("Index Name", "").startswith(
            "jobs_"
        )
        if on_jobs and "Scan" in node["Node Type"] and node["Node Type"] != "Bitmap Heap Scan":
            loops = node.get("Actual Loops", 1)
            read += (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * loops
    return read


@pytest.mark.parametrize("build", ["indexed", "control-no-step-index"])
def test_a_match_reads_the_steps_and_signals_of_its_names_by_index(
    pgwork_dsn: str, build: str
) -> None:
    with psycopg.connect(pgwork_dsn, autocommit=True) as conn:
        _load(conn)
        if build == "control-no-step-index":
            conn.execute("DROP INDEX pgwork.jobs_wait_signal_idx")
            conn.execute("ANALYZE pgwork.jobs")
        params = {"names": ["payment:1"], "limit": 100}
        scans = _scans(conn, SQL.match_signals, params)
        read = _jobs_read(conn, SQL.match_signals, params)
    if build == "indexed":
        assert {"jobs_wait_signal_idx", "signals_pending_idx"} <= scans, scans
        assert not any(scan.startswith("Seq Scan") for scan in scans), scans
        assert read <= 10, read  # the three steps, and their rows again by key
    else:
        assert read >= 5000, read  # every blocked or scheduled job


@pytest.mark.parametrize("name", ["payment:1", "payment:2", "payment:3"])
def test_the_probe_before_a_match_reads_its_names_index_entries_only(
    pgwork_dsn: str, name: str
) -> None:
    """Whether a name has both a pending signal and a waiting step: a signal and steps
    (``payment:1``), a consumed signal and no step (``payment:2``), a pending signal and
    no step (``payment:3``)."""
    with psycopg.connect(pgwork_dsn, autocommit=True) as conn:
        _load(conn)
        params = {"names": [name]}
        scans = _scans(conn, SQL.matchable_names, params)
        read = _jobs_read(conn, SQL.matchable_names, params)
        found = conn.execute(SQL.matchable_names, params).fetchall()
    assert scans <= {"jobs_wait_signal_idx", "signals_pending_idx"}, scans
    assert "signals_pending_idx" in scans, scans
    assert read <= 1, read  # the first waiting step, if any
    assert found == ([("payment:1", True)] if name == "payment:1" else [])


def test_a_steps_signal_and_the_sweep_read_no_table_whole(pgwork_dsn: str) -> None:
    with psycopg.connect(pgwork_dsn, autocommit=True) as conn:
        _load(conn)
        received = _scans(conn, SQL.received_signal, {"job_id": uuid4()})
        swept = _scans(conn, SQL.find_unmatched, {"limit": 100})
    assert received == {"signals_consumed_idx"}, received
    assert swept == {"jobs_wait_signal_idx", "signals_pending_idx"}, swept
