"""A worker draining a backlog beside the dashboard bench (``bench.dashboard --drain``).

Pages measured on an idle database say what their reads cost; an operator opens them
while workers run at full speed on the same machine, where every page competes with the
worker and its backends for the CPU and reads a table whose running jobs change under
it. ``draining`` loads a backlog of no-op jobs, starts a pgwork worker process
(bench/_worker_process.py) on it, and keeps the loaded data's busy workers alive (a
heartbeat and a lease renewal every few seconds, as their real counterparts would), so
that the draining worker does not declare them dead and take their running jobs back.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import psycopg
from psycopg import sql

from bench._pgwork_app import SCHEMA, bulk_load, settle
from bench._worker_process import WorkerProcess

__all__ = ["Drain", "draining"]

# Well within the 30 s after which a silent worker is dead and the loaded leases'
# minute: the loaded workers stay alive and keep their jobs.
KEEP_ALIVE_EVERY = 5.0

_KEEP_ALIVE = (
    "UPDATE {workers} SET heartbeat_at = now()"
    " WHERE status <> 'stopped' AND id LIKE 'sample-worker-%'",
    "UPDATE {jobs} SET leased_until = now() + interval '1 minute'"
    " WHERE status = 'running' AND leased_by LIKE 'sample-worker-%'",
)


@dataclass
class Drain:
    """The draining worker, as the bench reads it: jobs it handled, and when."""

    worker: WorkerProcess
    dsn: str
    started: float = 0.0

    @property
    def handled(self) -> int:
        return self.worker.count

    async def backlog(self) -> int:
        """Jobs of the backlog not yet finished."""
        query = sql.SQL(
            "SELECT count(*) FROM {} WHERE status IN ('pending', 'running') AND type_name = 'noop'"
        ).format(sql.Identifier(SCHEMA, "jobs"))
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            row = await (await conn.execute(query)).fetchone()
        return int(row[0]) if row else 0


async def _keep_alive(dsn: str) -> None:
    names = {"workers": sql.Identifier(SCHEMA, "workers"), "jobs": sql.Identifier(SCHEMA, "jobs")}
    statements = [sql.SQL(text).format(**names) for text in _KEEP_ALIVE]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while True:
            for statement in statements:
                await conn.execute(statement)
            await anyio.sleep(KEEP_ALIVE_EVERY)


async def _first_jobs(worker: WorkerProcess, timeout: float = 60.0) -> None:
    """Wait until the worker reports handled jobs (it reports its count every 0.1 s)."""
    for _ in range(int(timeout / 0.05)):
        if worker.count > 0:
            return
        await anyio.sleep(0.05)
    raise TimeoutError(f"the draining worker handled no job in {timeout:.0f} s")


@asynccontextmanager
async def draining(dsn: str, *, jobs: int, slots: int) -> AsyncIterator[Drain]:
    """Load ``jobs`` ready no-op jobs into ``dsn``, then yield while one worker process
    with ``slots`` slots drains them (from its first handled jobs on)."""
    await bulk_load(dsn, jobs)
    await settle(dsn)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_keep_alive, dsn)
        worker = await WorkerProcess.start(dsn, slots=slots)
        try:
            await worker.go()
            await _first_jobs(worker)
            yield Drain(worker=worker, dsn=dsn, started=time.perf_counter())
        finally:
            await worker.stop()
            tg.cancel_scope.cancel()
