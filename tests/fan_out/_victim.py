"""A worker process killed in the middle of a fan-out:
``python -m tests.fan_out._victim DSN MODE POINT [control]`` (MODE: ``staged`` or
``atomic``).

It runs the fan-out of ``_kit`` (every type in MODE, leases of ``LEASE_S``) with the
handlers of ``handlers``, each recording its attempt in the ledger ``fan`` (the shared
kit, ``tests._victims``), and dies by SIGKILL at POINT:

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
import sys
from typing import Any, cast

from tests._victims import Ledger, die, serve

from pgwork import (
    Attempt,
    Continue,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
)
from pgwork.job_types import ProcessingMode

from ._kit import Batch, Done, FanOut, Part, Summary, children_apart

__all__ = ["LEASE_S", "LEDGER", "handlers"]

LEASE_S = 1.5
LEDGER = "fan"


def handlers(dsn: str, fan: FanOut) -> dict[Any, Any]:
    """``fan``'s handlers, each recording its attempt in the ledger first."""
    ledger = Ledger(dsn, LEDGER)

    async def split(attempt: Attempt[Batch, Any]) -> Continue[Batch]:
        await ledger.record(attempt)
        return await fan.do_split(attempt)

    async def part(attempt: Attempt[Part, Done]) -> Done:
        await ledger.record(attempt)
        return await fan.do_part(attempt)

    async def collect(attempt: Attempt[Batch, Summary]) -> Summary:
        await ledger.record(attempt)
        return await fan.do_collect(attempt)

    return {fan.split: split, fan.part: part, fan.collect: collect}


_resolve = PostgresStateAdapter.resolve_dependants


async def _die_settling(self: Any, tx: Any, *, chain_ids: Any) -> Any:
    """Die when asked to settle an end (every completion asks, mostly for none)."""
    if chain_ids:
        die()
    return await _resolve(self, tx, chain_ids=chain_ids)


async def main(dsn: str, mode: str, point: str, control: bool) -> None:
    if control:
        PostgresStateAdapter.insert_jobs = children_apart()  # type: ignore[method-assign]
    if point == "completion":
        PostgresStateAdapter._check_blockers = die  # type: ignore[method-assign]
    else:
        PostgresStateAdapter.resolve_dependants = _die_settling  # type: ignore[method-assign]
    kind = cast("ProcessingMode", mode)
    fan = FanOut(
        split_mode=kind, part_mode=kind, collect_mode=kind, lease_s=LEASE_S, part_attempts=3
    )
    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(dsn),
        notify_adapter=PostgresNotifyAdapter(dsn),
        registry=fan.registry,
    )
    processors = handlers(dsn, fan)
    if point == "settle":
        del processors[fan.split]  # the test's first worker fanned out already
    await serve(
        create_in_process_worker(
            client=client, processors=processors, poll_interval=0.2, max_slots=4
        )
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], "control" in sys.argv[4:]))
