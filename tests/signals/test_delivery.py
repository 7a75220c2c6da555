"""A step that waits for a signal, with a real worker: the signal's transaction
decides, a signal sent first is kept, a timeout starts the step without one, and
signals to one name queue."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from pgwork import Signalled, TimedOut

from ._kit import (
    Order,
    Shipments,
    Shop,
    pending_signals,
    send,
    start_order,
    step_statuses,
    waiting,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

# How long a test waits for a step it expects to start: room for a loaded machine.
# (The wake-up by notification, without the poll, is tests/signals/test_wakeups.py's.)
PROMPT = 5.0


async def _shop_with_worker(
    make_client: Any, workers: Any, **modes: str
) -> tuple[Any, Shop, Shipments]:
    shop = Shop(**modes)
    client = await make_client(shop.registry)
    shipments = Shipments(shop.payment)
    await workers(client=client, processors={shop.order: shop.hand_on, shop.ship: shipments})
    return client, shop, shipments


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
async def test_the_signalling_transaction_decides_whether_the_step_starts(
    pgwork_dsn: str, make_client: Any, workers: Any, outcome: str
) -> None:
    client, shop, shipments = await _shop_with_worker(make_client, workers)
    await start_order(pgwork_dsn, client, shop, Order(id="o-1"))
    await waiting(pgwork_dsn, 1)
    await send(pgwork_dsn, client, shop, "o-1", 42, commit=outcome == "commit")
    if outcome == "commit":
        assert await shipments.within(PROMPT)
        assert shipments.amounts == [42]
        assert await step_statuses(pgwork_dsn) in (["running"], ["completed"])
        assert await pending_signals(pgwork_dsn) == []
    else:
        assert not await shipments.within(1.0)
        assert await step_statuses(pgwork_dsn) == ["blocked"]
        assert await pending_signals(pgwork_dsn) == []
        # The step still waits: a signal that commits starts it.
        await send(pgwork_dsn, client, shop, "o-1", 7)
        assert await shipments.within(PROMPT)
        assert shipments.amounts == [7]


async def test_a_signal_sent_before_anything_waits_is_taken_by_the_first_waiter(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    client, shop, shipments = await _shop_with_worker(make_client, workers)
    await send(pgwork_dsn, client, shop, "o-2", 5)
    await send(pgwork_dsn, client, shop, "elsewhere", 6)  # a name nothing waits for
    assert await pending_signals(pgwork_dsn) == ["payment:o-2", "payment:elsewhere"]
    await start_order(pgwork_dsn, client, shop, Order(id="o-2"))
    assert await shipments.within(PROMPT)
    assert shipments.amounts == [5]
    assert await pending_signals(pgwork_dsn) == ["payment:elsewhere"]


async def test_a_step_whose_timeout_passes_starts_timed_out_and_a_later_signal_is_kept(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    client, shop, shipments = await _shop_with_worker(make_client, workers)
    await start_order(pgwork_dsn, client, shop, Order(id="o-3", timeout_s=0.5))
    assert await shipments.within(PROMPT)
    [(_, got)] = shipments.runs
    assert isinstance(got, TimedOut)
    assert got.timed_out
    # Too late for that step: kept for the next one that waits for the name.
    await send(pgwork_dsn, client, shop, "o-3", 9)
    assert await pending_signals(pgwork_dsn) == ["payment:o-3"]
    await start_order(pgwork_dsn, client, shop, Order(id="o-3"))
    assert await shipments.within(PROMPT, count=2)
    assert shipments.amounts == [None, 9]
    assert await pending_signals(pgwork_dsn) == []


async def test_two_signals_to_one_name_queue_for_one_waiter_then_the_next(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    client, shop, shipments = await _shop_with_worker(make_client, workers)
    await start_order(pgwork_dsn, client, shop, Order(id="o-4"))
    await waiting(pgwork_dsn, 1)
    await send(pgwork_dsn, client, shop, "o-4", 1)
    await send(pgwork_dsn, client, shop, "o-4", 2)
    assert await shipments.within(PROMPT)
    assert shipments.amounts == [1]  # the oldest signal to the one waiter
    assert not await shipments.within(0.5, count=2)
    assert await pending_signals(pgwork_dsn) == ["payment:o-4"]
    await start_order(pgwork_dsn, client, shop, Order(id="o-4"))
    assert await shipments.within(PROMPT, count=2)
    assert shipments.amounts == [1, 2]
    assert len({job_id for job_id, _ in shipments.runs}) == 2


async def test_a_step_reads_the_same_signal_on_every_attempt(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    shop = Shop()
    client = await make_client(shop.registry)
    seen: list[Any] = []
    retried = anyio.Event()

    async def flaky(attempt: Any) -> None:
        seen.append(await attempt.received(shop.payment))
        if attempt.job.attempt == 1:
            raise RuntimeError("the first attempt fails")
        retried.set()

    await workers(client=client, processors={shop.order: shop.hand_on, shop.ship: flaky})
    await send(pgwork_dsn, client, shop, "o-5", 3)
    await start_order(pgwork_dsn, client, shop, Order(id="o-5"))
    with anyio.fail_after(PROMPT + 10):  # the first attempt's backoff included
        await retried.wait()
    assert [got.payload.amount for got in seen if isinstance(got, Signalled)] == [3, 3]
