"""Client CPU per job: a drain and an enqueue measured in process time, not wall time.

    python -m bench.cpu --dsn DSN [--jobs 20000] [--slots 10]
        [--only drain,limited,sync,atomic,atomic32,atomic32w,enqueue]
        [--tune-gc] [--profile FILE]

On a shared machine wall-clock rates move by a third between runs; the CPU this process
spends per job moves much less, and it is what a change to pgwork's Python side can
shrink. The drain row is one in-process worker (10 slots unless ``--slots``, staged, no-
op handler) on a pre-loaded queue, measured from its 1,000th handler start to its last
(start-up and the first turns are not counted); ``limited`` is the same drain of a type
whose ``concurrency`` never binds, so every acquire counts it under the type's lock;
with both, a line gives the limited drain's jobs/s and CPU per job (the server's and
the worker's) as multiples of the plain drain's. ``sync`` is the plain drain with a
plain ``def`` handler, run on the worker's threads (``sync_threads``: one for each
slot), its CPU every thread's; with ``drain``, a line gives it as multiples of the
async drain's the same way: what handing each job to a thread and back costs.
``--tune-gc`` sets the garbage collector up as ``pgwork worker`` and the benchmark's
worker processes do (``pgwork.worker.tune_gc``, once everything is imported); without
it the collector keeps CPython's defaults, and at 50 slots or more its collections are
a fifth to a third of the drain's CPU. The atomic rows drain the same way with
the job type ``mode="atomic"``, a transaction per attempt (``atomic``) and in groups of
32 (``atomic32``), and in groups of 32 with each handler inserting a row through its
connection first (``atomic32w``: a member that writes, in its group's transaction).
Next to the worker's CPU every drain row gives the CPU of the
server's backends serving its database (from ``/proc``, so only for a server on this
machine) and its commits per job (``pg_stat_database``), over the same window. The
enqueue rows are ``start_chain`` + ``commit`` per job, and ``start_chains`` of 100 +
``commit``, each next to the same work done with bare SQL on the same psycopg
connection: a single-row ``INSERT`` + ``COMMIT`` and a multi-row ``INSERT`` of 100 rows
+ ``COMMIT`` into a table of a ``bigserial`` id and a ``jsonb`` payload (the raw floor's
table, ``bench/peers/run_raw.py``), the two taking turns every 500 jobs (the batch
rows over ten times as many jobs as the single ones), and the batch also next to a
multi-row ``INSERT`` of the same 100 rows ``start_chains`` writes, into pgwork's own
table (``bench/peers/_peer_common.py``'s ``PGWORK_ROW``: what the row itself costs,
without pgwork's code); each also
gives its wall-clock time per job (on a shared machine, compare it within one run
only) and the CPU of the connection's server backend per job. ``--profile`` runs cProfile over the
measured part and writes its statistics (``pstats``) to FILE.drain, FILE.sync (the
event loop's thread only, not the handlers'), FILE.atomic, FILE.atomic32,
FILE.atomic32w, FILE.enqueue (``start_chain``) and FILE.enqueue100 (``start_chains``
of 100).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import psycopg
from psycopg.conninfo import conninfo_to_dict

from bench._cost import backends_cpu, process_cpu
from bench._env import PgworkDatabases, server
from bench._loop import LOOPS, current, resolve, run
from bench._pgwork_app import Counter, Item, bulk_load, open_client
from bench.peers._peer_common import pgwork_rows_insert, pgwork_rows_params
from pgwork import ChainStart, create_in_process_worker
from pgwork.worker import tune_gc

__all__ = ["main"]

SKIP = 1000


def _spent(before: dict[int, float], after: dict[int, float]) -> float:
    """Server CPU between two ``backends_cpu`` readings (a backend that ended in
    between is not counted; one that began is counted from zero)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


class _CpuCounter(Counter):
    """A Counter that notes the process time (and its database's backends' CPU) at its
    ``SKIP``-th and last handler.

    With ``loop`` set it is hit by sync handlers on the worker's threads: it counts
    under a lock and leaves the events and the profile (which watches the thread that
    enables it) to the loop's thread. The process time is every thread's."""

    cpu_first: float = 0.0
    cpu_last: float = 0.0
    database: str = ""
    server_first: dict[int, float] | None = None
    server_last: dict[int, float] | None = None
    profile: cProfile.Profile | None = None
    warm: asyncio.Event | None = None  # set at the SKIP-th handler
    loop: asyncio.AbstractEventLoop | None = None  # hit on other threads than its own
    lock: threading.Lock | None = None

    def hit(self, n: int | None = None) -> None:
        if self.lock is None:
            self._hit(n)
            return
        with self.lock:
            self._hit(n)

    def _hit(self, n: int | None) -> None:
        super().hit(n)
        if self.count == SKIP:
            if self.warm is not None:
                self.signal(self.warm)
            if self.profile is not None:
                self._on_loop(self.profile.enable)
            self.cpu_first = time.process_time()
            self.server_first = backends_cpu(self.database)
        elif self.count == self.target:
            self.cpu_last = time.process_time()
            if self.profile is not None:
                self._on_loop(self.profile.disable)
            self.server_last = backends_cpu(self.database)

    def signal(self, event: anyio.Event | asyncio.Event) -> None:
        self._on_loop(event.set)

    def _on_loop(self, call: Callable[[], object]) -> None:
        if self.loop is None:
            call()
        else:
            self.loop.call_soon_threadsafe(call)


@dataclass(frozen=True)
class DrainCpu:
    """Per drained job, after the first ``SKIP``."""

    client_us: float
    server_us: float | None  # None: no backend of the database seen in /proc
    commits: float
    jobs_per_s: float


async def _commits(conn: psycopg.AsyncConnection[Any]) -> int:
    await conn.execute("SELECT pg_stat_force_next_flush()")
    cur = await conn.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def drain(
    dsn: str,
    jobs: int,
    profile: cProfile.Profile | None,
    *,
    type_name: str = "noop",
    atomic_group: int = 1,
    slots: int = 10,
    writes: bool = False,
    sync: bool = False,
) -> DrainCpu:
    """CPU per drained job (after the first ``SKIP``): this process's and the server's.
    ``writes``: each handler first inserts a row through its attempt's connection (an
    atomic handler's effect), else it does nothing. ``sync``: the handler is a plain
    ``def``, run on the worker's threads (one for each slot)."""
    await bulk_load(dsn, jobs, type_name=type_name)
    if writes:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as ddl:
            await ddl.execute(EFFECTS_TABLE)
    database = conninfo_to_dict(dsn)["dbname"]
    async with (
        open_client(dsn) as client,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as stats,
    ):
        counter = _CpuCounter(jobs)
        counter.profile = profile
        counter.database = str(database)
        counter.marks = frozenset({SKIP, jobs})
        counter.warm = asyncio.Event()
        count = counter.handler()

        async def write_then_count(attempt: Any) -> None:
            await attempt.connection.execute(EFFECT, (attempt.job.input.n,))
            await count(attempt)

        def count_on_a_thread(attempt: Any) -> None:
            counter.hit(attempt.job.input.n)

        handler: Callable[[Any], Any] = count
        if writes:
            handler = write_then_count
        elif sync:
            counter.loop = asyncio.get_running_loop()
            counter.lock = threading.Lock()
            handler = count_on_a_thread
        worker = create_in_process_worker(
            client=client,
            processors={type_name: handler},
            max_slots=slots,
            atomic_group=atomic_group,
        )
        stop = await worker.start()
        try:
            await counter.warm.wait()
            commits_first = await _commits(stats)
            await counter.done.wait()
            await asyncio.sleep(0.05)  # the last group's commit
            commits = await _commits(stats) - commits_first - 2
        finally:
            await stop()
    n = jobs - SKIP
    server = None
    if counter.server_first and counter.server_last:
        server = _spent(counter.server_first, counter.server_last) / n * 1e6
    wall = counter.marked[jobs] - counter.marked[SKIP]
    return DrainCpu(
        client_us=(counter.cpu_last - counter.cpu_first) / n * 1e6,
        server_us=server,
        commits=commits / n,
        jobs_per_s=n / wall,
    )


EFFECTS_TABLE = "CREATE TABLE bench_effects (n int NOT NULL)"
EFFECT = "INSERT INTO bench_effects (n) VALUES (%s)"

RAW_TABLE = "CREATE TABLE raw_jobs (id bigserial PRIMARY KEY, payload jsonb NOT NULL)"

# The rows ``start_chains`` writes for 100 plain jobs, by a bare multi-row INSERT.
PGWORK_ROWS = pgwork_rows_insert(100)


# Jobs per block: the pgwork row and its bare-SQL twin take turns block by block, so
# that both see the same minutes of a shared machine (run one after the other, the
# two rows of one run differed by more than the difference being measured).
BLOCK = 500


@dataclass
class _Tally:
    """Process CPU, wall clock and the connection's backend CPU, summed over blocks."""

    cpu: float = 0.0
    wall: float = 0.0
    server: float = 0.0
    jobs: int = 0

    def per_job(self) -> tuple[float, float, float]:
        n = max(1, self.jobs)
        return self.cpu / n * 1e6, self.wall / n * 1e6, self.server / n * 1e6


def _backend_cpu(pid: int) -> float:
    """CPU seconds of one server process (0.0 when it is not on this machine)."""
    return process_cpu(pid) or 0.0


async def _block(
    tally: _Tally,
    calls: int,
    per_call: int,
    step: Any,
    pid: int,
    profile: cProfile.Profile | None,
) -> None:
    """Run ``calls`` calls of ``step`` (``per_call`` jobs each) into ``tally``."""
    first = tally.jobs
    if profile is not None:
        profile.enable()
    server = _backend_cpu(pid)
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(calls):
        await step(first + i * per_call)
    tally.cpu += time.process_time() - cpu
    tally.wall += time.perf_counter() - wall
    tally.server += _backend_cpu(pid) - server
    if profile is not None:
        profile.disable()
    tally.jobs += calls * per_call


async def enqueue(
    dsn: str,
    jobs: int,
    profiles: tuple[cProfile.Profile, cProfile.Profile] | None,
    batch_jobs: int | None = None,
) -> dict[str, tuple[float, float, float]]:
    """Microseconds of CPU, of wall clock and of the connection's backend CPU per job:
    pgwork's enqueue and bare SQL, one (``jobs`` jobs) and 100 a time (``batch_jobs``,
    default ten times ``jobs``: the backend's CPU is read in clock ticks), taking turns
    every ``BLOCK`` jobs; ``profiles`` (one for each pgwork row) watch pgwork's rows."""
    batch_jobs = batch_jobs or 10 * jobs
    one_profile, batch_profile = profiles or (None, None)
    async with (
        open_client(dsn, pool_size=2) as client,
        await psycopg.AsyncConnection.connect(dsn) as conn,
    ):
        await conn.execute(RAW_TABLE)
        await conn.commit()
        row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
        await conn.commit()
        assert row is not None
        pid = int(row[0])
        noop = client.registry.get("noop")

        async def one(i: int) -> None:
            await client.start_chain(conn, noop, Item(n=i))
            await conn.commit()

        async def raw_one(i: int) -> None:
            await conn.execute("INSERT INTO raw_jobs (payload) VALUES (%s)", [f'{{"n": {i}}}'])
            await conn.commit()

        multi = "INSERT INTO raw_jobs (payload) VALUES " + ", ".join(["(%s)"] * 100)

        async def batch(i: int) -> None:
            await client.start_chains(conn, [ChainStart(noop, Item(n=i + k)) for k in range(100)])
            await conn.commit()

        async def raw_batch(i: int) -> None:
            await conn.execute(multi, [f'{{"n": {i + k}}}' for k in range(100)])
            await conn.commit()

        async def same_rows(i: int) -> None:
            await conn.execute(PGWORK_ROWS, pgwork_rows_params(range(i, i + 100)))
            await conn.commit()

        rows = (
            ("start_chain + commit", one, 1, one_profile),
            ("INSERT + COMMIT", raw_one, 1, None),
            ("start_chains(100) + commit", batch, 100, batch_profile),
            ("INSERT of 100 rows + COMMIT", raw_batch, 100, None),
            ("INSERT of 100 pgwork rows + COMMIT", same_rows, 100, None),
        )
        tallies = {name: _Tally() for name, *_ in rows}
        for _name, step, size, _profile in rows:  # warm up: prepared statements, caches
            for i in range(max(1, 200 // size)):
                await step(i * size)
        for pair, count in ((rows[:2], jobs), (rows[2:], batch_jobs)):  # taking turns
            for _ in range(max(1, count // BLOCK)):
                for name, step, size, profile in pair:
                    await _block(tallies[name], max(1, BLOCK // size), size, step, pid, profile)
    return {name: tally.per_job() for name, tally in tallies.items()}


def _ratio(name: str, row: DrainCpu, plain: DrainCpu) -> str:
    """A drain beside the plain one: what counting a limit costs (``limited / plain``),
    what running the handlers on threads costs (``sync / async``)."""
    server = "?"
    if row.server_us is not None and plain.server_us:
        server = f"{row.server_us / plain.server_us:.2f}"
    return (
        f"{name} drain: {row.jobs_per_s / plain.jobs_per_s:.2f} x the jobs/s, "
        f"{server} x the server's CPU per job, "
        f"{row.client_us / plain.client_us:.2f} x the worker's"
    )


# --only name, job type, atomic_group, whether the handler writes a row, whether it is
# a plain def (on the worker's threads), row title
_DRAINS = (
    ("drain", "noop", 1, False, False, "drain, 1 worker x {slots} slots"),
    (
        "limited",
        "noop_limited",
        1,
        False,
        False,
        "drain, 1 worker x {slots} slots, a concurrency limit that never binds",
    ),
    (
        "sync",
        "noop",
        1,
        False,
        True,
        "drain, 1 worker x {slots} slots, sync handlers on {slots} threads",
    ),
    ("atomic", "noop_atomic", 1, False, False, "atomic drain, 1 worker x {slots} slots"),
    (
        "atomic32",
        "noop_atomic",
        32,
        False,
        False,
        "atomic drain, 1 worker x {slots} slots, groups of 32",
    ),
    (
        "atomic32w",
        "noop_atomic",
        32,
        True,
        False,
        "atomic drain, 1 worker x {slots} slots, groups of 32, each handler inserting a row",
    ),
)


async def _run(args: argparse.Namespace) -> None:
    only = set(args.only.split(","))
    if args.tune_gc:
        tune_gc()
    print(f"event loop: {current()}")
    with server(args.dsn) as (admin, _kind):
        dbs = PgworkDatabases(admin)
        try:
            drained: dict[str, DrainCpu] = {}
            for name, type_name, group, writes, sync, title in _DRAINS:
                if name not in only:
                    continue
                profile = cProfile.Profile(time.process_time) if args.profile else None
                with dbs.fresh() as dsn:
                    row = await drain(
                        dsn,
                        args.jobs,
                        profile,
                        type_name=type_name,
                        atomic_group=group,
                        slots=args.slots,
                        writes=writes,
                        sync=sync,
                    )
                server_us = "?" if row.server_us is None else f"{row.server_us:.1f}"
                print(
                    f"{title.format(slots=args.slots)}: {row.client_us:.1f} µs CPU per job, "
                    "server backends "
                    f"{server_us} µs, {row.commits:.2f} commits per job, "
                    f"{row.jobs_per_s:,.0f} jobs/s"
                )
                if profile is not None:
                    profile.dump_stats(f"{args.profile}.{name}")
                drained[name] = row
            if "drain" in drained:
                for name, label in (("limited", "limited / plain"), ("sync", "sync / async")):
                    if name in drained:
                        print(_ratio(label, drained[name], drained["drain"]))
            if "enqueue" in only:
                profiles = None
                if args.profile:
                    profiles = (
                        cProfile.Profile(time.process_time),
                        cProfile.Profile(time.process_time),
                    )
                with dbs.fresh() as dsn:
                    rows = await enqueue(dsn, args.enqueue_jobs, profiles, args.enqueue_batch_jobs)
                for name, (us, wall, backend) in rows.items():
                    print(
                        f"enqueue, {name}: {us:.1f} µs CPU per job ({wall:.1f} µs wall, "
                        f"server backend {backend:.1f} µs)"
                    )
                if profiles is not None:
                    profiles[0].dump_stats(f"{args.profile}.enqueue")
                    profiles[1].dump_stats(f"{args.profile}.enqueue100")
        finally:
            dbs.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu", description=__doc__)
    parser.add_argument("--dsn", help="admin DSN (default: an embedded PostgreSQL)")
    parser.add_argument("--jobs", type=int, default=20000, help="jobs to drain")
    parser.add_argument("--slots", type=int, default=10, help="the drain's max_slots")
    parser.add_argument("--enqueue-jobs", type=int, default=3000)
    parser.add_argument(
        "--enqueue-batch-jobs", type=int, default=None, help="default: 10 x --enqueue-jobs"
    )
    parser.add_argument("--only", default="drain,atomic,atomic32,enqueue")
    parser.add_argument(
        "--tune-gc",
        action="store_true",
        help="freeze and tune the garbage collector first (pgwork.worker.tune_gc), as "
        "`pgwork worker` and the benchmark's worker processes do",
    )
    parser.add_argument("--profile", metavar="FILE")
    parser.add_argument(
        "--loop", choices=LOOPS, default="auto", help="the event loop (auto: uvloop if installed)"
    )
    args = parser.parse_args()
    run(_run(args), resolve(args.loop))


if __name__ == "__main__":
    main()
