"""oban-py (PyPI ``oban``) under the benchmark's workloads; see _peer_common.py."""

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
    run_on_loop,
    timed_enqueue,
    wait_empty,
)
from oban import Oban, worker
from oban.schema import install_sql
from psycopg_pool import AsyncConnectionPool

UNFINISHED = "SELECT count(*) FROM oban_jobs WHERE state IN ('available', 'scheduled', 'executing')"
COUNTER = Counter(target=0)


@worker(queue="default")
class Noop:
    async def process(self, job):  # type: ignore[no-untyped-def]
        COUNTER.hit(job.args["n"])


async def main() -> None:
    args = parse_args()
    COUNTER.target = args.jobs
    async with await psycopg.AsyncConnection.connect(args.dsn, autocommit=True) as conn:
        await conn.execute(install_sql())
    pool = AsyncConnectionPool(args.dsn, min_size=1, max_size=10, open=False)
    await pool.open(wait=True)
    try:
        await run(args, pool)
    finally:
        await pool.close()


async def run(args, pool: AsyncConnectionPool) -> None:  # type: ignore[no-untyped-def]
    client = Oban(pool=pool, name="bench-client")
    async with await psycopg.AsyncConnection.connect(args.dsn) as conn:

        async def enqueue(numbers: list[int]) -> None:
            await client.enqueue_many([Noop.new({"n": n}) for n in numbers], conn=conn)
            await conn.commit()

        if args.workload == "enqueue":
            await timed_enqueue(args.jobs, args.batch, enqueue)
            return
        if args.workload == "drain":
            for first in range(0, args.jobs, 1000):
                await enqueue(list(range(first, min(args.jobs, first + 1000))))
        server = Oban(pool=pool, queues={"default": args.concurrency})
        await server.start()
        try:
            if args.workload == "drain":
                await follow(COUNTER)
                drained(COUNTER, await wait_empty(args.dsn, UNFINISHED))
            else:
                await asyncio.sleep(0.5)
                await paced_enqueue(args.jobs, args.interval, lambda n: enqueue([n]), COUNTER)
        finally:
            await server.stop()
    emit(note=f"queue limit {args.concurrency}")


if __name__ == "__main__":
    run_on_loop(main)
