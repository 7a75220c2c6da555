"""Signals and waiting steps racing, with real workers and callers on connections of
their own: every waiting step gets exactly one signal, no signal goes to two steps,
whatever the order of the commits and the callers' isolation level."""

from __future__ import annotations

import dataclasses
import random
import re
from typing import Any
from uuid import UUID

import anyio
import psycopg
import pytest

from pgwork import Signalled

from ._kit import Order, Paid, Shipments, Shop, pending_signals, start_order, waiting

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

PROMPT = 10.0


async def _consumed(dsn: str) -> list[tuple[UUID, UUID]]:
    """(signal id, step id) of every consumed signal."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT id, consumed_by FROM pgwork.signals WHERE consumed_by IS NOT NULL"
        )
        return [(row[0], row[1]) for row in await cur.fetchall()]


async def _racing_senders(
    dsn: str, client: Any, shop: Shop, keys: list[str], level: psycopg.IsolationLevel
) -> list[UUID]:
    """Send one signal per key, each from a connection of its own at ``level``: every
    transaction first takes its snapshot (a read of the waiting steps), then signals a
    moment later, while steps are being written, and commits."""
    sent: list[UUID] = []
    conns = [await psycopg.AsyncConnection.connect(dsn) for _ in keys]
    rng = random.Random(7)
    try:

        async def one(conn: psycopg.AsyncConnection[Any], key: str, n: int) -> None:
            await conn.set_isolation_level(level)
            await conn.execute("SELECT count(*) FROM pgwork.jobs WHERE wait_signal IS NOT NULL")
            await anyio.sleep(rng.uniform(0, 0.3))
            sent.append(await client.signal(conn, shop.payment, key, Paid(amount=n)))
            await conn.commit()

        async with anyio.create_task_group() as group:
            for n, (conn, key) in enumerate(zip(conns, keys, strict=True)):
                group.start_soon(one, conn, key, n)
    finally:
        for conn in conns:
            await conn.close()
    return sent


@pytest.mark.parametrize("waiters", [1, 2])
async def test_two_signals_racing_to_one_name_each_go_to_one_waiter(
    pgwork_dsn: str, make_client: Any, workers: Any, waiters: int
) -> None:
    shop = Shop()
    client = await make_client(shop.registry)
    shipments = Shipments(shop.payment)
    await workers(client=client, processors={shop.order: shop.hand_on, shop.ship: shipments})
    for _ in range(waiters):
        await start_order(pgwork_dsn, client, shop, Order(id="race"))
    await waiting(pgwork_dsn, waiters)
    # Both transactions are open at once and commit together.
    async with (
        await psycopg.AsyncConnection.connect(pgwork_dsn) as first,
        await psycopg.AsyncConnection.connect(pgwork_dsn) as second,
    ):
        ids = [
            await client.signal(first, shop.payment, "race", Paid(amount=1)),
            await client.signal(second, shop.payment, "race", Paid(amount=2)),
        ]
        async with anyio.create_task_group() as group:
            group.start_soon(first.commit)
            group.start_soon(second.commit)
    assert await shipments.within(PROMPT, count=waiters)
    assert not await shipments.within(0.5, count=waiters + 1)
    consumed = await _consumed(pgwork_dsn)
    assert len(consumed) == waiters
    assert len({signal for signal, _ in consumed}) == waiters
    assert len({step for _, step in consumed}) == waiters
    assert {signal for signal, _ in consumed} <= set(ids)
    assert len(await pending_signals(pgwork_dsn)) == 2 - waiters
    # The oldest signal went to the oldest step (two steps released by one match run
    # in either order).
    _, got = min(shipments.runs, key=lambda run: run[0])
    assert isinstance(got, Signalled)
    assert got.payload.amount == 1, shipments.runs


# The match without what makes matches of one name take turns: no advisory lock (the
# sweep's taken out, a match's always "got"), and no row locks (a signal or a step
# another match took is not re-read).
_UNLOCKED = (
    b"SELECT 1 WHERE %(names)s::text[] IS NOT NULL",
    lambda probe: re.sub(rb"pg_try_advisory_xact_lock\([^)]*\)\)", b"true", probe),
    lambda match: match.replace(b"FOR UPDATE", b""),
)


def _unlocked(client: Any) -> None:
    statements = client.state.statements
    lock, always_got, strip = _UNLOCKED
    probe = always_got(statements.signals.matchable_names)
    assert probe != statements.signals.matchable_names
    signals = dataclasses.replace(
        statements.signals,
        lock_signal_names=lock,
        matchable_names=probe,
        match_signals=strip(statements.signals.match_signals),
    )
    client.state.statements = dataclasses.replace(statements, signals=signals)


async def _fifty(
    dsn: str,
    make_client: Any,
    workers: Any,
    level: psycopg.IsolationLevel,
    names: str,
    *,
    unlocked: bool = False,
) -> tuple[Shipments, list[UUID], list[Any]]:
    """50 orders started while 50 signals are sent for them, from connections of their
    own at ``level``, with three workers matching (each hears every signal): the steps
    that ran, the signals sent, the workers."""
    count = 50
    shop = Shop()
    client = await make_client(shop.registry)
    if unlocked:
        _unlocked(client)
    shipments = Shipments(shop.payment)
    started = [
        await workers(
            client=client, processors={shop.order: shop.hand_on, shop.ship: shipments}, max_slots=5
        )
        for _ in range(3)
    ]
    keys = ["shared"] * count if names == "one-name" else [f"k{n}" for n in range(count)]

    async def orders() -> None:
        for key in keys:
            await start_order(dsn, client, shop, Order(id=key))

    sent: list[UUID] = []

    async def signals() -> None:
        sent.extend(await _racing_senders(dsn, client, shop, keys, level))

    async with anyio.create_task_group() as group:
        group.start_soon(orders)
        group.start_soon(signals)
    await shipments.within(PROMPT + 20, count=count)
    await shipments.within(1.0, count=count + 1)  # any run beyond one per step
    return shipments, sent, started


@pytest.mark.parametrize(
    "level",
    [
        psycopg.IsolationLevel.READ_COMMITTED,
        psycopg.IsolationLevel.REPEATABLE_READ,
        psycopg.IsolationLevel.SERIALIZABLE,
    ],
    ids=["read-committed", "repeatable-read", "serializable"],
)
@pytest.mark.parametrize("names", ["one-name", "a-name-each"])
async def test_fifty_signals_and_fifty_waiters_each_step_gets_exactly_one(
    pgwork_dsn: str, make_client: Any, workers: Any, level: psycopg.IsolationLevel, names: str
) -> None:
    shipments, sent, started = await _fifty(pgwork_dsn, make_client, workers, level, names)
    assert len(shipments.runs) == 50, f"{len(shipments.runs)} runs of 50 steps"
    steps = [job_id for job_id, _ in shipments.runs]
    assert len(set(steps)) == 50  # each step ran once
    consumed = await _consumed(pgwork_dsn)
    assert sorted(signal for signal, _ in consumed) == sorted(sent)  # every signal, once
    assert sorted(step for _, step in consumed) == sorted(steps)  # one per step
    assert await pending_signals(pgwork_dsn) == []
    # Each step read its own order's signal, and the matches delivered each once.
    for step, got in shipments.runs:
        assert isinstance(got, Signalled)
        assert got.name == f"payment:{shipments.orders[step]}"
    assert sum(w._matcher.delivered + w._maintenance.swept for w in started) == 50


async def test_control_matches_that_do_not_take_turns_deliver_signals_twice(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    _, _, started = await _fifty(
        pgwork_dsn,
        make_client,
        workers,
        psycopg.IsolationLevel.READ_COMMITTED,
        "one-name",
        unlocked=True,
    )
    delivered = sum(w._matcher.delivered + w._maintenance.swept for w in started)
    # Two workers matching the name at once both pair the same signal and step.
    assert delivered > 50, f"{delivered} deliveries of 50 signals: the control saw no race"
