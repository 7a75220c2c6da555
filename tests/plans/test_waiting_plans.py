"""The waiting views read the waiting rows, whatever else the tables hold.

``list_waiting`` reads each kind of wait from the partial index its rows are in: signal
waits from ``jobs_wait_signal_idx``, blocked jobs from ``jobs_attention_idx``, sleeping
ones from ``jobs_acquire_idx`` one (queue, priority) at a time from now on, so a ready
backlog of any size is not read; a chain's wait is its root by primary key and its
newest job by ``jobs_chain_idx``; pending signals come from ``signals_pending_idx``.
The table holds a week of sample jobs, a backlog of 20,000 ready jobs and 5,000
consumed signals. The controls: a plain read of the sleeping steps (no loose scan)
reads the backlog too; without the steps' index the signal waits are read from every
blocked and scheduled job.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from pgwork.postgres.sql import render
from pgwork.postgres.sql.waiting import _sleeps
from pgwork.testing import sample_statements
from pgwork.testing.databases import temporary_database

SQL = render("pgwork").waiting
KINDS = ["signal", "debounce", "sleep", "blockers"]
BACKLOG = 20_000
ACQUIRE = "jobs_acquire_idx"
WAITS = 30
# Of the sample's 30,000 jobs: blocked on chains, and scheduled an hour ahead.
BLOCKED = 150
SCHEDULED = 600


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _load(conn: psycopg.Connection[Any]) -> None:
    for statement in sample_statements(jobs=30_000, schema="pgwork"):
        conn.execute(statement)
    conn.execute(
        """
        INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, status,
                                 max_attempts, chain_status, scheduled_at)
        SELECT id, 'ready', id, 'ready', 'pending', 1, 'active', now() - n * interval '1 s'
        FROM (SELECT gen_random_uuid() AS id, n FROM generate_series(1, %s) AS n) AS g
        """,
        (BACKLOG,),
    )
    root = uuid4()
    conn.execute(
        "INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, status,"
        " max_attempts, chain_status) VALUES (%s, 'order', %s, 'order', 'completed', 1,"
        " 'active')",
        (root, root),
    )
    conn.execute(
        """
        INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, chain_index,
                                 status, max_attempts, wait_signal, scheduled_at)
        SELECT gen_random_uuid(), 'ship', %s, 'order', n,
               (CASE WHEN n %% 2 = 0 THEN 'blocked' ELSE 'pending' END)::pgwork.job_status,
               1, 'payment:' || n, now() + interval '2 days'
        FROM generate_series(1, %s) AS n
        """,
        (root, WAITS),
    )
    conn.execute(
        """
        INSERT INTO pgwork.signals (id, name, payload, consumed_by, consumed_at)
        SELECT gen_random_uuid(), 'payment:' || n, '{}',
               CASE WHEN n > 20 THEN gen_random_uuid() END, CASE WHEN n > 20 THEN now() END
        FROM generate_series(1, 5020) AS n
        """
    )
    conn.execute("ANALYZE pgwork.jobs")
    conn.execute("ANALYZE pgwork.signals")


def _plan(conn: psycopg.Connection[Any], query: bytes, params: dict[str, Any]) -> dict[str, Any]:
    """The plan, run (EXPLAIN ANALYZE), as the adapter sends it: unprepared."""
    [(document,)] = conn.execute(
        b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params, prepare=False
    ).fetchall()
    plan: dict[str, Any] = (json.loads(document) if isinstance(document, str) else document)[0][
        "Plan"
    ]
    return plan


def _scans(plan: dict[str, Any], table: str = "jobs") -> set[str]:
    """Each scan of ``table`` that ran: ``Seq Scan``, or the index it read."""
    found = set()
    for node in _nodes(plan):
        ran = node.get("Actual Loops", 0) > 0
        if node["Node Type"] == "Seq Scan" and node.get("Relation Name") == table and ran:
            found.add("Seq Scan")
        elif node.get("Index Name", "").startswith(f"{table}_") and ran:
            found.add(node["Index Name"])
    return found


def _read(plan: dict[str, Any], table: str = "jobs") -> int:
    """Rows of ``table`` the plan went through (kept or filtered out), over every scan of
    the table or of one of its indexes."""
    read = 0
    for node in _nodes(plan):
        on_table = node.get("Relation Name") == table or node.get("Index Name", "").startswith(
            f"{table}_"
        )
        if on_table and "Scan" in node["Node Type"] and node["Node Type"] != "Bitmap Heap Scan":
            rows = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
            read += rows * node.get("Actual Loops", 1)
    return int(read)


def _index_pages(plan: dict[str, Any], index: str) -> int:
    """Pages of ``index`` the plan's scans of it went through: an index scan reports
    the entries it kept, not those it stepped over, but it reads the pages of both."""
    return sum(
        int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))
        for node in _nodes(plan)
        if node.get("Index Name") == index and node["Node Type"].endswith("Index Scan")
    )


def _listing(**given: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "kinds": KINDS,
        "signal": None,
        "prefix": None,
        "chain_type": None,
        "after_id": None,
        "limit": 51,
    }
    return {**params, **given}


@pytest.fixture(scope="module")
def loaded(pg_server_dsn: str, pgwork_template_database: str) -> Iterator[str]:
    """One loaded database for the module's read-only plans (loading takes seconds)."""
    with temporary_database(pg_server_dsn, template=pgwork_template_database) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            _load(conn)
        yield dsn


LISTINGS: dict[str, tuple[dict[str, Any], set[str], int]] = {
    # name: (parameters, indexes read, most rows of jobs read)
    "every-kind": (
        _listing(),
        {"jobs_wait_signal_idx", "jobs_attention_idx", "jobs_acquire_idx", "jobs_pkey"},
        # The waiting signal steps, the blocked jobs, the sleeping ones (each read twice:
        # index and row), the probes of the loose scan and the page's rows.
        2_000,
    ),
    "signal-waits": (_listing(kinds=["signal"]), {"jobs_wait_signal_idx", "jobs_pkey"}, 120),
    "one-name": (
        _listing(kinds=["signal"], signal="payment:7"),
        {"jobs_wait_signal_idx", "jobs_pkey"},
        4,
    ),
    "a-prefix": (
        _listing(kinds=["signal"], prefix="payment:2"),
        {"jobs_wait_signal_idx", "jobs_pkey"},
        120,
    ),
    "sleeping": (_listing(kinds=["sleep"]), {"jobs_acquire_idx", "jobs_pkey"}, 1_500),
    "blocked": (_listing(kinds=["blockers"]), {"jobs_attention_idx", "jobs_pkey"}, 500),
    "of-a-chain-type": (_listing(chain_type="order"), set(), 2_000),
}


@pytest.mark.parametrize("name", LISTINGS)
def test_a_waiting_listing_reads_the_waiting_rows_by_index(loaded: str, name: str) -> None:
    params, indexes, most = LISTINGS[name]
    with psycopg.connect(loaded, autocommit=True) as conn:
        plan = _plan(conn, SQL.list_waiting, params)
    scans = _scans(plan)
    assert "Seq Scan" not in scans, scans
    assert indexes <= scans, scans
    assert _read(plan) <= most, _read(plan)


def test_control_a_plain_read_of_the_sleeping_steps_reads_the_ready_backlog_too(
    loaded: str,
) -> None:
    """The obvious statement, without the loose scan: the sleeping steps' rule over the
    pending jobs, newest first. PostgreSQL 18's B-tree skip scan walks the acquire
    index by (queue, priority) of its own accord, so the plain statement reads no
    backlog there: the control holds on the servers before it."""
    with psycopg.connect(loaded, autocommit=True) as conn:
        if conn.info.server_version >= 180000:
            pytest.skip("PostgreSQL 18 skips through the index by itself (skip scan)")
    plain = (
        f"SELECT j.id FROM pgwork.jobs AS j WHERE {_sleeps('j')} ORDER BY j.id DESC LIMIT 51"
    ).encode()
    with psycopg.connect(loaded, autocommit=True) as conn:
        loose = _index_pages(_plan(conn, SQL.list_waiting, _listing(kinds=["sleep"])), ACQUIRE)
        whole = _index_pages(_plan(conn, plain, {}), ACQUIRE)
    assert whole >= BACKLOG // 400, whole  # at most a few hundred entries a page
    assert loose * 4 <= whole, (loose, whole)


def test_control_without_the_steps_index_signal_waits_read_every_blocked_and_scheduled_job(
    pgwork_dsn: str,
) -> None:
    with psycopg.connect(pgwork_dsn, autocommit=True) as conn:
        _load(conn)
        conn.execute("DROP INDEX pgwork.jobs_wait_signal_idx")
        conn.execute("ANALYZE pgwork.jobs")
        plan = _plan(conn, SQL.list_waiting, _listing(kinds=["signal"]))
    assert "jobs_wait_signal_idx" not in _scans(plan)
    assert _read(plan) >= SCHEDULED + BLOCKED, _read(plan)


def test_a_chains_wait_and_the_pending_signals_read_their_own_rows(loaded: str) -> None:
    with psycopg.connect(loaded, autocommit=True) as conn:
        [(chain,)] = conn.execute(
            "SELECT chain_id FROM pgwork.jobs WHERE wait_signal IS NOT NULL LIMIT 1"
        ).fetchall()
        waits = _plan(conn, SQL.chain_waits, {"ids": [chain]})
        pending = {"pending": True, "name": None, "prefix": None, "after_id": None, "limit": 51}
        signals = _plan(conn, SQL.list_signals, pending)
        one = _plan(conn, SQL.list_signals, {**pending, "name": "payment:3"})
    assert _scans(waits) <= {"jobs_pkey", "jobs_chain_idx"}, _scans(waits)
    assert _read(waits) <= 10, _read(waits)
    assert _scans(signals, "signals") == {"signals_pending_idx"}, _scans(signals, "signals")
    assert _read(signals, "signals") <= 40, _read(signals, "signals")
    assert _read(one, "signals") <= 2, _read(one, "signals")
