"""Several worker processes sharing one queue, started with ``pgwork worker``.

Each process is what you would run under systemd, in a container, or as a Kubernetes
deployment: ``pgwork worker examples.multi_process_workers:worker``. They coordinate
only through PostgreSQL (``FOR UPDATE SKIP LOCKED`` to take jobs, LISTEN/NOTIFY to
wake up), so no job runs twice and any of them can stop at any time: SIGTERM finishes
in-flight jobs and exits.

    PGWORK_DSN=postgresql://localhost/app python examples/multi_process_workers.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import anyio
import psycopg
from pydantic import BaseModel

from pgwork import (
    Attempt,
    ChainStart,
    InProcessWorker,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
)

PROCESSES = 3
JOBS = 60


class Thumbnail(BaseModel):
    image_id: int


class Done(BaseModel):
    image_id: int
    worker_id: str


registry = JobTypeRegistry()
thumbnail = registry.job_type("make_thumbnail", input=Thumbnail, output=Done)


async def make_thumbnail(attempt: Attempt[Thumbnail, Done]) -> Done:
    await anyio.sleep(0.01)  # stands in for real work
    return Done(image_id=attempt.job.input.image_id, worker_id=attempt.worker_id)


async def worker(
    dsn: str, max_slots: int = 4, queues: Sequence[str] | None = None
) -> InProcessWorker:
    """Built in each worker process by ``pgwork worker``."""
    state = await PostgresStateAdapter.connect(dsn)
    client = create_client(
        state_adapter=state, notify_adapter=PostgresNotifyAdapter(dsn), registry=registry
    )
    return create_in_process_worker(
        client=client, processors={thumbnail: make_thumbnail}, max_slots=max_slots, queues=queues
    )


def start_workers(dsn: str) -> list[subprocess.Popen[bytes]]:
    root = Path(__file__).resolve().parents[1]  # so `examples.` is importable
    command = [sys.executable, "-m", "pgwork.cli", "worker"]
    target = "examples.multi_process_workers:worker"
    return [
        subprocess.Popen(
            [*command, target, "--slots", "4", "--log-level", "WARNING"],
            cwd=root,
            env={**os.environ, "PGWORK_DSN": dsn},
        )
        for _ in range(PROCESSES)
    ]


async def main(dsn: str) -> None:
    state = await PostgresStateAdapter.connect(dsn)
    client = create_client(
        state_adapter=state, notify_adapter=PostgresNotifyAdapter(dsn), registry=registry
    )
    processes = start_workers(dsn)
    try:
        # Each worker registers once it runs (and handles SIGTERM): wait for all of them,
        # so that every process shares the jobs and stops gracefully at the end.
        with anyio.fail_after(60):
            while True:
                if len(await client.list_workers()) >= PROCESSES:
                    break
                await anyio.sleep(0.1)  # a registration has no notification
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            started = await client.start_chains(
                conn, [ChainStart(thumbnail, Thumbnail(image_id=i)) for i in range(JOBS)]
            )
            await conn.commit()
        outputs = [await client.await_chain(s.id, timeout=60) for s in started]
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)  # graceful: in-flight jobs finish
        codes = [process.wait(timeout=30) for process in processes]
        await client.close()
    per_worker = Counter(output.worker_id for output in outputs)
    assert all(code == 0 for code in codes), codes
    assert sorted(o.image_id for o in outputs) == list(range(JOBS))
    print(f"{len(outputs)} jobs completed by {len(per_worker)} worker processes:")
    for worker_id, count in sorted(per_worker.items()):
        print(f"  {worker_id}: {count}")


if __name__ == "__main__":
    anyio.run(main, os.environ["PGWORK_DSN"])
