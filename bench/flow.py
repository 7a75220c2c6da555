"""Flow control under load: a per-key limit that binds, across worker processes.

    python -m bench.flow --dsn DSN [--jobs 20000] [--repeat 3] [--processes 4]
        [--slots 50] [--keys 100] [--hot-keys 10] [--hot-share 0.8] [--hold-ms 10]

The design. A type with ``key_concurrency=2`` (``keyed``, bench/_pgwork_app.py) has a
deep queue spread over 100 limit keys; 4 worker processes of 50 slots each drain it,
every handler holding its attempt a few milliseconds. Spread evenly, 100 keys of 2
places each make 200 places for 200 slots, and the limit would never be what holds a
job back. So the keys are uneven: 10 hot keys hold 80 % of the jobs, the other 90
share the rest. The cold keys are done early; from then on the hot keys have jobs
waiting at their limit (20 places for 200 slots), and every start of theirs waits for
a place that an attempt of the same key frees: the limit binds, and how soon a freed
place is taken again sets the rate (at most 20 places / ``--hold-ms``).

Each row is one run on a fresh database (the jobs enqueued by ``start_chains`` with
their keys in a seeded random order, the table vacuumed, then the processes started):

- **jobs/s**: jobs over the time from the first handler's start to the queue found
  drained;
- **worker CPU per job**: the worker processes' CPU, summed, each from its first
  handler's start to the drained queue; **server CPU per job**: the server's backends
  serving the database over the same interval (bench/_cost.py, so only for a server
  on this machine);
- **commits per job**: transactions the database committed over the run, from the
  workers' start to their stop (``pg_stat_database``, read once their backends have
  exited and so reported them): acquires, empty ones included, and completions;
- **most at once per key**: from the handlers' own spans (bench/_spans.py), read
  outside pgwork: never above the limit, or the run fails;
- **place freed → next start**: for each place an attempt freed while its key had jobs
  waiting, the time from its handler's return to the next start of a job of that key
  (on whichever process): median, 95th percentile, maximum. It covers the completion
  reaching the database and an acquire finding the room (the limited acquire counts
  what runs in its statement's snapshot, so a completion carried by an acquire frees
  its place for the next acquire, not that one).

With ``--rate``, a type with ``rate=Rate(1000, per=1 s)`` (``paced``) and no keys
drains instead, and each row gives:

- **pace**: the rate kept once under way, 1,000 over the median time between a
  handler's start and the start 1,000 later. A start's place in the window comes
  back when the window has passed it and an acquire fills it again, so that time is
  the window plus the delay to that acquire, which is what a rate loses;
- **starts/s over the drain**: the starts after the first 1,000 over the time from
  the first to the last, which also counts, once, the time the last window's starts
  take to spread (the acquires that fill a window take a while);
- **most leases in one second** (by the lease transactions' start) and **most handler
  starts in one second**: clocks that run a little early or late of the one the
  acquire counts by (docs/performance.md says how).

The run fails (exit 1) if a key ran more than its limit at once, or a job did not
complete once. On a shared machine, compare rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from bench._context import WAIT_LIMIT
from bench._env import PgworkDatabases, server
from bench._loop import LOOPS, current, resolve, run
from bench._pgwork_app import (
    KEY_CONCURRENCY,
    PACED_RATE,
    SCHEMA,
    Item,
    open_client,
    settle,
    wait_drained,
)
from bench._spans import SPANS_TABLE, Oracle, densest_window, oracle, read_spans
from bench._worker_process import WorkerProcess
from pgwork import ChainStart

__all__ = ["Scenario", "main", "scenario_keys"]

ENQUEUE_BATCH = 1000


@dataclass(frozen=True)
class Scenario:
    """What a run drains, and with what."""

    jobs: int
    processes: int
    slots: int
    keys: int
    hot_keys: int
    hot_share: float
    hold_ms: float
    seed: int = 0
    # The type drained; a test drains ``noop`` (no limit) with the same keys, to watch
    # the oracle see a key run past two.
    type_name: str = "keyed"

    @property
    def paced(self) -> bool:
        """The rate scenario: ``paced``'s jobs, without keys."""
        return self.type_name == "paced"

    def describe(self) -> str:
        if self.paced:
            return (
                f"{self.jobs:,} jobs of a type with rate=Rate({PACED_RATE}, per=1 s), "
                f"{self.processes} worker processes x {self.slots} slots, handlers holding "
                f"{self.hold_ms:g} ms"
            )
        return (
            f"{self.jobs:,} jobs of a type with key_concurrency={KEY_CONCURRENCY} over "
            f"{self.keys} keys ({self.hot_keys} hot keys holding {self.hot_share:.0%} of "
            f"the jobs), {self.processes} worker processes x {self.slots} slots, handlers "
            f"holding {self.hold_ms:g} ms"
        )


def scenario_keys(s: Scenario) -> list[str | None]:
    """Each job's limit key, in enqueue order: a hot key with probability
    ``hot_share`` (the hot keys alike), else one of the others (alike), seeded; none
    in the rate scenario."""
    if s.paced:
        return [None] * s.jobs
    hot = [f"hot-{k:03d}" for k in range(s.hot_keys)]
    cold = [f"cold-{k:03d}" for k in range(s.keys - s.hot_keys)]
    weights = [s.hot_share / len(hot)] * len(hot) + [(1 - s.hot_share) / len(cold)] * len(cold)
    return random.Random(s.seed).choices(hot + cold, weights=weights, k=s.jobs)


@dataclass(frozen=True)
class Run:
    jobs_per_s: float
    worker_us: float | None
    server_us: float | None
    found: Oracle
    completed: int
    commits: float
    # The rate scenario's: starts per second from the first handler's start to the
    # last's, the pace the rate keeps once under way, and the most starts in any
    # one-second window (all from the spans).
    paced_per_s: float = float("nan")
    steady_per_s: float = float("nan")
    densest: int = 0
    densest_leased: int = 0


async def _enqueue(dsn: str, type_name: str, keys: Sequence[str | None]) -> None:
    async with (
        open_client(dsn, pool_size=2) as client,
        await psycopg.AsyncConnection.connect(dsn) as conn,
    ):
        job_type = client.registry.get(type_name)
        for first in range(0, len(keys), ENQUEUE_BATCH):
            await client.start_chains(
                conn,
                [
                    ChainStart(job_type, Item(n=n), limit_key=keys[n])
                    for n in range(first, min(len(keys), first + ENQUEUE_BATCH))
                ],
            )
            await conn.commit()
        await conn.execute(SPANS_TABLE)
        await conn.commit()


async def _leased_at(dsn: str) -> list[float]:
    """When each job was first leased, on the database's clock (its lease
    transaction's start), in order."""
    query = sql.SQL("SELECT extract(epoch FROM started_at) FROM {} ORDER BY 1").format(
        sql.Identifier(SCHEMA, "jobs")
    )
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        rows = await (await conn.execute(query)).fetchall()
    return [float(at) for (at,) in rows if at is not None]


async def _completed(dsn: str) -> int:
    query = sql.SQL("SELECT count(*) FROM {} WHERE status = 'completed'").format(
        sql.Identifier(SCHEMA, "jobs")
    )
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        row = await (await conn.execute(query)).fetchone()
    return int(row[0]) if row else 0


_COMMITS = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
_OTHERS = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND pid <> pg_backend_pid()"
)


async def _commits(conn: psycopg.AsyncConnection[Any], *, alone: bool = False) -> int:
    """The database's committed transactions so far; ``alone``: first wait (up to 10 s)
    for every other backend of it to exit, which reports what it committed."""
    for _ in range(200 if alone else 0):
        row = await (await conn.execute(_OTHERS)).fetchone()
        if row is None or row[0] == 0:
            break
        await asyncio.sleep(0.05)
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    row = await (await conn.execute(_COMMITS)).fetchone()
    return int(row[0]) if row else 0


async def drain(dsn: str, admin_dsn: str, s: Scenario) -> Run:
    """One run of the scenario on the fresh pgwork database ``dsn``."""
    await _enqueue(dsn, s.type_name, scenario_keys(s))
    await settle(dsn)
    children = [
        await WorkerProcess.start(
            dsn, type_name=s.type_name, slots=s.slots, hold_ms=s.hold_ms, spans=True
        )
        for _ in range(s.processes)
    ]
    stats = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    try:
        before = await _commits(stats)
        for child in children:
            await child.start_metering(dsn, admin_dsn)
        for child in children:
            await child.go()
        deadline = time.monotonic() + WAIT_LIMIT
        while sum(c.count for c in children) < s.jobs:
            if time.monotonic() > deadline:
                raise TimeoutError("the worker processes did not drain the queue")
            await asyncio.sleep(0.005)
        finished = await wait_drained(dsn)
        costs = [await child.cost(s.jobs) for child in children]
    finally:
        for child in children:
            await child.stop()  # each writes its handlers' spans
    try:
        commits = await _commits(stats, alone=True) - before
    finally:
        await stats.close()
    spans = read_spans(dsn)
    starts = sorted(started for _, started, _ in spans)
    firsts = [c.first for c in children if c.first is not None]
    measured = [c for c in costs if c is not None]
    servers = [c.server_us for c in measured if c.server_us is not None]
    return Run(
        jobs_per_s=s.jobs / (finished - min(firsts)) if firsts else float("nan"),
        worker_us=sum(c.library_us for c in measured) if measured else None,
        # Every meter reads all of the database's backends, each from its own process's
        # first handler: the one that began first saw the most.
        server_us=max(servers) if servers else None,
        found=oracle(spans),
        completed=await _completed(dsn),
        commits=commits / s.jobs,
        paced_per_s=_whole(starts),
        steady_per_s=_steady(starts),
        densest=densest_window(starts, 1.0),
        densest_leased=densest_window(await _leased_at(dsn), 1.0),
    )


def _whole(starts: Sequence[float]) -> float:
    """Starts per second over the whole drain: the starts beyond the first
    ``PACED_RATE`` (a rate lets a full window's worth start at once) over the time
    from the first to the last. Short of the pace by the time the last window's
    starts take to spread, once per drain."""
    if len(starts) <= PACED_RATE or starts[-1] <= starts[0]:
        return float("nan")
    return (len(starts) - PACED_RATE) / (starts[-1] - starts[0])


def _steady(starts: Sequence[float]) -> float:
    """The pace the rate keeps: ``PACED_RATE`` over the median time between a start
    and the one ``PACED_RATE`` starts later (a window's worth). Each start's place in
    the window comes back once the window has passed it and an acquire has filled
    it again, so that time is the window plus the delay from its opening to that
    acquire: what the rate loses, measured at every start rather than once per
    drain."""
    if len(starts) <= PACED_RATE:
        return float("nan")
    gaps = [later - first for first, later in zip(starts, starts[PACED_RATE:], strict=False)]
    return PACED_RATE / statistics.median(gaps)


def _us(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


HEADER = (
    "| run | jobs/s | worker CPU µs/job | server CPU µs/job | commits/job | most at once per key "
    f"(limit {KEY_CONCURRENCY}) | place freed → next start, ms: median / p95 / max "
    "| places timed |\n|---|---:|---:|---:|---:|---:|---|---:|"
)


PACED_HEADER = (
    f"| run | pace, starts/s (rate {PACED_RATE}/s) | of the rate | starts/s over the drain "
    "| most leases in one second (database clock) | most handler starts in one second "
    "| worker CPU µs/job | server CPU µs/job | commits/job |"
    "\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def paced_row(label: str, r: Run) -> str:
    return (
        f"| {label} | {r.steady_per_s:,.1f} | {r.steady_per_s / PACED_RATE:.1%} | "
        f"{r.paced_per_s:,.1f} | {r.densest_leased:,} | {r.densest:,} | "
        f"{_us(r.worker_us)} | {_us(r.server_us)} | {r.commits:.2f} |"
    )


def row(label: str, r: Run) -> str:
    median, p95, most = r.found.wait_ms()
    return (
        f"| {label} | {r.jobs_per_s:,.0f} | {_us(r.worker_us)} | {_us(r.server_us)} | "
        f"{r.commits:.2f} | {r.found.most} | {median:.1f} / {p95:.1f} / {most:.1f} | "
        f"{len(r.found.waits):,} |"
    )


def median_row(runs: Sequence[Run]) -> str:
    def med(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None

    waits = [r.found.wait_ms() for r in runs]
    return (
        f"| median of {len(runs)} | {statistics.median(r.jobs_per_s for r in runs):,.0f} | "
        f"{_us(med([r.worker_us for r in runs]))} | {_us(med([r.server_us for r in runs]))} | "
        f"{statistics.median(r.commits for r in runs):.2f} | "
        f"{max(r.found.most for r in runs)} (most) | "
        + " / ".join(f"{statistics.median(w[i] for w in waits):.1f}" for i in range(3))
        + f" | {statistics.median(len(r.found.waits) for r in runs):,.0f} |"
    )


def failures(s: Scenario, r: Run) -> list[str]:
    """What a run broke: a key past its limit, a job not completed or run twice."""
    out = []
    if r.found.most > KEY_CONCURRENCY:
        out.append(
            f"key {r.found.busiest!r} ran {r.found.most} handlers at once, past its limit "
            f"of {KEY_CONCURRENCY}"
        )
    if r.completed != s.jobs or r.found.spans != s.jobs:
        out.append(f"{s.jobs} jobs: {r.completed} completed, {r.found.spans} handler spans")
    return out


async def _run(args: argparse.Namespace) -> int:
    s = Scenario(
        jobs=args.jobs,
        processes=args.processes,
        slots=args.slots,
        keys=args.keys,
        hot_keys=args.hot_keys,
        hot_share=args.hot_share,
        hold_ms=args.hold_ms,
        type_name="paced" if args.rate else "keyed",
    )
    print(f"event loop: {current()}")
    print(f"{'rate' if s.paced else 'keys'}: {s.describe()}\n")
    print(PACED_HEADER if s.paced else HEADER, flush=True)
    runs: list[Run] = []
    broken: list[str] = []
    with server(args.dsn) as (admin, _kind):
        dbs = PgworkDatabases(admin)
        try:
            for n in range(args.repeat):
                with dbs.fresh() as dsn:
                    r = await drain(dsn, dbs.admin_dsn, s)
                runs.append(r)
                if s.paced:
                    print(paced_row(f"rate, run {n + 1}", r), flush=True)
                    continue
                print(row(f"keys, run {n + 1}", r), flush=True)
                broken += failures(s, r)
        finally:
            dbs.close()
    if s.paced and len(runs) > 1:
        pace = statistics.median(r.steady_per_s for r in runs)
        print(f"\nmedian pace: {pace:,.1f} starts/s ({pace / PACED_RATE:.1%} of the rate)")
    elif len(runs) > 1:
        print(median_row(runs))
    for failure in broken:
        print(f"\nFAILED: {failure}")
    return 1 if broken else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.flow", description=__doc__)
    parser.add_argument("--dsn", help="admin DSN (default: an embedded PostgreSQL)")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs to drain per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs, each on a fresh database")
    parser.add_argument("--processes", type=int, default=4, help="worker processes")
    parser.add_argument("--slots", type=int, default=50, help="max_slots of each worker")
    parser.add_argument("--keys", type=int, default=100, help="limit keys")
    parser.add_argument("--hot-keys", type=int, default=10, help="keys holding --hot-share")
    parser.add_argument(
        "--hot-share", type=float, default=0.8, help="share of the jobs on the hot keys"
    )
    parser.add_argument("--hold-ms", type=float, default=10.0, help="each handler's hold")
    parser.add_argument(
        "--rate",
        action="store_true",
        help=f"drain a type with rate=Rate({PACED_RATE}, per=1 s) instead (keys unused)",
    )
    parser.add_argument(
        "--loop", choices=LOOPS, default="auto", help="the event loop (auto: uvloop if installed)"
    )
    args = parser.parse_args(argv)
    if not 0 < args.hot_keys < args.keys or not 0 < args.hot_share < 1:
        parser.error("give 0 < --hot-keys < --keys and 0 < --hot-share < 1")
    return run(_run(args), resolve(args.loop))


if __name__ == "__main__":
    raise SystemExit(main())
