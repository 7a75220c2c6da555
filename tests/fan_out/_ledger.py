"""The handlers of the worker-killed scenarios, shared by the victim process and the
test: each attempt writes a *ledger* row on a connection of its own, in autocommit (it
survives whatever happens to the attempt, so it counts executions), and an atomic
attempt also writes an *effect* row through ``attempt.connection``, which commits with
its job's completion or not at all (two for one job would be a duplicate effect)."""

from __future__ import annotations

from typing import Any

import psycopg

from pgwork import Attempt, Continue

from ._kit import Batch, Done, FanOut, Part, Summary

__all__ = ["TABLES", "handlers"]

TABLES = """
CREATE TABLE IF NOT EXISTS fan_ledger (job_id uuid NOT NULL, type_name text NOT NULL);
CREATE TABLE IF NOT EXISTS fan_effects (job_id uuid NOT NULL, type_name text NOT NULL);
"""


async def _record(dsn: str, attempt: Attempt[Any, Any]) -> None:
    row = (attempt.job.id, attempt.job.type_name)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as own:
        await own.execute("INSERT INTO fan_ledger VALUES (%s, %s)", row)
    if attempt.connection is not None:
        await attempt.connection.execute("INSERT INTO fan_effects VALUES (%s, %s)", row)


def handlers(dsn: str, fan: FanOut) -> dict[Any, Any]:
    """``fan``'s handlers, each recording its attempt first."""

    async def split(attempt: Attempt[Batch, Any]) -> Continue[Batch]:
        await _record(dsn, attempt)
        return await fan.do_split(attempt)

    async def part(attempt: Attempt[Part, Done]) -> Done:
        await _record(dsn, attempt)
        return await fan.do_part(attempt)

    async def collect(attempt: Attempt[Batch, Summary]) -> Summary:
        await _record(dsn, attempt)
        return await fan.do_collect(attempt)

    return {fan.split: split, fan.part: part, fan.collect: collect}
