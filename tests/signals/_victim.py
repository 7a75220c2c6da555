"""A worker process that dies between a hand-on's commit and its match:
``python -m tests.signals._victim DSN MODE`` (MODE: ``staged`` or ``atomic``).

It runs both steps of the shop (``_kit``) in MODE, with the handlers of ``hand_on``
and ``ship``, each recording its attempt in the ledger ``signal`` (the shared kit,
``tests._victims``). The state adapter's ``match_signals`` is replaced by a SIGKILL of
the process: the first match it asks for (right after a staged hand-on committed, or
on the notice an atomic hand-on's commit sends) kills it, the step written and its
name never matched. Prints ``ready`` once the worker runs.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from tests._victims import Ledger, die, serve

from pgwork import (
    Attempt,
    Continue,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
)

from ._kit import Order, Shop

__all__ = ["LEDGER", "hand_on", "ship"]

LEDGER = "signal"


def hand_on(dsn: str, shop: Shop) -> Any:
    """``order``'s handler: records its attempt, then hands on to the waiting step."""
    ledger = Ledger(dsn, LEDGER)

    async def handler(attempt: Attempt[Order, Any]) -> Continue[Order]:
        await ledger.record(attempt)
        return await shop.hand_on(attempt)

    return handler


def ship(dsn: str, shop: Shop) -> Any:
    """``ship``'s handler: reads its payment, then records its attempt."""
    ledger = Ledger(dsn, LEDGER)

    async def handler(attempt: Attempt[Order, Any]) -> None:
        await attempt.received(shop.payment)
        await ledger.record(attempt)

    return handler


async def main(dsn: str, mode: str) -> None:
    PostgresStateAdapter.match_signals = die  # type: ignore[method-assign]
    shop = Shop(order_mode=mode, ship_mode=mode)
    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(dsn),
        notify_adapter=PostgresNotifyAdapter(dsn),
        registry=shop.registry,
    )
    await serve(
        create_in_process_worker(
            client=client,
            processors={shop.order: hand_on(dsn, shop), shop.ship: ship(dsn, shop)},
            poll_interval=0.2,
        )
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
