"""Retention beside a drain: do ended chains leave the table as fast as they end?

    python -m bench.retention --dsn DSN [--seconds 60] [--rate 5000] [--slots 50]
        [--modes without,with] [--vacuum-every S] [--sample-every 5]

Each run, on a fresh database, drains a steady stream of one-job chains for
``--seconds``: the harness enqueues ``--rate`` chains a second (``start_chains``, a
batch every 100 ms, each committed) and one worker process (``--slots`` slots, pgwork's
other defaults) drains them; the worker's maintenance runs retention as any worker's
does. ``--rate 0`` enqueues as fast as the worker drains instead (a backlog of
``BACKLOG`` topped up), which gives the drain's own rate.

Two modes. ``without``: the chains are of ``noop``, which keeps its ended chains a
day (the default retention, longer than any run: nothing is deleted). ``with``: of
``noop_retained``, which keeps them ``RETAINED`` (bench/_pgwork_app.py), so from then
on each chain that ends is due for deletion that long after. A third, ``clear``, has
no drain: ``--backlog`` chains that ended an hour ago, loaded into the table, and a
worker process with nothing to run, whose maintenance deletes them; its row gives the
rate one worker's retention deletes at (the fleet's: one sweep runs at a time), from
its first deletion to the empty table.

Each mode's row:

- **ended chains/s**: chains enqueued and ended (no longer pending or running) when
  the enqueuing stopped, over ``--seconds``;
- **retention deletes/s**: chains deleted per second over the run's second half (each
  sample's count of rows against the chains enqueued), when retention has long begun;
- **rows** and **size**: the jobs table's row count and ``pg_total_relation_size`` at
  the start, the most seen, and at the end of the enqueuing; **of them ended**: the
  rows of chains that ended (not pending or running), which retention bounds (about
  the ended rate x (retention + a round)) where a drain that falls behind adds
  pending rows it does not;
- **behind**: chains enqueued and not yet ended when the enqueuing stopped.

The samples (every ``--sample-every`` seconds) follow each row. A server with
``autovacuum`` off (as on a machine set up for repeatable drains) never frees what
was deleted: the harness then vacuums the table itself every ``--vacuum-every``
seconds (default 10; 0: never), as autovacuum would, and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from bench._env import PgworkDatabases, server
from bench._loop import LOOPS, current, resolve, run
from bench._pgwork_app import RETAINED, SCHEMA, Item, open_client, outstanding
from bench._worker_process import WorkerProcess
from pgwork import ChainStart
from pgwork.testing import uuid7_sql

__all__ = ["Run", "Sample", "main", "sustain"]

# Enqueue ticks a second; each enqueues the chains due since the last.
TICKS_PER_S = 10
# Chains per start_chains call (and commit) at most.
ENQUEUE_BATCH = 1000
# ``--rate 0``: the backlog kept topped up.
BACKLOG = 20_000
MODES = {"without": "noop", "with": "noop_retained", "clear": "noop_retained"}
# ``clear``: chains loaded per statement, and how long the worker may take.
LOAD_CHUNK = 100_000
CLEAR_LIMIT_S = 900.0

# ``clear``'s backlog: one-job chains of ``noop_retained`` that completed an hour ago,
# ids time-ordered like pgwork's UUIDv7, as a drain would have left them.
_LOAD_ENDED = f"""
WITH s AS (
    SELECT g, {uuid7_sql("clock_timestamp() - interval '1 hour'")} AS u
    FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
)
INSERT INTO {{jobs}} (
    id, type_name, chain_id, chain_type_name, chain_index, input, output, status, queue,
    priority, max_attempts, created_at, scheduled_at, started_at, completed_at, attempt,
    chain_status, chain_completed_at
)
SELECT u, 'noop_retained', u, 'noop_retained', 0, jsonb_build_object('n', g), 'null',
       'completed', 'default', 0, 5, now() - interval '1 hour', now() - interval '1 hour',
       now() - interval '1 hour', now() - interval '1 hour', 1, 'completed',
       now() - interval '1 hour'
FROM s
"""

_JOBS = sql.Identifier(SCHEMA, "jobs")
_ROWS = sql.SQL("SELECT count(*), pg_total_relation_size({t}::regclass) FROM {j}").format(
    t=sql.Literal(f"{SCHEMA}.jobs"), j=_JOBS
)
_VACUUM = sql.SQL("VACUUM {}").format(_JOBS)


@dataclass(frozen=True)
class Sample:
    at: float  # seconds since the enqueuing began
    enqueued: int
    rows: int
    size: int  # bytes
    open: int  # pending or running

    @property
    def ended(self) -> int:
        """Ended chains still in the table (every chain is one row)."""
        return self.rows - self.open

    @property
    def deleted(self) -> int:
        """Chains deleted so far: every chain is one row."""
        return self.enqueued - self.rows


@dataclass
class Run:
    mode: str
    seconds: float
    rate: int
    ended: int = 0
    behind: int = 0
    vacuums: int = 0
    samples: list[Sample] = field(default_factory=list)

    @property
    def ended_per_s(self) -> float:
        return self.ended / self.seconds

    @property
    def deletes_per_s(self) -> float:
        """Over the second half of the samples."""
        half = [s for s in self.samples if s.at >= self.seconds / 2]
        if len(half) < 2 or half[-1].at <= half[0].at:
            return 0.0
        return (half[-1].deleted - half[0].deleted) / (half[-1].at - half[0].at)


async def _sample(conn: psycopg.AsyncConnection[Any], at: float, enqueued: int) -> Sample:
    row = await (await conn.execute(_ROWS)).fetchone()
    assert row is not None
    return Sample(at, enqueued, int(row[0]), int(row[1]), await outstanding(conn))


async def _autovacuum(admin_dsn: str) -> bool:
    async with await psycopg.AsyncConnection.connect(admin_dsn, autocommit=True) as conn:
        row = await (await conn.execute("SHOW autovacuum")).fetchone()
    return bool(row and row[0] == "on")


async def sustain(
    dsn: str,
    mode: str,
    *,
    seconds: float,
    rate: int,
    slots: int,
    vacuum_every: float,
    sample_every: float,
) -> Run:
    """One run (see the module): enqueue ``rate`` chains a second of ``mode``'s type for
    ``seconds`` while a worker process drains them; sample the table as it goes."""
    type_name = MODES[mode]
    result = Run(mode, seconds, rate)
    worker = await WorkerProcess.start(dsn, type_name=type_name, slots=slots)
    async with (
        open_client(dsn, pool_size=2) as client,
        await psycopg.AsyncConnection.connect(dsn) as conn,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as probe,
    ):
        job_type = client.registry.get(type_name)
        enqueued = 0
        result.samples.append(await _sample(probe, 0.0, 0))
        await worker.go()
        began = time.monotonic()

        async def enqueue(count: int) -> None:
            nonlocal enqueued
            while count > 0:
                size = min(count, ENQUEUE_BATCH)
                batch = [ChainStart(job_type, Item(n=enqueued + i)) for i in range(size)]
                await client.start_chains(conn, batch)
                await conn.commit()
                enqueued += size
                count -= size

        done = asyncio.Event()

        async def vacuums() -> None:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
                while not done.is_set():
                    try:
                        await asyncio.wait_for(done.wait(), vacuum_every)
                    except TimeoutError:
                        await c.execute(_VACUUM)
                        result.vacuums += 1

        vacuuming = asyncio.create_task(vacuums()) if vacuum_every > 0 else None
        next_sample = sample_every
        try:
            while (elapsed := time.monotonic() - began) < seconds:
                if rate > 0:
                    await enqueue(int(rate * elapsed) - enqueued)
                elif enqueued - worker.count < BACKLOG:
                    await enqueue(BACKLOG)
                if elapsed >= next_sample:
                    result.samples.append(await _sample(probe, elapsed, enqueued))
                    next_sample += sample_every
                await asyncio.sleep(1 / TICKS_PER_S)
            final = await _sample(probe, time.monotonic() - began, enqueued)
            result.samples.append(final)
            result.ended, result.behind = final.enqueued - final.open, final.open
        finally:
            done.set()
            if vacuuming is not None:
                await vacuuming  # a VACUUM under way ends first
            await worker.stop()
    return result


async def clear(dsn: str, *, backlog: int, slots: int, sample_every: float) -> Run:
    """``clear`` (see the module): ``backlog`` expired chains, an idle worker process
    whose maintenance deletes them; sampled until none is left."""
    query = sql.SQL(_LOAD_ENDED).format(jobs=_JOBS)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for first in range(0, backlog, LOAD_CHUNK):
            last = min(backlog, first + LOAD_CHUNK) - 1
            await conn.execute(query, {"first": first, "last": last})
        await conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(_JOBS))
    result = Run("clear", 0.0, 0)
    worker = await WorkerProcess.start(dsn, type_name="noop_retained", slots=slots)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as probe:
        try:
            result.samples.append(await _sample(probe, 0.0, backlog))
            await worker.go()
            began = time.monotonic()
            while result.samples[-1].rows > 0:
                if time.monotonic() - began > CLEAR_LIMIT_S:
                    raise TimeoutError(
                        f"{result.samples[-1].rows:,} chains left after {CLEAR_LIMIT_S:.0f} s"
                    )
                await asyncio.sleep(sample_every)
                result.samples.append(await _sample(probe, time.monotonic() - began, backlog))
        finally:
            await worker.stop()
    # From the first sample that saw a deletion (the worker's first round) to the last.
    started = next((s for s in result.samples if s.deleted > 0), result.samples[-1])
    before = result.samples[result.samples.index(started) - 1]
    result.seconds = result.samples[-1].at - before.at
    return result


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"


HEADER = (
    "| mode | offered | ended chains/s | retention deletes/s | rows: start / most / end "
    "| of them ended: most / end | size: start / most / end | behind at the end |"
    "\n|---|---:|---:|---:|---|---|---|---:|"
)


def row(r: Run) -> str:
    first, last = r.samples[0], r.samples[-1]
    if r.mode == "clear":
        rate = first.rows / r.seconds if r.seconds else float("nan")
        return (
            f"| clear a backlog, no drain | {first.rows:,} ended chains | | {rate:,.0f} | "
            f"{first.rows:,} / {first.rows:,} / {last.rows:,} | "
            f"{first.ended:,} / {last.ended:,} | {_mib(first.size)} / "
            f"{_mib(first.size)} / {_mib(last.size)} | |"
        )
    most = max(r.samples, key=lambda s: s.rows)
    largest = max(s.size for s in r.samples)
    offered = f"{r.rate:,}/s" if r.rate else "flat out"
    return (
        f"| {r.mode} retention | {offered} | {r.ended_per_s:,.0f} | {r.deletes_per_s:,.0f} | "
        f"{first.rows:,} / {most.rows:,} / {last.rows:,} | "
        f"{max(s.ended for s in r.samples):,} / {last.ended:,} | "
        f"{_mib(first.size)} / {_mib(largest)} / {_mib(last.size)} | {r.behind:,} |"
    )


def samples(r: Run) -> str:
    cells = ", ".join(
        f"{s.at:.0f} s: {s.rows:,} rows ({s.ended:,} ended) {_mib(s.size)}" for s in r.samples
    )
    return f"{r.mode}: {cells}"


async def _run(args: argparse.Namespace) -> int:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    runs: list[Run] = []
    with server(args.dsn) as (admin, _kind):
        vacuum_every = args.vacuum_every
        if vacuum_every is None:
            vacuum_every = 0.0 if await _autovacuum(admin) else 10.0
        print(f"event loop: {current()}")
        drains = [m for m in modes if m != "clear"]
        if drains:
            offered = f"{args.rate:,}/s offered" if args.rate else "flat out"
            print(
                f"drains: {args.seconds:g} s of one-job chains, {offered}, 1 worker process "
                f"x {args.slots} slots; 'with': completed chains kept "
                f"{RETAINED.total_seconds():g} s; "
                + (
                    f"VACUUM every {vacuum_every:g} s by the harness"
                    if vacuum_every
                    else "vacuum left to autovacuum"
                ),
                flush=True,
            )
        if "clear" in modes:
            print(
                f"clear: {args.backlog:,} chains ended an hour ago, deleted by the retention "
                f"of 1 idle worker process",
                flush=True,
            )
        print(flush=True)
        print(HEADER, flush=True)
        dbs = PgworkDatabases(admin)
        try:
            for mode in modes:
                with dbs.fresh() as dsn:
                    if mode == "clear":
                        r = await clear(
                            dsn, backlog=args.backlog, slots=args.slots, sample_every=1.0
                        )
                        runs.append(r)
                        print(row(r), flush=True)
                        continue
                    r = await sustain(
                        dsn,
                        mode,
                        seconds=args.seconds,
                        rate=args.rate,
                        slots=args.slots,
                        vacuum_every=vacuum_every,
                        sample_every=args.sample_every,
                    )
                runs.append(r)
                print(row(r), flush=True)
        finally:
            dbs.close()
    print()
    for r in runs:
        print(samples(r))
    by_mode = {r.mode: r for r in runs}
    if "with" in by_mode and "without" in by_mode and by_mode["without"].ended:
        ratio = by_mode["with"].ended_per_s / by_mode["without"].ended_per_s
        print(f"\nended chains/s with retention / without: {ratio:.2f}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.retention",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--dsn", help="admin DSN (default: an embedded PostgreSQL)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long each run enqueues")
    parser.add_argument(
        "--rate", type=int, default=5000, help="chains enqueued a second (0: flat out)"
    )
    parser.add_argument("--slots", type=int, default=50, help="the worker's max_slots")
    parser.add_argument(
        "--modes",
        default="without,with",
        help="runs, in order: without, with (retention), clear (a backlog, no drain)",
    )
    parser.add_argument(
        "--vacuum-every",
        type=float,
        default=None,
        help="VACUUM the jobs table this often (default: 10 s if autovacuum is off, else 0)",
    )
    parser.add_argument("--sample-every", type=float, default=5.0, help="seconds between samples")
    parser.add_argument(
        "--backlog", type=int, default=200_000, help="the clear mode's expired chains"
    )
    parser.add_argument(
        "--loop", choices=LOOPS, default="auto", help="the event loop (auto: uvloop if installed)"
    )
    args = parser.parse_args(argv)
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}: give without, with, clear")
    return run(_run(args), resolve(args.loop))


if __name__ == "__main__":
    raise SystemExit(main())
