"""Where a drain's time goes: every statement pgwork sends, by name, task and cost.

    python -m bench.roundtrips [--dsn DSN] [--jobs 5000] [--pyinstrument FILE]
        [--mode staged|atomic|chains|enqueue|enqueue-batch] [--atomic-group N] [--batch N]

Drains ``--jobs`` no-op jobs with one in-process worker (10 slots) (or, in the enqueue
modes, enqueues them one per transaction or ``--batch`` (default 1,000) per batch) while psycopg is
traced from inside: each round trip (cursor statement, BEGIN/COMMIT) is recorded with
the statement's name (from the catalogue ``pgwork.postgres.sql``), the asyncio task that sent
it (the worker's main loop, a slot, the lease renewer) and its duration. Prints round
trips per job, time spent waiting on PostgreSQL per task vs wall time, and the worker
process's CPU time. ``--atomic-group`` sets the worker's ``atomic_group`` (atomic
mode). ``--pyinstrument`` also profiles the Python side (needs
``pip install pyinstrument``) and writes its text report to FILE.

Tracing costs a few microseconds per statement: compare rates with ``python -m bench``,
not with this tool.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import _connection_base, _pipeline_base

from bench._env import PgworkDatabases, server
from bench._pgwork_app import SCHEMA, Counter, Item, bulk_load, open_client, wait_drained
from pgwork import ChainStart, create_in_process_worker
from pgwork.postgres.sql import render

__all__ = ["main"]


@dataclass
class Trace:
    """Round trips seen while tracing: (task group, statement name) -> durations."""

    names: dict[bytes, str]
    calls: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    intervals: dict[str, list[tuple[float, float]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    on: bool = False

    def name_of(self, query: Any) -> str:
        raw = query if isinstance(query, bytes) else str(query).encode()
        if raw in self.names:
            return self.names[raw]
        # Acquire statements carry their LIMIT in the text (one cached plan per limit).
        unlimited = _LIMIT.sub(b"LIMIT %(limit)s", raw)
        if unlimited in self.names:
            return self.names[unlimited]
        if b"pg_notify" in raw:
            return "notify"
        words = raw.split()
        return words[0].decode().upper() if words else "?"

    def record(self, query: Any, started: float, ended: float) -> None:
        self.record_named(self.name_of(query), started, ended)

    def record_named(self, name: str, started: float, ended: float) -> None:
        if not self.on:
            return
        group = _task_group()
        self.calls[(group, name)].append(ended - started)
        self.intervals[group].append((started, ended))


_LIMIT = re.compile(rb"LIMIT \d+")
_SLOT = re.compile(r"^pgwork-(slot|handler)")


def _task_group() -> str:
    try:
        task = asyncio.current_task()
    except RuntimeError:
        return "?"
    name = task.get_name() if task is not None else "?"
    if _SLOT.match(name):
        return "slot"
    if name.startswith("pgwork-worker-"):
        return "main loop"
    return name if not name.startswith("Task-") else "other task"


@contextmanager
def traced(trace: Trace) -> Iterator[None]:
    """Time every round trip: cursor statements, connection commands (BEGIN, COMMIT,
    ...), COPY (two: its start and its end) and pipelines (one per sync, named after
    the statements it carried)."""
    cursor_execute = psycopg.AsyncCursor.execute
    cursor_copy = psycopg.AsyncCursor.copy
    exec_command = _connection_base.BaseConnection._exec_command
    pipeline_sync = _pipeline_base.BasePipeline._sync_gen
    pipeline_exit = _pipeline_base.BasePipeline._exit_gen
    queued: list[str] = []

    async def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if self._conn._pipeline is not None:
            try:  # named after the call: an implicit BEGIN it sends goes first
                return await cursor_execute(self, query, *args, **kwargs)
            finally:
                queued.append(trace.name_of(query))
        started = time.perf_counter()
        try:
            return await cursor_execute(self, query, *args, **kwargs)
        finally:
            trace.record(query, started, time.perf_counter())

    def command(self: Any, cmd: Any, *args: Any, **kwargs: Any) -> Any:
        if self._pipeline is not None:
            queued.append(trace.name_of(cmd))
            return (yield from exec_command(self, cmd, *args, **kwargs))
        started = time.perf_counter()
        result = yield from exec_command(self, cmd, *args, **kwargs)
        trace.record(cmd, started, time.perf_counter())
        return result

    def synced(gen: Any) -> Any:
        # Each pipeline sync is one round trip, carrying what was queued since the
        # last. psycopg syncs right after an implicit BEGIN, and on leaving the block.
        def run(self: Any) -> Any:
            name = "pipeline(" + "+".join(queued) + ")"
            queued.clear()
            started = time.perf_counter()
            try:
                return (yield from gen(self))
            finally:
                trace.record_named(name, started, time.perf_counter())

        return run

    @asynccontextmanager
    async def copy(self: Any, statement: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        name = trace.name_of(statement)
        started = time.perf_counter()
        async with cursor_copy(self, statement, *args, **kwargs) as cp:
            trace.record_named(f"{name} (start)", started, time.perf_counter())
            try:
                yield cp
            finally:
                finishing = time.perf_counter()
        trace.record_named(f"{name} (end)", finishing, time.perf_counter())

    psycopg.AsyncCursor.execute = execute  # type: ignore[method-assign]
    psycopg.AsyncCursor.copy = copy  # type: ignore[method-assign]
    _pipeline_base.BasePipeline._sync_gen = synced(pipeline_sync)  # type: ignore[method-assign]
    _pipeline_base.BasePipeline._exit_gen = synced(pipeline_exit)  # type: ignore[method-assign]
    _connection_base.BaseConnection._exec_command = command  # type: ignore[method-assign]
    try:
        yield
    finally:
        psycopg.AsyncCursor.execute = cursor_execute  # type: ignore[method-assign]
        psycopg.AsyncCursor.copy = cursor_copy  # type: ignore[method-assign]
        _pipeline_base.BasePipeline._sync_gen = pipeline_sync  # type: ignore[method-assign]
        _pipeline_base.BasePipeline._exit_gen = pipeline_exit  # type: ignore[method-assign]
        _connection_base.BaseConnection._exec_command = exec_command  # type: ignore[method-assign]


def _busy(intervals: list[tuple[float, float]]) -> float:
    """Seconds during which at least one of ``intervals`` was open."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


async def _enqueue(dsn: str, jobs: int, batch: int, trace: Trace, profile: Any) -> dict[str, float]:
    """Enqueue ``jobs`` chains, ``batch`` per transaction (1: one start_chain each)."""
    async with open_client(dsn, pool_size=2) as client:
        noop = client.registry.get("noop")
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            cpu, wall = time.process_time(), time.perf_counter()
            trace.on = True
            if profile is not None:
                profile.start()
            for first in range(0, jobs, batch):
                if batch == 1:
                    await client.start_chain(conn, noop, Item(n=first))
                else:
                    numbers = range(first, min(jobs, first + batch))
                    await client.start_chains(conn, [ChainStart(noop, Item(n=i)) for i in numbers])
                await conn.commit()
            if profile is not None:
                profile.stop()
            trace.on = False
            return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


async def _drain(
    dsn: str,
    jobs: int,
    mode: str,
    trace: Trace,
    profile: Any,
    atomic_group: int = 1,
    batch: int = 1000,
) -> dict[str, float]:
    if mode == "enqueue":
        return await _enqueue(dsn, jobs, 1, trace, profile)
    if mode == "enqueue-batch":
        return await _enqueue(dsn, jobs, batch, trace, profile)
    chains = mode == "chains"
    type_name = {"staged": "noop", "atomic": "noop_atomic", "chains": "step1"}[mode]
    if not chains:
        await bulk_load(dsn, jobs, type_name=type_name)
    async with open_client(dsn) as client:
        if chains:
            step1 = client.registry.get("step1")
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                for first in range(0, jobs, 1000):
                    numbers = range(first, min(jobs, first + 1000))
                    await client.start_chains(conn, [ChainStart(step1, Item(n=i)) for i in numbers])
                    await conn.commit()
        counter = Counter(jobs)
        processors = (
            counter.chain_handlers(client.registry) if chains else {type_name: counter.handler()}
        )
        worker = create_in_process_worker(
            client=client, processors=processors, max_slots=10, atomic_group=atomic_group
        )
        cpu, wall = time.process_time(), time.perf_counter()
        trace.on = True
        if profile is not None:
            profile.start()
        stop = await worker.start()
        try:
            await counter.done.wait()
            await wait_drained(dsn)
        finally:
            if profile is not None:
                profile.stop()
            trace.on = False
            await stop()
        return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


def _report(trace: Trace, jobs: int, mode: str, timing: dict[str, float], batch: int) -> str:
    wall, cpu = timing["wall"], timing["cpu"]
    per = "chain" if mode == "chains" else "job"
    what = {
        "chains": "3-step chains, 1 worker x 10 slots",
        "enqueue": "jobs enqueued, one start_chain per transaction",
        "enqueue-batch": f"jobs enqueued, start_chains in batches of {batch:,}",
    }.get(mode, f"no-op jobs drained, {mode}, 1 worker x 10 slots")
    lines = [
        f"## {jobs:,} {what}",
        "",
        f"- wall {wall:.2f} s ({jobs / wall:,.0f} {per}s/s); worker process CPU {cpu:.2f} s "
        f"({cpu / wall:.0%} of one core, this process)",
    ]
    total = sum(len(v) for v in trace.calls.values())
    lines.append(f"- round trips: {total:,} = {total / jobs:.2f} per {per}")
    for group, intervals in sorted(trace.intervals.items()):
        busy = _busy(intervals)
        lines.append(
            f"- {group}: {len(intervals) / jobs:.2f} round trips per {per}; waiting on "
            f"PostgreSQL {busy:.2f} s = {busy / wall:.0%} of wall"
        )
    lines += [
        "",
        f"| task | statement | per {per} | mean ms | p95 ms | total s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for (group, name), durations in sorted(trace.calls.items(), key=lambda kv: -sum(kv[1])):
        ordered = sorted(durations)
        p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
        lines.append(
            f"| {group} | {name} | {len(durations) / jobs:.2f} | "
            f"{1000 * sum(durations) / len(durations):.2f} | {1000 * p95:.2f} | "
            f"{sum(durations):.2f} |"
        )
    return "\n".join(lines) + "\n"


async def _run(args: argparse.Namespace) -> tuple[str, Any]:
    names = {query: name for name, query in render(SCHEMA).named().items()}
    trace = Trace(names=names)
    profile = None
    if args.pyinstrument:
        from pyinstrument import Profiler

        profile = Profiler(async_mode="disabled", interval=0.0005)
    with server(args.dsn) as (admin_dsn, _kind):
        dbs = PgworkDatabases(admin_dsn)
        try:
            with dbs.fresh() as dsn, traced(trace):
                timing = await _drain(
                    dsn, args.jobs, args.mode, trace, profile, args.atomic_group, args.batch
                )
        finally:
            dbs.close()
    return _report(trace, args.jobs, args.mode, timing, args.batch), profile


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.roundtrips", description=__doc__)
    parser.add_argument("--dsn", help="admin DSN (default: an embedded PostgreSQL)")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument(
        "--mode",
        choices=("staged", "atomic", "chains", "enqueue", "enqueue-batch"),
        default="staged",
    )
    parser.add_argument("--atomic-group", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1000, help="jobs per enqueue-batch")
    parser.add_argument("--pyinstrument", metavar="FILE")
    args = parser.parse_args(argv)
    report, profile = asyncio.run(_run(args))
    print(report)
    if profile is not None:
        Path(args.pyinstrument).write_text(profile.output_text(unicode=True, show_all=False))
        print(f"pyinstrument report written to {args.pyinstrument}")


if __name__ == "__main__":
    main()
