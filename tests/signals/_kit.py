"""What the signal tests share: a chain whose first step hands on to a step waiting
for a payment, handlers that record what each step received, and reads of the rows.

``order`` (entry) hands on to ``ship`` waiting for ``payment:<order id>`` (with the
timeout the order asks for); ``ship`` records, per attempt, the payment it received or
that it timed out.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

import anyio
import psycopg
from pydantic import BaseModel

from pgwork import (
    Attempt,
    Client,
    Continue,
    JobTypeRegistry,
    Signalled,
    SignalType,
    TimedOut,
    WaitingJobType,
)
from pgwork.job_types import JobType

__all__ = [
    "Order",
    "Paid",
    "Shipments",
    "Shop",
    "pending_signals",
    "send",
    "start_order",
    "step_statuses",
    "waiting",
]


class Order(BaseModel):
    id: str
    timeout_s: float | None = None


class Paid(BaseModel):
    amount: int


class Shop:
    """One registry: the ``payment`` signal type, ``order`` and ``ship``."""

    def __init__(self, *, ship_mode: str = "staged", order_mode: str = "staged") -> None:
        self.registry = JobTypeRegistry()
        self.payment: SignalType[Paid] = self.registry.signal("payment", payload=Paid)
        self.ship: WaitingJobType[Order, Any, Paid] = self.registry.job_type(
            "ship",
            input=Order,
            entry=False,
            waits_for=self.payment,
            mode=ship_mode,  # type: ignore[arg-type]
            queue="ships",
        )
        self.order: JobType[Order, Any] = self.registry.job_type(
            "order",
            input=Order,
            continue_with=[self.ship],
            mode=order_mode,  # type: ignore[arg-type]
        )

    async def hand_on(self, attempt: Attempt[Order, Any]) -> Continue[Order]:
        order = attempt.job.input
        timeout = None if order.timeout_s is None else timedelta(seconds=order.timeout_s)
        return Continue(self.ship, order, wait_for=self.payment.named(order.id, timeout=timeout))


class Shipments:
    """The ``ship`` handler: records (job id, what it received) per attempt."""

    def __init__(self, payment: SignalType[Paid]) -> None:
        self.payment = payment
        self.runs: list[tuple[UUID, Signalled[Paid] | TimedOut]] = []
        # The order each step ran for, by step.
        self.orders: dict[UUID, str] = {}
        self._counted: dict[int, anyio.Event] = {}

    async def __call__(self, attempt: Attempt[Order, Any]) -> None:
        got = await attempt.received(self.payment)
        self.runs.append((attempt.job.id, got))
        self.orders[attempt.job.id] = attempt.job.input.id
        self._reached(len(self.runs)).set()

    def _reached(self, count: int) -> anyio.Event:
        return self._counted.setdefault(count, anyio.Event())

    async def within(self, seconds: float, *, count: int = 1) -> bool:
        """Whether ``count`` steps have run within ``seconds``."""
        with anyio.move_on_after(seconds):
            await self._reached(count).wait()
            return True
        return False

    @property
    def amounts(self) -> list[int | None]:
        return [got.payload.amount if isinstance(got, Signalled) else None for _, got in self.runs]


async def start_order(dsn: str, client: Client, shop: Shop, order: Order) -> UUID:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        started = await client.start_chain(conn, shop.order, order)
        await conn.commit()
    return started.id


async def send(
    dsn: str, client: Client, shop: Shop, key: str, amount: int, *, commit: bool = True
) -> UUID:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        signal_id = await client.signal(conn, shop.payment, key, Paid(amount=amount))
        await (conn.commit() if commit else conn.rollback())
    return signal_id


async def step_statuses(dsn: str, name: str | None = None) -> list[str]:
    """The statuses of the ``ship`` steps (of the order ``name`` waits for, if given),
    oldest first; a matched step's name is cleared, so ``name`` finds waiting ones."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT status::text FROM pgwork.jobs WHERE type_name = 'ship'"
            " AND (%s::text IS NULL OR wait_signal = %s) ORDER BY id",
            (name, name),
        )
        return [row[0] for row in await cur.fetchall()]


async def pending_signals(dsn: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT name FROM pgwork.signals WHERE consumed_by IS NULL ORDER BY id"
        )
        return [row[0] for row in await cur.fetchall()]


async def waiting(dsn: str, count: int, *, timeout: float = 20.0) -> None:
    """Return once ``count`` ``ship`` steps wait (blocked or scheduled), or fail."""
    with anyio.fail_after(timeout):
        while True:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                cur = await conn.execute(
                    "SELECT count(*) FROM pgwork.jobs WHERE type_name = 'ship'"
                    " AND wait_signal IS NOT NULL AND attempt = 0"
                )
                row = await cur.fetchone()
            if row is not None and row[0] >= count:
                return
            await anyio.sleep(0.02)
