"""A worker process that dies between a hand-on's commit and its match:
``python -m tests.signals._victim DSN MODE`` (MODE: ``staged`` or ``atomic``).

It runs both steps of the shop (``_kit``) in MODE, with the ledger handlers
(``_ledger``). The state adapter's ``match_signals`` is replaced by a SIGKILL of the
process: the first match it asks for (right after a staged hand-on committed, or on
the notice an atomic hand-on's commit sends) kills it, the step written and its name
never matched. Prints ``ready`` once the worker runs.
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

from ._kit import Shop
from ._ledger import hand_on, ship


async def _die(self: Any, **kwargs: Any) -> Any:
    os.kill(os.getpid(), signal.SIGKILL)


async def main(dsn: str, mode: str) -> None:
    PostgresStateAdapter.match_signals = _die  # type: ignore[method-assign]
    shop = Shop(order_mode=mode, ship_mode=mode)
    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(dsn),
        notify_adapter=PostgresNotifyAdapter(dsn),
        registry=shop.registry,
    )
    worker = create_in_process_worker(
        client=client,
        processors={shop.order: hand_on(dsn, shop), shop.ship: ship(dsn, shop)},
        poll_interval=0.2,
    )
    async with worker:
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
