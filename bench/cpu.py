"""Client CPU per job: a drain and an enqueue measured in process time, not wall time.

    python -m bench.cpu --dsn DSN [--jobs 20000] [--slots 10] [--only drain,enqueue]
                        [--profile FILE]

On a shared machine wall-clock rates move by a third between runs; the CPU this process
spends per job moves much less, and it is what a change to pgwork's Python side can
shrink. The drain row is one in-process worker (10 slots unless ``--slots``, staged,
no-op handler) on a pre-loaded queue, measured from its 1,000th handler start to its last
(start-up and the first turns are not counted). The enqueue rows are ``start_chain`` +
``commit`` per job, and ``start_chains`` of 100 + ``commit``, each next to the same work
done with bare SQL on the same psycopg connection: a single-row ``INSERT`` + ``COMMIT``
and a multi-row ``INSERT`` of 100 rows + ``COMMIT`` into a table of a ``bigserial`` id
and a ``jsonb`` payload (the raw floor's table, ``bench/peers/run_raw.py``). Each
enqueue row also gives its wall-clock time per job (on a shared machine, compare it
within one run only). ``--profile`` runs cProfile over the measured part and writes its
statistics (``pstats``) to FILE.drain, FILE.enqueue (``start_chain``) and
FILE.enqueue100 (``start_chains`` of 100).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import time
from typing import Any

import psycopg

from bench._env import PgworkDatabases, server
from bench._pgwork_app import Counter, Item, bulk_load, open_client
from pgwork import ChainStart, create_in_process_worker

__all__ = ["main"]

SKIP = 1000


class _CpuCounter(Counter):
    """A Counter that notes the process time at its ``SKIP``-th and last handler."""

    cpu_first: float = 0.0
    cpu_last: float = 0.0
    profile: cProfile.Profile | None = None

    def hit(self, n: int | None = None) -> None:
        super().hit(n)
        if self.count == SKIP:
            if self.profile is not None:
                self.profile.enable()
            self.cpu_first = time.process_time()
        elif self.count == self.target:
            self.cpu_last = time.process_time()
            if self.profile is not None:
                self.profile.disable()


async def drain(dsn: str, jobs: int, profile: cProfile.Profile | None, *, slots: int = 10) -> float:
    """Microseconds of this process's CPU per drained job (after the first ``SKIP``)."""
    await bulk_load(dsn, jobs)
    async with open_client(dsn) as client:
        counter = _CpuCounter(jobs)
        counter.profile = profile
        worker = create_in_process_worker(
            client=client, processors={"noop": counter.handler()}, max_slots=slots
        )
        stop = await worker.start()
        try:
            await counter.done.wait()
        finally:
            await stop()
    return (counter.cpu_last - counter.cpu_first) / (jobs - SKIP) * 1e6


RAW_TABLE = "CREATE TABLE raw_jobs (id bigserial PRIMARY KEY, payload jsonb NOT NULL)"


async def _timed(n: int, step: Any, profile: cProfile.Profile | None = None) -> tuple[float, float]:
    """Process time and wall-clock time of ``n`` calls of ``step``, after a warm-up."""
    for i in range(min(n, 200)):  # warm up: prepared statements, caches
        await step(i)
    if profile is not None:
        profile.enable()
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(n):
        await step(i)
    spent = time.process_time() - cpu, time.perf_counter() - wall
    if profile is not None:
        profile.disable()
    return spent


async def enqueue(
    dsn: str, jobs: int, profiles: tuple[cProfile.Profile, cProfile.Profile] | None
) -> dict[str, tuple[float, float]]:
    """Microseconds of CPU and of wall clock per job: pgwork's enqueue and bare SQL, one
    and 100 a time; ``profiles`` (one for each pgwork row) watch pgwork's rows."""
    out: dict[str, tuple[float, float]] = {}
    one_profile, batch_profile = profiles or (None, None)
    async with (
        open_client(dsn, pool_size=2) as client,
        await psycopg.AsyncConnection.connect(dsn) as conn,
    ):
        await conn.execute(RAW_TABLE)
        await conn.commit()
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

        def per_job(spent: tuple[float, float], count: int) -> tuple[float, float]:
            return spent[0] / count * 1e6, spent[1] / count * 1e6

        out["start_chain + commit"] = per_job(await _timed(jobs, one, one_profile), jobs)
        out["INSERT + COMMIT"] = per_job(await _timed(jobs, raw_one), jobs)
        rounds = max(1, jobs // 100)
        out["start_chains(100) + commit"] = per_job(
            await _timed(rounds, batch, batch_profile), rounds * 100
        )
        out["INSERT of 100 rows + COMMIT"] = per_job(await _timed(rounds, raw_batch), rounds * 100)
    return out


async def _run(args: argparse.Namespace) -> None:
    only = set(args.only.split(","))
    with server(args.dsn) as (admin, _kind):
        dbs = PgworkDatabases(admin)
        try:
            if "drain" in only:
                profile = cProfile.Profile(time.process_time) if args.profile else None
                with dbs.fresh() as dsn:
                    us = await drain(dsn, args.jobs, profile, slots=args.slots)
                print(f"drain, 1 worker x {args.slots} slots: {us:.1f} µs CPU per job")
                if profile is not None:
                    profile.dump_stats(f"{args.profile}.drain")
            if "enqueue" in only:
                profiles = None
                if args.profile:
                    profiles = (
                        cProfile.Profile(time.process_time),
                        cProfile.Profile(time.process_time),
                    )
                with dbs.fresh() as dsn:
                    rows = await enqueue(dsn, args.enqueue_jobs, profiles)
                for name, (us, wall) in rows.items():
                    print(f"enqueue, {name}: {us:.1f} µs CPU per job ({wall:.1f} µs wall)")
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
    parser.add_argument("--only", default="drain,enqueue")
    parser.add_argument("--profile", metavar="FILE")
    asyncio.run(_run(parser.parse_args()))


if __name__ == "__main__":
    main()
