"""A worker process for the paused-worker test: runs "slow" jobs with a short lease.

Each attempt records itself in ``ledger`` (autocommit) and then waits ``HOLD`` seconds
before returning "A". Prints one line per event so the test can follow it.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import timedelta
from typing import Any

import psycopg
from pydantic import BaseModel
from tests._loop import run as run_on_test_loop

from pgwork import (
    Attempt,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
)

HOLD = 1.5


class Num(BaseModel):
    n: int


def registry() -> JobTypeRegistry:
    reg = JobTypeRegistry()
    reg.job_type("slow", input=Num, lease=timedelta(seconds=1))
    return reg


async def main(dsn: str) -> None:
    reg = registry()
    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(dsn),
        notify_adapter=PostgresNotifyAdapter(dsn),
        registry=reg,
    )

    async def handle(attempt: Attempt[Num, Any]) -> str:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
            await c.execute(
                "INSERT INTO ledger VALUES (%s, %s)", (attempt.job.id, attempt.worker_id)
            )
        print("started", flush=True)
        try:
            await asyncio.sleep(HOLD)
        except BaseException:
            print(f"aborted {attempt.abort_reason}", flush=True)
            raise
        print("returning", flush=True)
        return "A"

    worker = create_in_process_worker(
        client=client, processors={"slow": handle}, worker_id="paused", poll_interval=0.2
    )
    async with worker:
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="log %(message)s")
    run_on_test_loop(main, sys.argv[1])
