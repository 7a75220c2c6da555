"""pgwork's own turn statement driven in a bare loop: the server's cost per job, no worker.

    python -m bench.turns --dsn DSN [--batch 200] [--jobs 40000] [--repeat 3] [--no-prepare]

A worker's drain is, on the server, one statement per turn (``COMPLETE_AND_ACQUIRE``:
complete the last batch, lease the next). Here one connection sends exactly that
statement, as the adapter renders it and with the parameters it builds, over a
pre-loaded queue: each turn completes the jobs the previous one leased. No worker
Python runs, so the figures are what pgwork's statements cost the server, and what
rate they would allow if the client cost nothing. Each run alternates with the
*writes alone*: the same two updates (completion by id, lease by the row version of a
``FOR UPDATE SKIP LOCKED`` scan) with nothing else: no chain roots, no per-type
leases, no head row, one ``RETURNING`` column: the floor pgwork's schema allows.

For each: the backend's CPU per job (``/proc/PID/schedstat``, so the server must run on
this machine), the WAL per job of this database only (``pg_walinspect``, without
full-page images; a temporary replication slot keeps it until it is read) and jobs/s
of the loop, and how many jobs were left unfinished (0: every turn completed what
the previous one leased). The first five turns are not counted. ``--no-prepare`` runs with
``prepare_threshold=None`` (every turn planned, as through PgBouncer).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench._env import PgworkDatabases, server
from bench._pgwork_app import SCHEMA, bulk_load, settle
from pgwork.adapters.state import Completion
from pgwork.postgres._arrays import completion_arrays, turn_constants
from pgwork.postgres.sql import render

__all__ = ["flush_to", "main"]

SKIP = 5

WRITES_ALONE = """
WITH done AS (
    UPDATE {jobs} AS j
    SET status = 'completed', output = c.output::jsonb, completed_at = now(),
        leased_by = NULL, leased_until = NULL, lease_token = NULL,
        chain_status = 'completed', chain_completed_at = now()
    FROM unnest(%(ids)b::uuid[], %(tokens)b::uuid[], %(outputs)b::text[])
        AS c(id, token, output)
    WHERE j.id = c.id AND j.lease_token = c.token AND j.status::text = 'running'
    RETURNING j.id
),
candidates AS (
    SELECT j.id, j.ctid FROM {jobs} AS j
    WHERE j.status = 'pending' AND j.queue = 'default' AND j.scheduled_at <= now()
    ORDER BY j.priority, j.scheduled_at
    LIMIT {limit}
    FOR UPDATE SKIP LOCKED
),
leased AS (
    UPDATE {jobs} AS j
    SET status = 'running', attempt = j.attempt + 1, leased_by = %(worker_id)s,
        lease_token = gen_random_uuid(), leased_until = now() + interval '60 seconds',
        started_at = COALESCE(j.started_at, now())
    FROM candidates AS c
    WHERE j.ctid = c.ctid AND j.id = c.id
    RETURNING j.id, j.lease_token
)
SELECT NULL::uuid, NULL::uuid, (SELECT count(*) FROM done)
UNION ALL
SELECT id, lease_token, NULL FROM leased
"""

_WAL = """
SELECT COALESCE(sum(record_length - fpi_length), 0)::bigint
FROM pg_get_wal_records_info(%(start)s::pg_lsn, %(end)s::pg_lsn)
WHERE block_ref LIKE '%%/' || %(db)s || '/%%'
   OR (block_ref IS NULL OR block_ref = '') AND xid IN (
        SELECT xid FROM pg_get_wal_records_info(%(start)s::pg_lsn, %(end)s::pg_lsn)
        WHERE block_ref LIKE '%%/' || %(db)s || '/%%')
"""


@dataclass(frozen=True)
class Run:
    server_us: float
    wal_bytes: float
    jobs_per_s: float
    unfinished: int  # jobs not completed at the end: 0 unless a turn lost some


async def flush_to(probe: psycopg.AsyncConnection[Any], lsn: str) -> None:
    """Have the WAL up to ``lsn`` on disk: pg_walinspect reads only that far.

    Nothing else may push it there. A record no commit follows (a page pruned by the
    last scan, the background writer's snapshot of running transactions) waits for the
    WAL writer, which flushes only whole pages or asynchronous commits and, on an idle
    server, sleeps for seconds at a time; with ``synchronous_commit=off`` (the embedded
    test server) even the commits wait for it. So the probe commits a transaction that
    wrote WAL, synchronously: its commit is flushed, and everything before it with it.
    """
    if await _flushed(probe, lsn):
        return
    async with probe.transaction():
        await probe.execute("SET LOCAL synchronous_commit = on")
        await probe.execute("SELECT pg_logical_emit_message(true, 'pgwork-bench', '')")
    if not await _flushed(probe, lsn):
        raise RuntimeError(f"the server did not flush its WAL up to {lsn}")


async def _flushed(probe: psycopg.AsyncConnection[Any], lsn: str) -> bool:
    cur = await probe.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (lsn,))
    [(done,)] = await cur.fetchall()
    return bool(done)


def _cpu(pid: int) -> float:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9


# A turn: (connection, leases held) -> leases held next.
Turn = Callable[[psycopg.AsyncConnection[Any], list[tuple[Any, Any]]], Any]


def _pgwork_turn(batch: int) -> Turn:
    statement = render(SCHEMA).outcomes.complete_and_acquire.replace(
        b"%(limit)s", str(batch).encode()
    )

    async def turn(
        conn: psycopg.AsyncConnection[Any], held: list[tuple[Any, Any]]
    ) -> list[tuple[Any, Any]]:
        params = _params(conn, held)
        async with conn.cursor(binary=True) as cur:
            await cur.execute(statement, params)
            rows = await cur.fetchall()
        return [(r[6], r[16]) for r in rows if not r[0] and r[6] is not None]

    return turn


def _writes_turn(batch: int) -> Turn:
    names = {"jobs": sql.Identifier(SCHEMA, "jobs"), "limit": sql.SQL(str(batch))}
    statement = sql.SQL(WRITES_ALONE).format(**names).as_bytes(None)

    async def turn(
        conn: psycopg.AsyncConnection[Any], held: list[tuple[Any, Any]]
    ) -> list[tuple[Any, Any]]:
        async with conn.cursor(binary=True) as cur:
            await cur.execute(statement, _params(conn, held))
            rows = await cur.fetchall()
        return [(r[0], r[1]) for r in rows if r[0] is not None]

    return turn


def _params(conn: psycopg.AsyncConnection[Any], held: list[tuple[Any, Any]]) -> dict[str, Any]:
    encoding = conn.info.encoding
    completions = [Completion(job_id, token, "null") for job_id, token in held]
    return {
        "worker_id": "bench-turns",
        **turn_constants((("noop", timedelta(seconds=60)),), ("default",), encoding),
        **completion_arrays(completions, encoding),
    }


async def _drain(dsn: str, jobs: int, turn: Turn, prepare: bool) -> Run:
    await bulk_load(dsn, jobs)
    await settle(dsn)
    slot = f"bench_turns_{os.getpid()}"
    async with (
        await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, prepare_threshold=5 if prepare else None
        ) as conn,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as probe,
    ):
        await probe.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        cur = await probe.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
        [(db,)] = await cur.fetchall()
        pid = conn.info.backend_pid
        held: list[tuple[Any, Any]] = await turn(conn, [])
        for _ in range(SKIP):
            held = await turn(conn, held)
        await probe.execute("SELECT pg_create_physical_replication_slot(%s, true, true)", (slot,))
        cur = await probe.execute("SELECT pg_current_wal_insert_lsn()::text")
        [(start,)] = await cur.fetchall()
        cpu, wall, done = _cpu(pid), time.perf_counter(), 0
        while held:
            done += len(held)
            held = await turn(conn, held)
        cpu, wall = _cpu(pid) - cpu, time.perf_counter() - wall
        cur = await probe.execute("SELECT pg_current_wal_insert_lsn()::text")
        [(end,)] = await cur.fetchall()
        await flush_to(probe, end)
        cur = await probe.execute(_WAL, {"start": start, "end": end, "db": str(db)})
        [(wal,)] = await cur.fetchall()
        cur = await probe.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE status <> 'completed'").format(
                sql.Identifier(SCHEMA, "jobs")
            )
        )
        [(unfinished,)] = await cur.fetchall()
    return Run(cpu / done * 1e6, int(wal) / done, done / wall, int(unfinished))


async def _run(args: argparse.Namespace) -> None:
    prepare = not args.no_prepare
    rows: dict[str, list[Run]] = {"pgwork's turn": [], "the writes alone": []}
    with server(args.dsn) as (admin, _kind):
        dbs = PgworkDatabases(admin)
        try:
            for _ in range(args.repeat):
                for name, make in (
                    ("pgwork's turn", _pgwork_turn),
                    ("the writes alone", _writes_turn),
                ):
                    with dbs.fresh() as dsn:
                        run = await _drain(dsn, args.jobs, make(args.batch), prepare)
                    rows[name].append(run)
                    print(
                        f"{name}, turns of {args.batch}: server {run.server_us:.1f} µs/job, "
                        f"WAL {run.wal_bytes:,.0f} B/job, {run.jobs_per_s:,.0f} jobs/s, "
                        f"{run.unfinished} unfinished"
                    )
        finally:
            dbs.close()
    for name, runs in rows.items():
        print(
            f"median, {name}: server {statistics.median(r.server_us for r in runs):.1f} µs/job, "
            f"WAL {statistics.median(r.wal_bytes for r in runs):,.0f} B/job, "
            f"{statistics.median(r.jobs_per_s for r in runs):,.0f} jobs/s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.turns", description=__doc__)
    parser.add_argument("--dsn", help="admin DSN (default: an embedded PostgreSQL)")
    parser.add_argument("--batch", type=int, default=200, help="jobs per turn")
    parser.add_argument("--jobs", type=int, default=40000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-prepare", action="store_true", help="prepare_threshold=None")
    asyncio.run(_run(parser.parse_args()))


if __name__ == "__main__":
    main()
