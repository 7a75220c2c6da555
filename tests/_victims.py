"""What the worker-killed scenarios share: a *ledger* of the attempts, and a worker
process (a *victim*) run until it dies by SIGKILL at the point its module chose.

A ledger is two tables named after its scenario. Each attempt writes a row to
``<name>_ledger`` on a connection of its own, in autocommit: it survives whatever
happens to the attempt, so it counts executions. An atomic attempt also writes a row
to ``<name>_effects`` through ``attempt.connection``, which commits with its job's
completion or not at all: two rows for one job would be a duplicate effect.

A victim is a module run with ``python -m``: it replaces the state adapter's method at
its kill point with ``die``, builds its worker and hands it to ``serve``, which says
``ready`` once the worker runs. The test runs it with ``killed`` and reads the ledger
the victim wrote with ``Ledger.tally``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

import anyio
import psycopg

from pgwork import Attempt, InProcessWorker

__all__ = ["Ledger", "die", "killed", "serve"]

REPO = Path(__file__).resolve().parents[1]


class Ledger:
    """The ledger of the scenario ``name`` (its tables ``<name>_ledger`` and
    ``<name>_effects``) in the database at ``dsn``."""

    def __init__(self, dsn: str, name: str) -> None:
        self.dsn = dsn
        self.executions = f"{name}_ledger"
        self.effects = f"{name}_effects"

    async def create(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            for table in (self.executions, self.effects):
                await conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {table}"
                    " (job_id uuid NOT NULL, type_name text NOT NULL)"
                )

    async def record(self, attempt: Attempt[Any, Any]) -> None:
        """Write the attempt's execution, and (atomic) its effect."""
        row = (attempt.job.id, attempt.job.type_name)
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as own:
            await own.execute(f"INSERT INTO {self.executions} VALUES (%s, %s)", row)
        if attempt.connection is not None:
            await attempt.connection.execute(f"INSERT INTO {self.effects} VALUES (%s, %s)", row)

    async def tally(self, *, effects: bool = False) -> dict[str, tuple[int, int]]:
        """Per job type: (rows, distinct jobs) of the executions, or of the effects."""
        table = self.effects if effects else self.executions
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            cur = await conn.execute(
                f"SELECT type_name, count(*), count(DISTINCT job_id) FROM {table} GROUP BY 1"
            )
            return {name: (count, distinct) for name, count, distinct in await cur.fetchall()}


def die(*args: Any, **kwargs: Any) -> NoReturn:
    """The kill point: SIGKILL this process, whatever was asked of it."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: the process was killed")


async def serve(worker: InProcessWorker) -> None:
    """Run ``worker`` until the process is killed; say ``ready`` once it runs."""
    async with worker:
        print("ready", flush=True)
        await asyncio.Event().wait()


async def killed(module: str, *args: str, timeout: float) -> int:
    """Run the victim ``module`` with ``args`` until it dies (within ``timeout``
    seconds, else it is killed); its return code. It must have said ``ready``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        await anyio.to_thread.run_sync(proc.wait, timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
        output = proc.communicate()[0]
    assert "ready" in output, output
    return proc.returncode
