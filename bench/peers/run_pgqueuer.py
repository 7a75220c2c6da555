"""PgQueuer (psycopg driver) under the benchmark's workloads; see _peer_common.py."""

from __future__ import annotations

import asyncio

import psycopg
from _peer_common import (
    Counter,
    drained,
    emit,
    follow,
    paced_enqueue,
    parse_args,
    timed_enqueue,
    wait_empty,
)
from pgqueuer import PsycopgDriver, Queries, QueueManager

# Finished jobs leave the queue table (moved to the log table).
UNFINISHED = "SELECT count(*) FROM pgqueuer"


async def main() -> None:
    args = parse_args()
    counter = Counter(target=args.jobs)
    # PgQueuer's driver needs an autocommit connection: every enqueue call is one
    # transaction of its own.
    async with await psycopg.AsyncConnection.connect(args.dsn, autocommit=True) as conn:
        queries = Queries(PsycopgDriver(conn))
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

        worker_conn = await psycopg.AsyncConnection.connect(args.dsn, autocommit=True)
        qm = QueueManager(Queries(PsycopgDriver(worker_conn)))

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
            await worker_conn.close()
    emit(note=f"batch_size={args.concurrency}, concurrency unbounded")


if __name__ == "__main__":
    asyncio.run(main())
