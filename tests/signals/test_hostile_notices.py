"""No ``signal`` notice can stop a worker or hold up a real signal.

Anyone who can connect may NOTIFY on a schema's channel. Malformed ``signal`` payloads
are dropped where they are decoded; well-formed ones for names nothing waits for (or
for signal types the worker's job types do not wait for) cost at most a match that
finds nothing. Either way a real signal sent afterwards still starts its step by
notification (the worker polls every 30 s and its sweep runs every 30 s).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from tests.adapters._brokers import redis_url, unique_name
from tests.engine._wakeup_kit import PROMPT

from pgwork import (
    InProcessNotifyAdapter,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
)
from pgwork.adapters.notify import Notice
from pgwork.notify.redis import RedisNotifyAdapter
from pgwork.postgres.notify import decode_notice, encode_notice

from ._kit import Order, Shipments, Shop, send, start_order, waiting

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

MALFORMED = [
    "signal|||||",  # no name
    "signal|00000000-0000-0000-0000-000000000001||||payment:x",  # a job id
    "signal||||1.5|payment:x",  # a due time
    "signal|||cancelled||payment:x",  # a reason
    "signal",
    "signal|payment:x",
]


def test_a_signal_notice_decodes_to_its_name_and_nothing_else() -> None:
    name = "payment:order | with bars"
    assert decode_notice(encode_notice(Notice(kind="signal", name=name))) == Notice(
        kind="signal", name=name
    )
    for payload in MALFORMED:
        assert decode_notice(payload) is None, payload


async def _notify(dsn: str, payloads: list[str]) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p",
            (PostgresNotifyAdapter(dsn).channel, payloads),
        )


async def test_a_worker_ignores_signal_notices_it_cannot_use_and_still_delivers(
    pgwork_dsn: str, clients: Any, start_worker: Any
) -> None:
    shop = Shop()
    shipments = Shipments(shop.payment)
    client = await clients(shop.registry)
    worker = await start_worker(
        client=client, processors={shop.order: shop.hand_on, shop.ship: shipments}
    )
    await start_order(pgwork_dsn, client, shop, Order(id="h-1"))
    await waiting(pgwork_dsn, 1)
    flood = [f"signal|||||payment:nobody-{n}" for n in range(500)]  # nothing waits
    flood += [f"signal|||||refund:{n}" for n in range(100)]  # a type nobody waits for
    await _notify(pgwork_dsn, MALFORMED + flood)
    await send(pgwork_dsn, client, shop, "h-1", 3)
    assert await shipments.within(PROMPT)
    assert shipments.amounts == [3]
    assert worker._matcher.delivered == 1


async def test_a_worker_ignores_undecoded_signal_notices_from_the_in_process_adapter(
    pgwork_dsn: str, start_worker: Any
) -> None:
    shop = Shop()
    notify = InProcessNotifyAdapter()
    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(pgwork_dsn),
        notify_adapter=notify,
        registry=shop.registry,
    )
    shipments = Shipments(shop.payment)
    worker = await start_worker(
        client=client, processors={shop.order: shop.hand_on, shop.ship: shipments}
    )
    try:
        await notify.publish(
            None,
            notices=[
                Notice(kind="signal"),
                Notice(kind="signal", name=12),  # type: ignore[arg-type]
                Notice(kind="signal", queue="payment:h-2"),
            ],
        )
        await start_order(pgwork_dsn, client, shop, Order(id="h-2"))
        await notify.publish(None, notices=[Notice(kind="ready", queue="default")])
        await waiting(pgwork_dsn, 1)
        await send(pgwork_dsn, client, shop, "h-2", 4)
        # This adapter delivers at once, before the signal commits: say it again after.
        await notify.publish(None, notices=[Notice(kind="signal", name="payment:h-2")])
        assert await shipments.within(PROMPT)
        assert shipments.amounts == [4]
    finally:
        await worker.stop(grace_period=0)
        await client.close()


@pytest.mark.parametrize("transport", ["in-process", "redis"])
async def test_a_signal_name_no_database_can_hold_holds_up_no_real_signal(
    pgwork_dsn: str, start_worker: Any, transport: str
) -> None:
    """Names with a NUL character or a lone surrogate (a JSON message on a broker can
    carry either; no statement can): a match that asked for them would fail however
    often it was tried, and every name batched with them with it."""
    shop = Shop()
    notify: Any = (
        InProcessNotifyAdapter()
        if transport == "in-process"
        else RedisNotifyAdapter(redis_url(), channel=unique_name("pgwork-signals"))
    )
    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(pgwork_dsn),
        notify_adapter=notify,
        registry=shop.registry,
    )
    shipments = Shipments(shop.payment)
    worker = await start_worker(
        client=client, processors={shop.order: shop.hand_on, shop.ship: shipments}
    )
    try:
        await start_order(pgwork_dsn, client, shop, Order(id="h-3"))
        if transport == "in-process":
            await notify.publish(None, notices=[Notice(kind="ready", queue="default")])
        await waiting(pgwork_dsn, 1)
        await notify.publish(
            None,
            notices=[
                Notice(kind="signal", name="payment:h-3\x00"),
                Notice(kind="signal", name="payment:\ud800"),
            ],
        )
        await send(pgwork_dsn, client, shop, "h-3", 5)
        # Said again after the commit (an adapter that cannot see it may be early).
        await notify.publish(None, notices=[Notice(kind="signal", name="payment:h-3")])
        assert await shipments.within(PROMPT)
        assert shipments.amounts == [5]
    finally:
        await worker.stop(grace_period=0)
        await client.close()
