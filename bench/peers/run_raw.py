"""The raw-SQL floor: the benchmark's enqueue and drain done in bare SQL through psycopg,
with no queue library at all; see _peer_common.py.

Every library's figure sits beside what the same server allows a minimal client doing
the same essential work, so a ratio to a peer is read against the ceiling both share.
It runs in a process of its own, like the peers, and needs nothing but psycopg.

The table is the least a queue needs: an id, a payload, a status, and a partial index
on the pending rows for the claim to find them (pgwork's has five indexes, for chains,
listings and the acquire order).

- enqueue, one job per transaction: ``INSERT`` of one row, then ``COMMIT`` (psycopg
  opens the transaction with ``BEGIN``, as it does for pgwork and oban-py);
- enqueue, batches of N: one multi-row ``INSERT ... VALUES (..), (..)`` of N rows, then
  ``COMMIT``;
- enqueue with ``--rows pgwork``: the same, but of the rows pgwork's ``start_chains``
  writes, into pgwork's own table (the harness gives it a database with pgwork's
  schema): what those rows cost the server with no library around them, the yardstick
  for pgwork's batch enqueue ("a multi-row INSERT of the same rows");
- drain: ``--connections`` connections (default 4), each looping: claim a batch of
  ``--claim-batch`` (default 100) with ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE
  SKIP LOCKED)`` and commit (the claim must be durable, as any queue's lease is, or a
  worker crash mid-job would lose it), "run" each job (count it), then mark the batch
  done with one ``UPDATE ... WHERE id = ANY(...)`` and commit. Two statements and two
  commits per batch.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import psycopg
from _peer_common import (
    Counter,
    drained,
    emit,
    follow,
    parse_args,
    pgwork_rows_insert,
    pgwork_rows_params,
    run_on_loop,
    timed_enqueue,
    wait_empty,
)

SCHEMA = """
CREATE TABLE raw_jobs (
    id bigserial PRIMARY KEY,
    payload jsonb NOT NULL,
    status text NOT NULL DEFAULT 'pending',
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX raw_jobs_pending ON raw_jobs (id) WHERE status = 'pending'
"""
LOAD = """
INSERT INTO raw_jobs (payload)
SELECT jsonb_build_object('n', g) FROM generate_series(%s::bigint, %s::bigint) AS g
"""
CLAIM = """
UPDATE raw_jobs SET status = 'running'
WHERE id IN (
    SELECT id FROM raw_jobs WHERE status = 'pending'
    ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED
)
RETURNING id, payload
"""
COMPLETE = "UPDATE raw_jobs SET status = 'done' WHERE id = ANY(%s)"
UNFINISHED = "SELECT count(*) FROM raw_jobs WHERE status IN ('pending', 'running')"


async def enqueue(dsn: str, jobs: int, batch: int, rows: str) -> None:
    """``rows``: ``raw`` (the floor's own table) or ``pgwork`` (pgwork's rows, table)."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        statements: dict[int, str] = {}

        def statement(size: int) -> str:
            if size not in statements:
                if rows == "pgwork":
                    statements[size] = pgwork_rows_insert(size)
                else:
                    values = ", ".join(["(%s)"] * size)
                    statements[size] = "INSERT INTO raw_jobs (payload) VALUES " + values
            return statements[size]

        async def insert(numbers: list[int]) -> None:
            if rows == "pgwork":
                params = pgwork_rows_params(numbers)
            else:
                params = [f'{{"n": {n}}}' for n in numbers]
            await conn.execute(statement(len(numbers)), params)
            await conn.commit()

        await timed_enqueue(jobs, batch, insert)


async def drain(dsn: str, jobs: int, connections: int, claim_batch: int) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for first in range(0, jobs, 100_000):
            await conn.execute(LOAD, [first, min(jobs, first + 100_000) - 1])
        await conn.execute("VACUUM (ANALYZE) raw_jobs")
    counter = Counter(target=jobs)

    async def loop() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as worker:
            while True:
                claimed = await (await worker.execute(CLAIM, [claim_batch])).fetchall()
                if not claimed:
                    return
                for _, payload in claimed:
                    counter.hit(payload["n"])
                await worker.execute(COMPLETE, [[job_id for job_id, _ in claimed]])

    loops = asyncio.gather(*(loop() for _ in range(connections)))
    await follow(counter, asyncio.ensure_future(loops))
    drained(counter, await wait_empty(dsn, UNFINISHED))
    emit(
        note=f"{connections} connections, claim batches of {claim_batch}: claim (UPDATE .. "
        "FOR UPDATE SKIP LOCKED) and complete (UPDATE .. = ANY), each its own commit"
    )


async def main() -> None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--rows", choices=("raw", "pgwork"), default="raw")
    known, rest = pre.parse_known_args()
    parser_args = parse_args(rest)
    connections, claim_batch = 4, 100
    if parser_args.workload == "latency":
        sys.exit("the raw-SQL floor has no latency workload")
    if known.rows == "pgwork":
        if parser_args.workload != "enqueue":
            sys.exit("--rows pgwork is for the enqueue workload only")
    else:
        async with await psycopg.AsyncConnection.connect(parser_args.dsn, autocommit=True) as conn:
            await conn.execute(SCHEMA)
    if parser_args.workload == "enqueue":
        await enqueue(parser_args.dsn, parser_args.jobs, parser_args.batch, known.rows)
    else:
        await drain(parser_args.dsn, parser_args.jobs, connections, claim_batch)


if __name__ == "__main__":
    run_on_loop(main)
