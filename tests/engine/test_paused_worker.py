"""A worker paused (SIGSTOP) past its lease loses the job, and nothing it writes later
counts: the job is reaped and completed by another worker, and the paused worker's
completion is refused when it resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from pgwork import Attempt, JobStatus

from ._paused_worker import Num, registry
from .conftest import ClientFactory, eventually, scalar

pytestmark = [pytest.mark.anyio, pytest.mark.skipif(os.name != "posix", reason="needs signals")]


async def test_paused_worker_is_reaped_and_its_late_completion_refused(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    await conn.execute("CREATE TABLE ledger (job_id uuid, worker text)")
    await conn.commit()
    client = await make_client(registry())
    slow = client.registry.get("slow")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.engine._paused_worker", pgwork_dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        started = await client.start_chain(conn, slow, Num(n=1))
        await conn.commit()
        with anyio.fail_after(30):
            read = await anyio.to_thread.run_sync(proc.stdout.readline, abandon_on_cancel=True)
        assert read.strip() == "started"

        proc.send_signal(signal.SIGSTOP)
        # Wait (on the database clock) until the paused worker's lease has expired.
        await eventually(
            lambda: _expired(pgwork_dsn, started.job_id), timeout=10, what="lease expiry"
        )

        async def handle(attempt: Attempt[Num, Any]) -> str:
            return "B"

        await workers(client=client, processors={slow: handle}, worker_id="rescuer")

        async def completed() -> bool:
            return (await client.get_job(started.job_id)).status is JobStatus.COMPLETED

        await eventually(completed, what="completion by the rescuer")
        proc.send_signal(signal.SIGCONT)
        # Resumed, the worker learns that its lease is gone: from the renewal, which
        # aborts the attempt, or, if the handler's sleep ended first, from the refused
        # completion (a lease.lost event). Read within a bound (a thread blocked on the
        # pipe would outlive the test's timeout), so a worker that learns neither fails.
        lines: list[str] = []
        with anyio.fail_after(30):
            while not any(_learnt_lease_lost(line) for line in lines):
                line = await anyio.to_thread.run_sync(proc.stdout.readline, abandon_on_cancel=True)
                assert line, f"worker process ended early; output: {lines}"
                lines.append(line.strip())
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=10)
    job = await client.get_job(started.job_id)
    assert job.output == "B"
    assert job.attempt == 2
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM ledger WHERE worker = 'paused'") == 1


async def _expired(dsn: str, job_id: Any) -> bool:
    return bool(
        await scalar(dsn, "SELECT leased_until < now() FROM pgwork.jobs WHERE id = %s", job_id)
    )


def _learnt_lease_lost(line: str) -> bool:
    return line.startswith("aborted") or (
        line.startswith("log ") and ("refused" in line or "lease.lost" in line)
    )
