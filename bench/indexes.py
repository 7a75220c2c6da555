"""What each index of ``jobs`` costs: WAL and server CPU per job, size, HOT updates.

    python -m bench.indexes --dsn DSN [--jobs 10000] [--backlog 1000000] [--repeat 3]
        [--variants "head/-jobs_created_idx/ff=100;-jobs_chains_idx"]

Each variant runs in a fresh database migrated to head, changed as the variant says
(``head``: not at all; ``-NAME``: that index dropped; see ``variant_sql`` for the
rest), and goes through these phases, each measured on the server rather than by the
wall clock:

* enqueue: ``start_chains`` of 100 + commit, ``--jobs`` jobs, through the client;
* drain: one in-process worker (10 slots, staged, no-op handler) drains them;
* vacuum: a ``VACUUM`` of ``jobs`` afterwards (autovacuum is off for the table while
  the phases run, so the clean-up each index causes is counted here, once);
* renew: ``--renewals`` jobs held by one worker id, each lease renewed three times
  through the adapter (a job running a minute on the default 60 s lease).

For each phase: WAL bytes per job written for each relation (the heap, each index; read
back with ``pg_walinspect`` and filtered to this database, so other databases' traffic
on a shared server does not count), with and without full-page images (those depend on
when the server last checkpointed, the rest does not); server CPU per job (the time the
database's backends ran, from ``/proc/PID/schedstat``: the server must run on this
machine, else it shows n/a); how many row updates were HOT; which indexes the phase
read (``pg_stat_user_indexes``). ``--backlog N`` then loads N pending jobs more
(server-side, like ``python -m bench``'s backlog workload), prints each index's size
there, and drains ``--jobs`` of them, for the rate at depth next to the rate at
``--jobs``. ``--repeat N`` runs the variants N times, interleaved (on a shared machine
CPU figures move between minutes), and ends with each variant's medians. To compare
two builds (each with its schema and statements), run this file alternately with each
build's ``src`` first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench._env import fresh_database, server
from bench._pgwork_app import SCHEMA, Counter, Item, bulk_load, open_client
from pgwork import ChainStart, PostgresStateAdapter, create_in_process_worker
from pgwork.adapters.state import Lease
from pgwork.testing.databases import create_migrated_database, drop_database

__all__ = ["main"]

# WAL records of this database between two LSNs, summed per relfilenode (records that
# touch no relation, such as commits, under 0). A record is counted once, under the
# first block it references.
_WAL_BY_RELATION = """
SELECT COALESCE(substring(block_ref FROM 'rel \\d+/\\d+/(\\d+)')::oid, 0) AS node,
       sum(record_length)::bigint, sum(fpi_length)::bigint, count(*)
FROM pg_get_wal_records_info(%(start)s::pg_lsn, %(end)s::pg_lsn)
WHERE block_ref LIKE '%%/' || %(db)s || '/%%'
   OR (block_ref IS NULL OR block_ref = '') AND xid IN (
        SELECT xid FROM pg_get_wal_records_info(%(start)s::pg_lsn, %(end)s::pg_lsn)
        WHERE block_ref LIKE '%%/' || %(db)s || '/%%')
GROUP BY 1
"""

_RELATIONS = """
SELECT c.relfilenode, c.relname
FROM pg_class AS c
WHERE c.relnamespace = %(schema)s::regnamespace AND c.relfilenode <> 0
   OR c.oid = (SELECT reltoastrelid FROM pg_class WHERE oid = %(jobs)s::regclass)
"""

_INDEXES = """
SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid), s.idx_scan
FROM pg_index AS i
JOIN pg_stat_user_indexes AS s ON s.indexrelid = i.indexrelid
WHERE i.indrelid = %(jobs)s::regclass
ORDER BY 1
"""

_TABLE = """
SELECT pg_relation_size(relid), n_tup_ins, n_tup_upd, n_tup_hot_upd
FROM pg_stat_user_tables WHERE relid = %(jobs)s::regclass
"""

_BACKENDS = """
SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
"""


def _short(name: str) -> str:
    return name.split(".")[-1]


def _cpu_seconds(pids: Iterable[int]) -> dict[int, float] | None:
    """Seconds each process has run on a CPU (the scheduler's count, in nanoseconds,
    finer than the clock ticks of ``stat``), or None where /proc does not show them."""
    out = {}
    for pid in pids:
        try:
            out[pid] = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
        except OSError:
            return None
    return out


@dataclass
class Sample:
    """What the server says at one moment: WAL position, backends' CPU, index stats."""

    lsn: str
    cpu: dict[int, float] | None
    indexes: dict[str, tuple[int, int]]
    table: tuple[int, int, int, int]


@dataclass
class Phase:
    name: str
    jobs: int
    seconds: float
    wal: dict[str, tuple[int, int, int]]  # relation -> (bytes, FPI bytes, records)
    cpu: float | None
    scans: dict[str, int]
    updates: int
    hot: int


@dataclass
class Result:
    variant: str
    phases: list[Phase] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)
    backlog_sizes: dict[str, int] = field(default_factory=dict)
    heap_backlog: int = 0


class Probe:
    """A monitoring connection to the measured database."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        self.jobs = f"{SCHEMA}.jobs"
        self.db = ""
        self.nodes: dict[int, str] = {}
        self.holding = False

    async def setup(self) -> None:
        await self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        cur = await self.conn.execute(
            "SELECT oid FROM pg_database WHERE datname = current_database()"
        )
        row = await cur.fetchone()
        assert row is not None
        self.db = str(row[0])
        await self.conn.execute(f"ALTER TABLE {self.jobs} SET (autovacuum_enabled = false)")

    async def _rows(self, query: str, **params: Any) -> list[tuple[Any, ...]]:
        cur = await self.conn.execute(query, {"jobs": self.jobs, "schema": SCHEMA, **params})
        return await cur.fetchall()

    async def relations(self) -> None:
        self.nodes = {int(n): str(r) for n, r in await self._rows(_RELATIONS)}

    async def start(self) -> Sample:
        """A sample that opens a phase: the WAL written from here on is kept until the
        phase is read back (a temporary replication slot), however much the rest of a
        shared server writes and however often it checkpoints."""
        slot = f"bench_indexes_{os.getpid()}"
        if self.holding:
            await self._rows("SELECT pg_drop_replication_slot(%(slot)s)", slot=slot)
        await self._rows(
            "SELECT pg_create_physical_replication_slot(%(slot)s, true, true)", slot=slot
        )
        self.holding = True
        return await self.sample()

    async def sample(self) -> Sample:
        await asyncio.sleep(1.1)  # backends flush their statistics at most once a second
        await self.conn.execute("SELECT pg_stat_clear_snapshot()")
        [(lsn,)] = await self._rows("SELECT pg_current_wal_flush_lsn()::text")
        pids = [int(p) for (p,) in await self._rows(_BACKENDS)]
        indexes = {_short(n): (int(s), int(k)) for n, s, k in await self._rows(_INDEXES)}
        [table] = await self._rows(_TABLE)
        return Sample(lsn, _cpu_seconds(pids), indexes, tuple(int(v) for v in table))  # type: ignore[arg-type]

    async def phase(self, name: str, jobs: int, before: Sample, seconds: float) -> Phase:
        after = await self.sample()
        wal: dict[str, tuple[int, int, int]] = {}
        for node, size, fpi, count in await self._rows(
            _WAL_BY_RELATION, start=before.lsn, end=after.lsn, db=self.db
        ):
            rel = "(commit, other)" if node == 0 else self.nodes.get(int(node), f"#{node}")
            old = wal.get(rel, (0, 0, 0))
            wal[rel] = (old[0] + int(size), old[1] + int(fpi or 0), old[2] + int(count))
        cpu = _cpu_delta(before, after)
        scans = {n: after.indexes[n][1] - before.indexes.get(n, (0, 0))[1] for n in after.indexes}
        return Phase(
            name,
            jobs,
            seconds,
            wal,
            cpu,
            scans,
            after.table[2] - before.table[2],
            after.table[3] - before.table[3],
        )


def _cpu_delta(before: Sample, after: Sample) -> float | None:
    if before.cpu is None or after.cpu is None:
        return None
    return sum(t - before.cpu.get(pid, 0.0) for pid, t in after.cpu.items())


async def _enqueue(dsn: str, jobs: int, probe: Probe) -> tuple[float, Sample]:
    """Enqueue ``jobs`` jobs, 100 a transaction; return the seconds and a sample taken
    while the client's backends still exist."""
    async with (
        open_client(dsn, pool_size=2) as client,
        await psycopg.AsyncConnection.connect(dsn) as conn,
    ):
        noop = client.registry.get("noop")
        started = time.perf_counter()
        for first in range(0, jobs, 100):
            items = [ChainStart(noop, Item(n=i)) for i in range(first, min(jobs, first + 100))]
            await client.start_chains(conn, items)
            await conn.commit()
        seconds = time.perf_counter() - started
        return seconds, await probe.sample()


async def _renewals(dsn: str, jobs: int, rounds: int, probe: Probe) -> Phase:
    """Hold ``jobs`` jobs and renew each lease ``rounds`` times, as a worker does for a
    job that runs ``rounds`` thirds of its lease; the renewals alone are measured."""
    state = await PostgresStateAdapter.connect(dsn, schema=SCHEMA, max_size=2)
    try:
        held: list[Lease] = []
        while len(held) < jobs:
            got = await state.acquire(
                worker_id="bench-renew",
                leases={"noop": timedelta(seconds=60)},
                queues=None,
                limit=min(100, jobs - len(held)),
            )
            if not got:
                break
            held.extend(Lease(job_id=j.id, lease_token=j.lease_token) for j in got)
        before = await probe.start()
        started = time.perf_counter()
        for _ in range(rounds):
            for first in range(0, len(held), 100):
                batch = held[first : first + 100]
                await state.renew(
                    leases=batch, duration={lease.job_id: timedelta(seconds=60) for lease in batch}
                )
        seconds = time.perf_counter() - started
        end = await probe.sample()
    finally:
        await state.close()
    phase = await probe.phase("renew", len(held) * rounds, before, seconds)
    phase.cpu = _cpu_delta(before, end)
    return phase


async def _drain(dsn: str, jobs: int, probe: Probe) -> tuple[float, Sample]:
    """Drain ``jobs`` jobs; return the seconds and a sample taken before the worker
    stops (its backends' CPU is read while they still exist)."""
    async with open_client(dsn) as client:
        counter = Counter(jobs)
        worker = create_in_process_worker(
            client=client, processors={"noop": counter.handler()}, max_slots=10
        )
        started = time.perf_counter()
        stop = await worker.start()
        try:
            await counter.done.wait()
            seconds = time.perf_counter() - started
            end = await probe.sample()
        finally:
            await stop()
    return seconds, end


async def _measured_drain(probe: Probe, dsn: str, jobs: int, name: str) -> Phase:
    before = await probe.start()
    seconds, end = await _drain(dsn, jobs, probe)
    # The backends' CPU as the worker stopped; WAL and statistics as they are now.
    phase = await probe.phase(name, jobs, before, seconds)
    phase.cpu = _cpu_delta(before, end)
    return phase


def variant_sql(variant: str) -> list[str]:
    """The statements that turn the migrated schema into ``variant``: ``head`` (none),
    or ';'-separated changes: ``-NAME`` drops an index, ``+NAME=DEFINITION`` creates one
    (``+jobs_x=(a, b) WHERE ...``), ``ff=N`` sets the table's fillfactor."""
    jobs = f"{SCHEMA}.jobs"
    out = []
    for change in filter(None, (c.strip() for c in variant.split(";"))):
        if change == "head":
            continue
        if change.startswith("-"):
            out.append(f"DROP INDEX {SCHEMA}.{change[1:]}")
        elif change.startswith("+"):
            name, definition = change[1:].split("=", 1)
            out.append(f"CREATE INDEX {name} ON {jobs} {definition}")
        elif change.startswith("ff="):
            out.append(f"ALTER TABLE {jobs} SET (fillfactor = {int(change[3:])})")
        else:
            raise SystemExit(f"unknown change {change!r} in variant {variant!r}")
    return out


async def run_variant(
    admin: str, template: str, variant: str, jobs: int, backlog: int, renewals: int
) -> Result:
    result = Result(variant)
    with fresh_database(admin, template=template) as dsn:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            probe = Probe(conn)
            await probe.setup()
            for change in variant_sql(variant):
                await conn.execute(change)
            await probe.relations()

            before = await probe.start()
            seconds, end = await _enqueue(dsn, jobs, probe)
            phase = await probe.phase("enqueue", jobs, before, seconds)
            phase.cpu = _cpu_delta(before, end)
            result.phases.append(phase)
            result.sizes = {n: s for n, (s, _) in (await probe.sample()).indexes.items()}
            await conn.execute(f"ANALYZE {probe.jobs}")

            result.phases.append(await _measured_drain(probe, dsn, jobs, "drain"))

            before = await probe.start()
            started = time.perf_counter()
            await conn.execute(f"VACUUM {probe.jobs}")
            result.phases.append(
                await probe.phase("vacuum", jobs, before, time.perf_counter() - started)
            )

            if renewals:
                await _enqueue(dsn, renewals, probe)
                result.phases.append(await _renewals(dsn, renewals, 3, probe))
                await conn.execute(f"UPDATE {probe.jobs} SET status = 'completed'")
                await conn.execute(f"VACUUM {probe.jobs}")

            if backlog:
                await bulk_load(dsn, backlog)
                await conn.execute(f"VACUUM (ANALYZE) {probe.jobs}")
                await conn.execute("CHECKPOINT")
                sample = await probe.sample()
                result.backlog_sizes = {n: s for n, (s, _) in sample.indexes.items()}
                result.heap_backlog = sample.table[0]
                result.phases.append(
                    await _measured_drain(probe, dsn, jobs, f"drain at {backlog:,}")
                )
    return result


def _print(results: list[Result], print_: Callable[[str], None] = print) -> None:
    for result in results:
        print_(f"\n== {result.variant}")
        for ph in result.phases:
            total = sum(b for b, _, _ in ph.wal.values())
            fpi = sum(f for _, f, _ in ph.wal.values())
            cpu = "n/a" if ph.cpu is None else f"{ph.cpu / ph.jobs * 1e6:.0f} µs"
            hot = f", updates {ph.updates:,} ({ph.hot:,} HOT)" if ph.updates else ""
            print_(
                f"{ph.name}: {ph.jobs / ph.seconds:,.0f} jobs/s, server CPU {cpu} per job, "
                f"WAL {total / ph.jobs:,.0f} B per job ({(total - fpi) / ph.jobs:,.0f} without "
                f"full-page images){hot}"
            )
            for rel, (size, fpi, count) in sorted(ph.wal.items(), key=lambda kv: -kv[1][0]):
                print_(
                    f"    {rel:28} {size / ph.jobs:8,.0f} B/job  (FPI {fpi / ph.jobs:6,.0f}, "
                    f"{count / ph.jobs:5.2f} records/job)"
                )
            used = ", ".join(f"{n} {k:,}" for n, k in ph.scans.items() if k)
            print_(f"    index scans: {used or 'none'}")
        print_(f"  sizes after enqueue of {result.phases[0].jobs:,}:")
        for name, size in result.sizes.items():
            line = f"    {name:28} {size / 1024:10,.0f} KiB"
            if result.backlog_sizes:
                line += f"   at backlog: {result.backlog_sizes[name] / 2**20:8,.1f} MiB"
            print_(line)
        if result.heap_backlog:
            print_(f"    {'heap':28} {'':14}   at backlog: {result.heap_backlog / 2**20:8,.1f} MiB")


def _print_medians(results: list[Result], print_: Callable[[str], None] = print) -> None:
    print_("\n== medians per variant (server CPU µs per job / WAL B per job without FPI)")
    for variant in dict.fromkeys(r.variant for r in results):
        runs = [r for r in results if r.variant == variant]
        cells = []
        for i, ph in enumerate(runs[0].phases):
            phases = [r.phases[i] for r in runs]
            cpus = [p.cpu / p.jobs * 1e6 for p in phases if p.cpu is not None]
            wal = [sum(b - f for b, f, _ in p.wal.values()) / p.jobs for p in phases]
            rate = statistics.median(p.jobs / p.seconds for p in phases)
            cpu = f"{statistics.median(cpus):.0f}" if cpus else "n/a"
            cells.append(f"{ph.name} {cpu} / {statistics.median(wal):,.0f} ({rate:,.0f}/s)")
        print_(f"{variant}: " + "; ".join(cells))


async def _run(args: argparse.Namespace) -> None:
    with server(args.dsn) as (admin, _kind):
        template = create_migrated_database(admin)
        name = psycopg.conninfo.conninfo_to_dict(template)["dbname"]
        try:
            results = []
            for _ in range(args.repeat):
                for variant in args.variants.split("/"):
                    results.append(
                        await run_variant(
                            admin, name, variant, args.jobs, args.backlog, args.renewals
                        )
                    )
            _print(results)
            if args.repeat > 1:
                _print_medians(results)
        finally:
            drop_database(admin, str(name))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.indexes", description=__doc__)
    parser.add_argument("--dsn", help="admin DSN (default: an embedded PostgreSQL)")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--backlog", type=int, default=0, help="jobs of a deep backlog")
    parser.add_argument(
        "--variants",
        default="head",
        help="'/'-separated variants, each 'head' or ';'-separated changes: -INDEX, "
        "+INDEX=(columns) WHERE ..., ff=N",
    )
    parser.add_argument(
        "--renewals", type=int, default=1000, help="jobs whose lease is renewed 3 times"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each variant")
    asyncio.run(_run(parser.parse_args()))


if __name__ == "__main__":
    main()
