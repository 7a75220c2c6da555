"""PgQueuer under the benchmark's workloads, on either of its async drivers; see
_peer_common.py.

``--driver asyncpg`` is PgQueuer's strongest documented setup: its performance guide
asks for a direct asyncpg connection (``AsyncpgDriver``, not the pool driver) for the
``QueueManager``, and its own benchmark finds asyncpg ~1.7x psycopg. Both drivers run on
uvloop (``--loop uvloop``, given by ``bench.peers.PEERS``), as ``pgq run`` does wherever
uvloop is installed (PgQueuer depends on it). The enqueuing side
also uses one direct connection: the benchmark enqueues from one connection, one call
after another, where a pool (``AsyncpgPoolDriver``, which the guide suggests for many
concurrent producers) would only add a checkout per call. ``--driver psycopg`` is
``PsycopgDriver`` on autocommit connections.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

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
from pgqueuer import Queries, QueueManager

# Finished jobs leave the queue table (moved to the log table).
UNFINISHED = "SELECT count(*) FROM pgqueuer"


async def _connect(dsn: str, driver: str) -> tuple[Any, Callable[[], Awaitable[None]]]:
    """A PgQueuer driver on a new connection, and how to close that connection."""
    if driver == "asyncpg":
        import asyncpg
        from pgqueuer import AsyncpgDriver

        conn = await asyncpg.connect(dsn)
        return AsyncpgDriver(conn), conn.close
    import psycopg
    from pgqueuer import PsycopgDriver

    # PgQueuer's psycopg driver needs an autocommit connection: every enqueue call is
    # one transaction of its own.
    pconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    return PsycopgDriver(pconn), pconn.close


async def main() -> None:
    args = parse_args(drivers=("psycopg", "asyncpg"))
    counter = Counter(target=args.jobs)
    driver, close = await _connect(args.dsn, args.driver)
    try:
        queries = Queries(driver)
        await queries.install()

        async def enqueue(numbers: list[int]) -> None:
            if len(numbers) == 1:
                await queries.enqueue("noop", str(numbers[0]).encode(), 0)
            else:
                await queries.enqueue(
                    ["noop"] * len(numbers),
                    [str(n).encode() for n in numbers],
                    [0] * len(numbers),
                )

        if args.workload == "enqueue":
            await timed_enqueue(args.jobs, args.batch, enqueue)
            return
        if args.workload == "drain":
            for first in range(0, args.jobs, 1000):
                await enqueue(list(range(first, min(args.jobs, first + 1000))))
        await _work(args, counter, enqueue)
    finally:
        await close()
    emit(
        note=f"{'AsyncpgDriver' if args.driver == 'asyncpg' else 'PsycopgDriver'} on one "
        f"connection for the QueueManager, batch_size={args.concurrency}, concurrency unbounded"
    )


async def _work(args: Any, counter: Counter, enqueue: Callable[[list[int]], Any]) -> None:
    worker_driver, close = await _connect(args.dsn, args.driver)
    try:
        qm = QueueManager(Queries(worker_driver))

        @qm.entrypoint("noop")
        async def noop(job) -> None:  # type: ignore[no-untyped-def]
            counter.hit(int(job.payload))

        running = asyncio.create_task(qm.run(batch_size=args.concurrency))
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
            qm.shutdown.set()
            await asyncio.wait_for(running, timeout=30)
    finally:
        await close()


if __name__ == "__main__":
    run_on_loop(main)
