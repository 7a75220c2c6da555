"""The idle workload: what pgwork workers cost while there is nothing to do.

One worker, then ten, each in a process of its own with pgwork's default settings
(``create_in_process_worker`` with only a client and a handler: its default slots,
poll interval, prefetch, heartbeat), on an empty queue. After a warm-up (the client's
pool, LISTEN, the first acquire and heartbeat are start-up, not idling), one window
(``Sizes.idle_window``: 60 s at full size) is measured from two readings, one at each
end, and each figure is given per idle minute:

- **commits**: the change in ``pg_stat_database.xact_commit`` of the benchmark's
  database: every transaction the workers' connections committed, read-only ones
  included (an autocommit ``SELECT`` is one, and so are a connection's start-up and
  psycopg's ``PREPARE`` of a statement it has run five times). The readings are taken
  over a connection to *another* database (the admin DSN's), so the harness adds no
  transaction to the one it counts, and nothing else connects to it during the window.
- **statements**: ``sum(calls)`` of ``pg_stat_statements`` for that database, when the
  extension is loaded and installed in the admin DSN's database (never installed by
  the benchmark); otherwise left out.
- **worker CPU**: user + system time of each worker process, from ``/proc/<pid>/stat``
  (all its threads), as CPU seconds per minute and as a share of one core.
- **server CPU**: the same for the PostgreSQL backends serving the workers'
  connections (found in ``pg_stat_activity``), when the server runs on this machine.

How fresh the counters are. From PostgreSQL 15 on, a backend keeps its statistics in
local memory and flushes them to shared memory when it goes idle, at most once a second
(and otherwise within 10 s, when its idle timer fires), and a transaction that touched
no table only with a later flush; before 15 it sent them to the statistics collector
every 500 ms. ``pg_stat_force_next_flush()`` (15+) only hurries
the backend that calls it, not the workers', so it cannot help here. A reading may
therefore miss up to about a second of a busy connection's commits, or one
transaction of a quiet one; the same happens at both ends of the window, so the error
is that much at most, not a drift (±1-2 % of a 60 s window for a connection committing
continuously). Each reading calls ``pg_stat_clear_snapshot()`` first, so a cached
snapshot (``stats_fetch_consistency``) cannot hide a change.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import psycopg
from psycopg.conninfo import conninfo_to_dict

from bench._context import LIB, Context
from bench._plan import row_idle
from bench._report import Measurement
from bench._worker_process import WorkerProcess

__all__ = ["WARM_UP", "Reading", "cpu_seconds", "idle", "read_counters"]

WORKER_COUNTS = (1, 10)
# Start-up left out of the window: longer than the default poll interval (2 s).
WARM_UP = 3.0
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Reading:
    """Counters at one moment (``at``: time.monotonic())."""

    at: float
    commits: int
    rollbacks: int
    statements: int | None
    workers: dict[int, float] = field(default_factory=dict)
    backends: dict[int, float] = field(default_factory=dict)


def cpu_seconds(pid: int, *, command: str | None = None) -> float | None:
    """User + system CPU seconds of process ``pid`` from /proc (None if it is gone, or if
    ``command`` is given and the process is not running that program)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
    if command is not None and name != command:
        return None
    fields = rest.split()
    # After the command: state, ppid, ... utime is the 12th, stime the 13th.
    return (int(fields[11]) + int(fields[12])) / TICKS


async def read_counters(
    admin: psycopg.AsyncConnection[Any], dbname: str, workers: list[WorkerProcess]
) -> Reading:
    await admin.execute("SELECT pg_stat_clear_snapshot()")
    cur = await admin.execute(
        "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = %s", [dbname]
    )
    row = await cur.fetchone()
    assert row is not None, f"no statistics for database {dbname}"
    statements = await _statements(admin, dbname)
    cur = await admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'",
        [dbname],
    )
    backends = {}
    for (pid,) in await cur.fetchall():
        seconds = cpu_seconds(pid, command="postgres")
        if seconds is not None:
            backends[pid] = seconds
    worker_cpu = {}
    for worker in workers:
        seconds = cpu_seconds(worker.proc.pid)
        if seconds is not None:
            worker_cpu[worker.proc.pid] = seconds
    return Reading(time.monotonic(), int(row[0]), int(row[1]), statements, worker_cpu, backends)


async def _statements(admin: psycopg.AsyncConnection[Any], dbname: str) -> int | None:
    try:
        cur = await admin.execute(
            "SELECT coalesce(sum(s.calls), 0) FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s",
            [dbname],
        )
    except psycopg.Error:  # not installed here, or not loaded by the server
        return None
    row = await cur.fetchone()
    return int(row[0]) if row else None


def _cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two readings by the processes seen at the end (a
    process that appeared in between counts from zero: starting it is part of idling)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def _measure(before: Reading, after: Reading, count: int) -> list[Measurement]:
    minutes = (after.at - before.at) / 60
    per_min = 1 / minutes
    seconds = after.at - before.at
    commits = (after.commits - before.commits) * per_min
    note = (
        f"{count} idle worker process{'es' if count > 1 else ''} with pgwork's defaults, "
        "an empty queue, "
        f"{seconds:.1f} s measured after {WARM_UP:.0f} s of warm-up; commits from "
        "pg_stat_database (read from another database), CPU from /proc/<pid>/stat"
    )
    rollbacks = after.rollbacks - before.rollbacks
    if rollbacks:
        note += f"; also {rollbacks * per_min:,.0f} rollbacks per minute"
    out = [
        Measurement(
            row_idle(count, "commits per minute"),
            LIB,
            commits,
            "commits/min",
            higher_is_better=False,
            note=note,
            detail=f"{commits / count:,.1f} per worker" if count > 1 else "",
        )
    ]
    if before.statements is not None and after.statements is not None:
        statements = (after.statements - before.statements) * per_min
        out.append(
            Measurement(
                row_idle(count, "statements per minute"),
                LIB,
                statements,
                "statements/min",
                higher_is_better=False,
                detail=f"{statements / count:,.1f} per worker" if count > 1 else "",
            )
        )
    for what, cpu in (
        ("CPU per worker process", _cpu_delta(before.workers, after.workers)),
        ("server CPU per worker", _cpu_delta(before.backends, after.backends)),
    ):
        if what.startswith("server") and not after.backends:
            continue  # the server runs elsewhere: its processes are not ours to read
        per_worker = cpu / count
        out.append(
            Measurement(
                row_idle(count, what),
                LIB,
                per_worker * per_min,
                "CPU s/min",
                higher_is_better=False,
                detail=f"{per_worker / seconds * 100:.2f} % of a core",
            )
        )
    return out


async def idle(ctx: Context) -> list[Measurement]:
    window = ctx.sizes.idle_window
    bar = ctx.bars.bar("pgwork: idle workers (seconds measured)", round(window) * 2)
    out: list[Measurement] = []
    with ctx.dbs.fresh() as dsn:
        dbname = str(conninfo_to_dict(dsn)["dbname"])
        workers: list[WorkerProcess] = []
        try:
            async with await psycopg.AsyncConnection.connect(
                ctx.dbs.admin_dsn, autocommit=True
            ) as admin:
                for count in WORKER_COUNTS:
                    while len(workers) < count:
                        # No progress reports: the child's CPU must be the worker's.
                        child = await WorkerProcess.start(dsn, slots=None, report_every=0)
                        workers.append(child)
                        await child.go()
                    await anyio.sleep(WARM_UP)
                    before = await read_counters(admin, dbname, workers)
                    done = bar.completed
                    deadline = before.at + window
                    while time.monotonic() < deadline:
                        await anyio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
                        bar.set(done + round(time.monotonic() - before.at))
                    after = await read_counters(admin, dbname, workers)
                    out += _measure(before, after, count)
        finally:
            for child in workers:
                await child.stop()
    bar.finish(f"{out[0].value:,.0f} commits/min with one worker" if out else "")
    return out
