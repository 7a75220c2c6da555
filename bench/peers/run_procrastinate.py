"""procrastinate (psycopg connector) under the benchmark's workloads; see _peer_common.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from _peer_common import (
    Counter,
    drained,
    emit,
    follow,
    paced_enqueue,
    parse_args,
    run_on_loop,
    timed_enqueue,
    wait_empty,
)
from procrastinate import App, PsycopgConnector

UNFINISHED = "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"


async def main() -> None:
    args = parse_args()
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    counter = Counter(target=args.jobs)
    # psycopg_pool's default of 4 connections would starve 10 concurrent sub-workers plus
    # the listener; give it what the other libraries get.
    pool_size = args.concurrency + 2
    app = App(connector=PsycopgConnector(conninfo=args.dsn, min_size=2, max_size=pool_size))

    @app.task(name="noop")
    async def noop(n: int) -> None:
        counter.hit(n)

    # procrastinate defers through its own pool (autocommit): one transaction per call.
    async def enqueue(numbers: list[int]) -> None:
        if len(numbers) == 1:
            await noop.defer_async(n=numbers[0])
        else:
            await noop.batch_defer_async(*({"n": n} for n in numbers))

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        if args.workload == "enqueue":
            await timed_enqueue(args.jobs, args.batch, enqueue)
            return
        if args.workload == "drain":
            for first in range(0, args.jobs, 1000):
                await enqueue(list(range(first, min(args.jobs, first + 1000))))
        running = asyncio.create_task(
            app.run_worker_async(
                concurrency=args.concurrency, wait=True, install_signal_handlers=False
            )
        )
        try:
            if args.workload == "drain":
                await follow(counter, running)
                drained(counter, await wait_empty(args.dsn, UNFINISHED))
            else:
                await asyncio.sleep(0.5)
                await paced_enqueue(
                    args.jobs, args.interval, lambda n: enqueue([n]), counter, running
                )
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(running, timeout=30)
    emit(note=f"concurrency={args.concurrency}, pool of {pool_size}")


if __name__ == "__main__":
    run_on_loop(main)
