"""A worker process killed in the middle of a fan-out:
``python -m tests.fan_out._victim DSN MODE POINT [control]`` (MODE: ``staged`` or
``atomic``).

It runs the fan-out of ``_kit`` (every type in MODE, leases of ``LEASE_S``) with the
ledger handlers (``_ledger``), and dies by SIGKILL at POINT:

- ``completion``: inside the transaction that completes ``split``, once its children
  are written and before the step blocked on them (the state adapter's
  ``_check_blockers``): nothing of that transaction commits;
- ``settle``: right after a child's end committed, before it is settled on the step
  (``resolve_dependants``).

With ``control`` (at ``completion``), a broken build writes the children in a
transaction of their own, committed before the completion's: the kill then leaves them
behind. Prints ``ready`` once the worker runs.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from pgwork import (
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
)

from ._kit import FanOut
from ._ledger import handlers

LEASE_S = 1.5


async def _die(self: Any, *args: Any, **kwargs: Any) -> Any:
    os.kill(os.getpid(), signal.SIGKILL)


_resolve = PostgresStateAdapter.resolve_dependants


async def _die_settling(self: Any, tx: Any, *, chain_ids: Any) -> Any:
    """Die when asked to settle an end (every completion asks, mostly for none)."""
    if chain_ids:
        os.kill(os.getpid(), signal.SIGKILL)
    return await _resolve(self, tx, chain_ids=chain_ids)


def _children_apart() -> None:
    """The control build: children (new chains of ``part``) committed on their own."""
    insert = PostgresStateAdapter.insert_jobs

    async def insert_jobs(self: Any, tx: Any, *, jobs: Any, notify: Any = None) -> Any:
        jobs = list(jobs)
        if jobs and all(job.type_name == "part" and job.id == job.chain_id for job in jobs):
            async with self.transaction() as own:
                return await insert(self, own, jobs=jobs, notify=notify)
        return await insert(self, tx, jobs=jobs, notify=notify)

    PostgresStateAdapter.insert_jobs = insert_jobs  # type: ignore[method-assign]


async def main(dsn: str, mode: str, point: str, control: bool) -> None:
    if control:
        _children_apart()
    if point == "completion":
        PostgresStateAdapter._check_blockers = _die  # type: ignore[method-assign]
    else:
        PostgresStateAdapter.resolve_dependants = _die_settling  # type: ignore[method-assign]
    fan = FanOut(
        split_mode=mode, part_mode=mode, collect_mode=mode, lease_s=LEASE_S, part_attempts=3
    )  # type: ignore[arg-type]
    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(dsn),
        notify_adapter=PostgresNotifyAdapter(dsn),
        registry=fan.registry,
    )
    processors = handlers(dsn, fan)
    if point == "settle":
        del processors[fan.split]  # the test's first worker fanned out already
    worker = create_in_process_worker(
        client=client, processors=processors, poll_interval=0.2, max_slots=4
    )
    async with worker:
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], "control" in sys.argv[4:]))
