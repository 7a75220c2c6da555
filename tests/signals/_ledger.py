"""The handlers of the worker-killed scenario, shared by the victim process and the
test: each attempt writes a *ledger* row on a connection of its own, in autocommit (it
survives whatever happens to the attempt, so it counts executions), and an atomic
attempt also writes an *effect* row through ``attempt.connection``, which commits with
its job or not at all (two for one job would be a duplicate effect)."""

from __future__ import annotations

from typing import Any

import psycopg

from pgwork import Attempt, Continue

from ._kit import Order, Shop

__all__ = ["TABLES", "hand_on", "ship"]

TABLES = """
CREATE TABLE IF NOT EXISTS signal_ledger (job_id uuid NOT NULL, type_name text NOT NULL);
CREATE TABLE IF NOT EXISTS signal_effects (job_id uuid NOT NULL, type_name text NOT NULL);
"""


async def _record(dsn: str, attempt: Attempt[Order, Any]) -> None:
    row = (attempt.job.id, attempt.job.type_name)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as own:
        await own.execute("INSERT INTO signal_ledger VALUES (%s, %s)", row)
    if attempt.connection is not None:
        await attempt.connection.execute("INSERT INTO signal_effects VALUES (%s, %s)", row)


def hand_on(dsn: str, shop: Shop) -> Any:
    async def handler(attempt: Attempt[Order, Any]) -> Continue[Order]:
        await _record(dsn, attempt)
        return await shop.hand_on(attempt)

    return handler


def ship(dsn: str, shop: Shop) -> Any:
    async def handler(attempt: Attempt[Order, Any]) -> None:
        await attempt.received(shop.payment)
        await _record(dsn, attempt)

    return handler
