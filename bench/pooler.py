"""Drain throughput through PgBouncer in transaction mode vs a direct connection.

    python -m bench.pooler [--dsn ADMIN_DSN] [--jobs 5000] [--slots 10] [--mode staged]

Starts its own PgBouncer (``pgwork.testing.pgbouncer``, transaction mode) in front of
the server of ``--dsn`` (default: PGWORK_TEST_DSN, then PGWORK_DSN). For each route it
migrates a fresh database, loads ``--jobs`` no-op jobs, and times one in-process worker
(``--slots`` slots) draining them: its state adapter goes through the route (with
``prepare_threshold=None`` through the pooler), its notifications direct. Prints jobs/s
and the transactions the database committed per job (``pg_stat_database``). The
``direct-unprepared`` route (direct, ``prepare_threshold=None``) tells the cost of the
extra hop apart from the cost of not preparing statements.
"""

from __future__ import annotations

import argparse
import os
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import anyio
import psycopg

from bench._pgwork_app import Item, registry
from pgwork import (
    ChainStart,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
)
from pgwork.testing.databases import (
    create_migrated_database,
    database_dsn,
    drop_database,
    unique_database_name,
)
from pgwork.testing.pgbouncer import PgBouncer, pgbouncer

__all__ = ["main"]


def _commits(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


async def _load(dsn: str, jobs: int, mode: str) -> None:
    state = await PostgresStateAdapter.connect(dsn)
    client = create_client(state_adapter=state, registry=registry())
    type_name = "noop_atomic" if mode == "atomic" else "noop"
    try:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            for start in range(0, jobs, 1000):
                await client.start_chains(
                    conn,
                    [
                        ChainStart(type_name, Item(n=n))
                        for n in range(start, min(jobs, start + 1000))
                    ],
                )
            await conn.commit()
    finally:
        await client.close()


async def _drain(state_dsn: str, notify_dsn: str, jobs: int, slots: int, **options: Any) -> float:
    state = await PostgresStateAdapter.connect(state_dsn, max_size=slots + 4, **options)
    client = create_client(
        state_adapter=state, notify_adapter=PostgresNotifyAdapter(notify_dsn), registry=registry()
    )
    done = anyio.Event()
    handled = 0

    async def handle(attempt: Any) -> None:
        nonlocal handled
        handled += 1
        if handled >= jobs:
            done.set()

    reg = client.registry
    worker = create_in_process_worker(
        client=client,
        processors={reg.get("noop"): handle, reg.get("noop_atomic"): handle},
        max_slots=slots,
    )
    try:
        started = time.perf_counter()
        async with worker:
            await done.wait()
            elapsed = time.perf_counter() - started
    finally:
        await client.close()
    return elapsed


def _route(admin_dsn: str, label: str, args: argparse.Namespace) -> None:
    name = unique_database_name("pgwork_bench_pooler")
    create_migrated_database(admin_dsn, name)
    direct = database_dsn(admin_dsn, name)
    try:
        anyio.run(_load, direct, args.jobs, args.mode)
        before = _commits(direct)
        bouncer: AbstractContextManager[PgBouncer | None] = (
            pgbouncer(admin_dsn) if label == "pooler" else nullcontext()
        )
        with bouncer as running:
            if running is None:
                options = {"prepare_threshold": None} if label == "direct-unprepared" else {}
                elapsed = anyio.run(
                    lambda: _drain(direct, direct, args.jobs, args.slots, **options)
                )
            else:
                pooled = running.dsn_for(direct)
                elapsed = anyio.run(
                    lambda: _drain(pooled, direct, args.jobs, args.slots, prepare_threshold=None)
                )
        # Stopping PgBouncer closed its server sessions, so their statistics are in.
        time.sleep(1.0)
        commits = _commits(direct) - before
        print(
            f"{label:17} jobs={args.jobs} slots={args.slots} mode={args.mode} "
            f"seconds={elapsed:.2f} jobs/s={args.jobs / elapsed:,.0f} "
            f"commits={commits} commits/job={commits / args.jobs:.2f}"
        )
    finally:
        drop_database(admin_dsn, name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pooler", description=__doc__)
    parser.add_argument(
        "--dsn", default=os.environ.get("PGWORK_TEST_DSN") or os.environ.get("PGWORK_DSN")
    )
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--mode", choices=("staged", "atomic"), default="staged")
    parser.add_argument("--rounds", type=int, default=1, help="Alternate the routes this often.")
    args = parser.parse_args(argv)
    if not args.dsn:
        parser.error("pass --dsn (an admin DSN) or set PGWORK_TEST_DSN / PGWORK_DSN")
    for _ in range(args.rounds):
        for label in ("direct", "direct-unprepared", "pooler"):
            _route(args.dsn, label, args)


if __name__ == "__main__":
    main()
