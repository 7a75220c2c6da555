"""A worker killed between a hand-on's commit and its match loses nothing: the step
it wrote waits, the signal stays pending, and another worker's sweep (as it starts)
delivers it; the step runs once, and in atomic mode its effect commits once.

The victim (``_victim``) is a worker process whose match is a SIGKILL; the ledger
(``tests._victims``) counts what ran and what committed. The control build's second
worker sweeps nothing: the step then never starts.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any

import anyio
import pytest
from tests._victims import Ledger, killed
from tests.engine.conftest import eventually

from pgwork.worker._side.maintenance import Maintenance

from ._kit import Order, Shop, pending_signals, send, start_order, step_statuses
from ._victim import LEDGER, hand_on, ship

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

PROMPT = 10.0


@pytest.mark.parametrize("build", ["swept", "control-unswept"])
@pytest.mark.parametrize("mode", ["staged", "atomic"])
async def test_a_worker_killed_before_matching_its_hand_on_loses_nothing(
    pgwork_dsn: str,
    make_client: Any,
    workers: Any,
    mode: str,
    build: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ledger = Ledger(pgwork_dsn, LEDGER)
    await ledger.create()
    shop = Shop(order_mode=mode, ship_mode=mode)
    client = await make_client(shop.registry)
    await send(pgwork_dsn, client, shop, "k-1", 21)  # the signal is there first
    await start_order(pgwork_dsn, client, shop, Order(id="k-1"))

    assert await killed("tests.signals._victim", pgwork_dsn, mode, timeout=40) == -signal.SIGKILL
    # The hand-on committed; its match never ran.
    assert await step_statuses(pgwork_dsn, "payment:k-1") == ["blocked"]
    assert await pending_signals(pgwork_dsn) == ["payment:k-1"]
    assert await ledger.tally() == {"order": (1, 1)}

    if build == "control-unswept":

        async def nothing(self: Any) -> int:
            return 0

        monkeypatch.setattr(Maintenance, "sweep_signals", nothing)
    second = await workers(
        client=client,
        processors={shop.order: hand_on(pgwork_dsn, shop), shop.ship: ship(pgwork_dsn, shop)},
    )

    async def shipped() -> bool:
        return "ship" in await ledger.tally()

    with contextlib.suppress(AssertionError):
        await eventually(shipped, timeout=PROMPT, what="the step's run")
    if build == "control-unswept":
        assert not await shipped()
        assert await step_statuses(pgwork_dsn, "payment:k-1") == ["blocked"]
        return
    await anyio.sleep(1.0)  # room for a second run, should there be one
    assert await ledger.tally() == {"order": (1, 1), "ship": (1, 1)}
    if mode == "atomic":
        assert await ledger.tally(effects=True) == {"order": (1, 1), "ship": (1, 1)}
    assert second._maintenance.swept == 1  # delivered by the sweep
    assert second._matcher.delivered == 0
    assert await pending_signals(pgwork_dsn) == []
    assert await step_statuses(pgwork_dsn) == ["completed"]
