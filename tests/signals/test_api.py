"""The signal API's edges: what is refused before any statement (and leaves the
caller's transaction usable), the blocking twins, a hand-on from outside any worker,
and a store without ``ChainSignals``."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any
from uuid import UUID

import anyio
import psycopg
import pytest
from tests._core_only import CoreOnly
from tests.engine.conftest import eventually

from pgwork import (
    CapabilityMissingError,
    ConfigurationError,
    Continue,
    DuplicateSignalTypeError,
    InvalidOptionError,
    JobStatus,
    JobTypeRegistry,
    PayloadValidationError,
    Signalled,
    SyncAttempt,
    UnknownSignalTypeError,
    WaitNotDeclaredError,
    create_in_process_worker,
)

from ._kit import Order, Paid, Shipments, Shop, pending_signals, send, start_order, waiting

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

PROMPT = 10.0


def test_signal_types_and_waits_are_checked_where_they_are_declared() -> None:
    registry = JobTypeRegistry()
    payment = registry.signal("payment", payload=Paid)
    with pytest.raises(ConfigurationError, match="no ':'"):
        registry.signal("pay:ment", payload=Paid)
    with pytest.raises(DuplicateSignalTypeError):
        registry.signal("payment", payload=Paid)
    other = JobTypeRegistry().signal("refund", payload=Paid)
    with pytest.raises(UnknownSignalTypeError, match="refund"):
        registry.job_type("refunded", input=Order, waits_for=other)
    assert payment.named(7).name == "payment:7"
    assert payment.named(UUID(int=1)).name == f"payment:{UUID(int=1)}"
    assert payment.named().name == "payment"
    for key in ("", "x" * 201, True, 1.5, "nul\x00", 10**200, 10**5000):
        with pytest.raises(InvalidOptionError, match="key"):
            payment.named(key)  # type: ignore[arg-type]
    for timeout in (timedelta(0), timedelta(seconds=-1)):
        with pytest.raises(InvalidOptionError, match="timeout"):
            payment.named("k", timeout=timeout)
    ship = registry.job_type("ship", input=Order, entry=False, waits_for=payment)
    with pytest.raises(ConfigurationError, match="not both"):
        Continue(ship, Order(id="1"), after=timedelta(seconds=1), wait_for=payment.named("1"))  # type: ignore[call-overload]


async def test_a_bad_signal_is_refused_before_any_statement(
    make_client: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    shop = Shop()
    client = await make_client(shop.registry)
    stranger = JobTypeRegistry().signal("payment", payload=Paid)
    with pytest.raises(UnknownSignalTypeError):
        await client.signal(conn, stranger, "k", Paid(amount=1))
    with pytest.raises(PayloadValidationError, match="signal payload"):
        await client.signal(conn, shop.payment, "k", {"amount": "many"})  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError):
        await client.signal(conn, shop.payment, "", Paid(amount=1))
    # Nothing was sent: the transaction is still usable, and sends the next one.
    await client.signal(conn, shop.payment, "k", {"amount": 2})  # type: ignore[arg-type]
    await conn.commit()
    cur = await conn.execute("SELECT name, payload FROM pgwork.signals")
    assert await cur.fetchall() == [("payment:k", {"amount": 2})]


async def test_a_continuation_to_a_type_that_does_not_wait_fails_its_job_for_good(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    shop = Shop()
    plain = shop.registry.job_type("plain", input=Order, entry=False)
    wrong = shop.registry.job_type("wrong", input=Order, continue_with=[plain])

    async def hand_on(attempt: Any) -> Any:
        return Continue(plain, attempt.job.input, wait_for=shop.payment.named("x"))

    client = await make_client(shop.registry)
    await workers(client=client, processors={wrong: hand_on})
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        started = await client.start_chain(conn, wrong, Order(id="x"))
        await conn.commit()

    async def failed() -> bool:
        return (await client.get_job(started.id)).status is JobStatus.FAILED

    await eventually(failed, timeout=PROMPT, what="the failure")
    job = await client.get_job(started.id)
    assert job.attempt == 1  # not retried: the same code fails the same way
    assert job.last_attempt_error is not None
    assert "WaitNotDeclaredError" in job.last_attempt_error.type


async def test_reading_a_signal_the_type_does_not_wait_for_is_refused(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    shop = Shop()
    other = shop.registry.signal("other", payload=Paid)
    errors: list[BaseException] = []
    read = anyio.Event()

    async def ship(attempt: Any) -> None:
        try:
            await attempt.received(other)
        except WaitNotDeclaredError as exc:
            errors.append(exc)
        read.set()

    client = await make_client(shop.registry)
    await workers(client=client, processors={shop.order: shop.hand_on, shop.ship: ship})
    await send(pgwork_dsn, client, shop, "r-1", 1)
    await start_order(pgwork_dsn, client, shop, Order(id="r-1"))
    with anyio.fail_after(PROMPT):
        await read.wait()
    assert "does not wait for signal type 'other'" in str(errors[0])


async def test_signal_sync_and_a_sync_handler_reading_it(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    shop = Shop()
    client = await make_client(shop.registry)
    seen: list[tuple[Any, str]] = []
    ran = threading.Event()

    def ship(attempt: SyncAttempt[Order, Any]) -> None:
        seen.append((attempt.received(shop.payment), threading.current_thread().name))
        ran.set()

    await workers(client=client, processors={shop.order: shop.hand_on, shop.ship: ship})
    await start_order(pgwork_dsn, client, shop, Order(id="s-1"))
    await waiting(pgwork_dsn, 1)
    with psycopg.connect(pgwork_dsn) as blocking:
        client.signal_sync(blocking, shop.payment, "s-1", Paid(amount=4))
        blocking.commit()
    assert await anyio.to_thread.run_sync(ran.wait, PROMPT)
    [(got, thread)] = seen
    assert isinstance(got, Signalled)
    assert got.payload == Paid(amount=4)
    assert thread.startswith("pgwork-sync-")


async def test_a_hand_on_from_outside_any_worker_is_matched_on_its_commit(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    shop = Shop()
    client = await make_client(shop.registry)
    shipments = Shipments(shop.payment)
    await send(pgwork_dsn, client, shop, "c-1", 8)  # nothing waits yet
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        started = await client.start_chain(conn, shop.order, Order(id="c-1"))
        await conn.commit()
    # Only the step's worker runs: the order is completed from outside, in a caller's
    # transaction, handing on to the waiting step.
    await workers(client=client, processors={shop.ship: shipments})
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        await client.complete_job(
            conn,
            started.id,
            continue_with=Continue(shop.ship, Order(id="c-1"), wait_for=shop.payment.named("c-1")),
        )
        await conn.commit()
    assert await shipments.within(PROMPT)
    assert shipments.amounts == [8]
    assert await pending_signals(pgwork_dsn) == []


async def test_a_store_without_signals_refuses_them_before_any_statement(
    pgwork_dsn: str, make_client: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    shop = Shop()
    client = await make_client(shop.registry, store=CoreOnly)
    with pytest.raises(CapabilityMissingError, match="ChainSignals"):
        await client.signal(conn, shop.payment, "k", Paid(amount=1))
    started = await client.start_chain(conn, shop.order, Order(id="k"))
    await conn.commit()
    with pytest.raises(CapabilityMissingError, match="ChainSignals"):
        await client.complete_job(
            conn,
            started.id,
            continue_with=Continue(shop.ship, Order(id="k"), wait_for=shop.payment.named("k")),
        )
    await conn.rollback()


async def test_a_worker_for_a_type_that_hands_on_to_a_waiting_step_needs_signals(
    make_client: Any,
) -> None:
    shop = Shop()
    client = await make_client(shop.registry, store=CoreOnly)

    async def order(attempt: Any) -> None: ...

    # Each hand-on would fail on the store, attempt after attempt: refused when built.
    with pytest.raises(CapabilityMissingError, match="'order', which may hand on to 'ship'"):
        create_in_process_worker(client=client, processors={shop.order: order})
