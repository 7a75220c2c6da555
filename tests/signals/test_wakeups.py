"""A signal starts its step within milliseconds, by notification, never by the poll.

Every worker here polls every 30 s, and its maintenance sweeps for unmatched signals
only at start and every 30 s: a step that starts within a few seconds was matched on a
notice (or right after its worker's hand-on) and announced to its queue. Each
mechanism has a control build with it taken out (a listener deaf to ``signal``
notices, a match that announces nothing, a hand-on that asks for no match), and the
control's step must not start in that time; the counts say which path ran.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import psycopg
import pytest
from tests.engine._wakeup_kit import PROMPT
from tests.engine.conftest import eventually

from pgwork.adapters.notify import Notice
from pgwork.adapters.state import SignalMatch
from pgwork.postgres.sql.signals import SIGNAL_LOCK
from pgwork.postgres.state import PostgresStateAdapter
from pgwork.worker import _signals as worker_signals

from ._kit import Order, Shipments, Shop, pending_signals, send, start_order, step_statuses, waiting

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def no_signal(notice: Notice) -> bool:
    return notice.kind == "signal"


async def _worker(clients: Any, start_worker: Any, shop: Shop, **options: Any) -> tuple[Any, Any]:
    """A 30 s-poll worker running both steps of the shop; its client and itself."""
    shipments = Shipments(shop.payment)
    client = await clients(shop.registry, drop=options.pop("drop", None))
    worker = await start_worker(
        client=client, processors={shop.order: shop.hand_on, shop.ship: shipments}, **options
    )
    worker.shipments = shipments
    return client, worker


async def _ordered(dsn: str, client: Any, shop: Shop, worker: Any, key: str) -> None:
    """Start an order, and return once its step waits and the worker is idle again."""
    await start_order(dsn, client, shop, Order(id=key))
    await waiting(dsn, 1)
    await worker._matcher.flush()


@pytest.mark.parametrize("build", ["notified", "control-deaf"])
async def test_a_signal_starts_its_step_by_notification(
    pgwork_dsn: str, clients: Any, start_worker: Any, build: str
) -> None:
    shop = Shop()
    drop = None if build == "notified" else no_signal
    client, worker = await _worker(clients, start_worker, shop, drop=drop)
    await _ordered(pgwork_dsn, client, shop, worker, "w-1")
    await send(pgwork_dsn, client, shop, "w-1", 11)
    started = await worker.shipments.within(PROMPT)
    assert started is (build == "notified")
    assert worker._maintenance.swept == 0  # not the sweep
    if build == "notified":
        assert worker.shipments.amounts == [11]
        assert worker._matcher.delivered == 1
    else:
        assert worker._matcher.delivered == 0
        assert await step_statuses(pgwork_dsn) == ["blocked"]
        assert await pending_signals(pgwork_dsn) == ["payment:w-1"]


@pytest.mark.parametrize("build", ["announced", "control-unannounced"])
async def test_a_matched_step_is_announced_to_the_worker_of_its_queue(
    pgwork_dsn: str,
    clients: Any,
    start_worker: Any,
    build: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if build == "control-unannounced":

        async def silent(*args: Any, **kwargs: Any) -> None:
            return None

        monkeypatch.setattr(worker_signals, "announce_ready", silent)
    shop = Shop()
    client, worker = await _worker(clients, start_worker, shop)
    await _ordered(pgwork_dsn, client, shop, worker, "w-2")
    await send(pgwork_dsn, client, shop, "w-2", 12)
    started = await worker.shipments.within(PROMPT)
    assert started is (build == "announced")
    # Matched on its notice either way: only the announcement differs.
    assert worker._matcher.delivered == 1
    assert await pending_signals(pgwork_dsn) == []
    if build == "control-unannounced":
        assert await step_statuses(pgwork_dsn) == ["pending"]


@pytest.mark.parametrize("build", ["matched", "control-unmatched"])
async def test_a_hand_on_matches_the_signal_that_came_first(
    pgwork_dsn: str, clients: Any, start_worker: Any, build: str
) -> None:
    shop = Shop()
    client, worker = await _worker(clients, start_worker, shop)
    if build == "control-unmatched":
        # The hand-on no longer asks for its step's name to be matched.
        worker._slots.runner.steps._matcher = types.SimpleNamespace(want=lambda names: None)
    await send(pgwork_dsn, client, shop, "w-3", 13)
    await worker._matcher.flush()  # its notice matched nothing: no step yet
    assert worker._matcher.delivered == 0
    await start_order(pgwork_dsn, client, shop, Order(id="w-3"))
    started = await worker.shipments.within(PROMPT)
    assert started is (build == "matched")
    assert worker._maintenance.swept == 0
    if build == "matched":
        assert worker.shipments.amounts == [13]
        assert worker._matcher.delivered == 1
    else:
        assert await step_statuses(pgwork_dsn) == ["blocked"]
        assert await pending_signals(pgwork_dsn) == ["payment:w-3"]


@pytest.mark.parametrize("build", ["notified", "control-deaf"])
async def test_an_atomic_hand_on_is_matched_by_the_notice_its_commit_sends(
    pgwork_dsn: str, clients: Any, start_worker: Any, build: str
) -> None:
    shop = Shop(order_mode="atomic")
    drop = None if build == "notified" else no_signal
    client, worker = await _worker(clients, start_worker, shop, drop=drop)
    await send(pgwork_dsn, client, shop, "w-4", 14)
    await worker._matcher.flush()
    await start_order(pgwork_dsn, client, shop, Order(id="w-4"))
    started = await worker.shipments.within(PROMPT)
    assert started is (build == "notified")
    assert worker._maintenance.swept == 0
    if build == "control-deaf":
        assert await step_statuses(pgwork_dsn) == ["blocked"]


@pytest.mark.parametrize("build", ["asked-again", "control-dropped"])
async def test_a_name_another_match_held_is_asked_for_again_and_delivered(
    pgwork_dsn: str,
    clients: Any,
    start_worker: Any,
    build: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another worker's match holds the name when the signal's notice comes (its
    snapshot may predate the signal): the worker finds the name busy, and asks for it
    again until that match ended, then delivers it. The control forgets a busy name."""
    dropped: list[str] = []
    if build == "control-dropped":
        match_signals = PostgresStateAdapter.match_signals

        async def forgetful(self: Any, **kwargs: Any) -> SignalMatch:
            match = await match_signals(self, **kwargs)
            dropped.extend(match.busy)
            return dataclasses.replace(match, busy=())

        monkeypatch.setattr(PostgresStateAdapter, "match_signals", forgetful)
    shop = Shop()
    client, worker = await _worker(clients, start_worker, shop)
    await _ordered(pgwork_dsn, client, shop, worker, "w-5")
    asked = worker._matcher.matches
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as holder:
        await holder.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext('payment:w-5'))", (SIGNAL_LOCK,)
        )
        await send(pgwork_dsn, client, shop, "w-5", 15)

        async def matched() -> bool:
            # Its notice matched: the name found busy (left so by the control).
            found = worker._matcher.busy > 0 or bool(dropped)
            return worker._matcher.matches > asked and found

        await eventually(matched, what="the worker finding the name busy")
        assert await step_statuses(pgwork_dsn) == ["blocked"]
        await holder.rollback()
    started = await worker.shipments.within(PROMPT)
    assert started is (build == "asked-again")
    assert worker._maintenance.swept == 0
    if build == "asked-again":
        assert worker.shipments.amounts == [15]
    else:
        assert await pending_signals(pgwork_dsn) == ["payment:w-5"]
