"""Four workers hear every signal notice; only a name with something to pair costs a
match transaction.

Four workers run the shop's types (``order`` hands on atomically, so its commit sends
a ``signal`` notice to every worker). Three notices in turn, each heard by all four
(every worker's matcher is asked once per notice): a signal to a name nothing waits
for, a step handed on to a name no signal was sent to, then the signal that step waits
for. The match transactions are counted by their locking statement
(``lock_signal_names``, the first of each). The first two pair nothing: no worker opens
a transaction for them, the probe before a match finding nothing to pair. The third is
matched once, delivered once. The control build matches without the probe: every
worker runs a transaction for every notice, twelve in all, eleven of which pair nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.engine.conftest import eventually

from pgwork import InProcessWorker
from pgwork.postgres._signals import SignalOps
from pgwork.postgres.state import PostgresStateAdapter

from ._kit import Order, Shipments, Shop, pending_signals, send, start_order, waiting

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

WORKERS = 4


class Counted:
    """Counts the match transactions the state adapters run (each begins with the names'
    locks)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.transactions = 0
        fetch = PostgresStateAdapter._fetch

        async def counting(self_: Any, conn: Any, query: bytes, params: Any) -> Any:
            if query == self_.statements.signals.lock_signal_names:
                self.transactions += 1
            return await fetch(self_, conn, query, params)

        monkeypatch.setattr(PostgresStateAdapter, "_fetch", counting)


async def _unprobed(self: Any, *, names: Any, limit: int = 100) -> Any:
    """The control build: every match takes its transaction and its locks."""
    if not names:
        return await SignalOps.match_signals(self, names=names, limit=limit)
    async with self._pooled() as conn:
        return await self._match_locked(conn, list(names), limit)


async def _heard(workers: list[InProcessWorker], times: int) -> None:
    """Return once every worker's matcher was asked ``times`` times, and is done."""

    async def asked() -> bool:
        return all(w._matcher is not None and w._matcher.matches >= times for w in workers)

    await eventually(asked, what=f"every worker's match #{times}")
    for worker in workers:
        assert worker._matcher is not None
        assert worker._matcher.matches == times  # one notice, one match asked for
        await worker._matcher.flush()


@pytest.mark.parametrize("build", ["probed", "control-unprobed"])
async def test_notices_with_nothing_to_pair_cost_no_match_transaction(
    pgwork_dsn: str, make_client: Any, workers: Any, build: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if build.startswith("control"):
        monkeypatch.setattr(PostgresStateAdapter, "match_signals", _unprobed)
    shop = Shop(order_mode="atomic")
    shipments = Shipments(shop.payment)
    client = await make_client(shop.registry)
    running = [
        await workers(client=client, processors={shop.order: shop.hand_on, shop.ship: shipments})
        for _ in range(WORKERS)
    ]
    counted = Counted(monkeypatch)
    spent: list[int] = []

    await send(pgwork_dsn, client, shop, "nobody", 1)  # nothing waits for it
    await _heard(running, 1)
    spent.append(counted.transactions)

    await start_order(pgwork_dsn, client, shop, Order(id="k"))  # no signal for it yet
    await waiting(pgwork_dsn, 1)
    await _heard(running, 2)
    spent.append(counted.transactions - sum(spent))

    await send(pgwork_dsn, client, shop, "k", 2)
    await _heard(running, 3)
    spent.append(counted.transactions - sum(spent))

    assert await shipments.within(10)
    assert shipments.amounts == [2]
    assert sum(w._matcher.delivered for w in running if w._matcher is not None) == 1
    assert await pending_signals(pgwork_dsn) == ["payment:nobody"]
    if build.startswith("control"):
        assert spent == [WORKERS, WORKERS, WORKERS]
        return
    assert spent[:2] == [0, 0]
    # At least the match that paired it; another worker's probe may have run before
    # that match committed, and its match then found the pair taken.
    assert 1 <= spent[2] <= WORKERS, spent
