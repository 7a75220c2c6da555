"""Pruning flow control's rows in PostgreSQL (``prune_limits``): what the conformance
suite cannot write through the contract (a key row with a type-wide limit or a waiting
mark, starts of several types), a row an operator's open transaction is writing, and a
type that is no longer rated.

Controls: without ``SKIP LOCKED`` on the key rows the pruning waits on the open
transaction and the race test times out; without ``o.concurrency IS NULL``,
``o.rate_n IS NULL`` or ``o.waiting_since IS NULL`` in ``_IDLE_KEY`` the matching case
of the first test deletes the row; without the walk over the types of ``job_starts``
(one type only) the second test leaves a type's starts.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from tests.postgres._limited import limited_job

from pgwork._flow_control import MAX_RATE_PERIOD
from pgwork.adapters.limits import LimitChange
from pgwork.adapters.state import TypeLimits
from pgwork.postgres.state import PostgresStateAdapter

pytestmark = pytest.mark.anyio


async def _sql(dsn: str, query: str) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(query)  # a test's own SQL, no input
        return await cur.fetchall() if cur.description else []


async def _keys(dsn: str) -> list[str]:
    rows = await _sql(dsn, "SELECT limit_key FROM pgwork.job_limits ORDER BY limit_key")
    return [r[0] for r in rows]


@pytest.mark.parametrize(
    "holds",
    [
        "concurrency = 3",
        "rate_n = 2, rate_per_s = 1.0",
        "waiting_since = now() - interval '30 days'",
    ],
)
async def test_a_key_row_holding_anything_is_kept(
    state: PostgresStateAdapter, pgwork_dsn: str, holds: str
) -> None:
    """A key's row is deleted only when every column of it is empty (or its pause has
    passed), whichever column holds something and however it came to hold it; a
    waiting mark, however old, is kept (its age says nothing of who waits on it)."""
    await _sql(
        pgwork_dsn,
        "INSERT INTO pgwork.job_limits (type_name, limit_key, paused_until) VALUES"
        " ('t', 'idle', now() - interval '1 second'), ('t', 'holds', NULL)",
    )
    await _sql(pgwork_dsn, f"UPDATE pgwork.job_limits SET {holds} WHERE limit_key = 'holds'")
    pruned = await state.prune_limits(starts_older_than=MAX_RATE_PERIOD)
    assert pruned.key_rows == 1
    assert await _keys(pgwork_dsn) == ["holds"]


async def test_a_row_an_open_transaction_writes_is_skipped_and_keeps_what_it_wrote(
    state: PostgresStateAdapter, pgwork_dsn: str
) -> None:
    """An operator pausing a key in a transaction of their own holds its row: the
    pruning neither waits for that transaction nor deletes the row, and once it
    commits the pause holds."""
    await state.change_limits(None, type_name="t", limit_key="k", change=LimitChange())
    async with state.transaction() as tx:
        await state.change_limits(
            tx, type_name="t", limit_key="k", change=LimitChange(paused_until=timedelta(hours=1))
        )
        with anyio.fail_after(5):
            pruned = await state.prune_limits(starts_older_than=MAX_RATE_PERIOD)
        assert pruned.key_rows == 0
    assert (await state.prune_limits(starts_older_than=MAX_RATE_PERIOD)).key_rows == 0
    [(paused,)] = await _sql(
        pgwork_dsn, "SELECT paused_until > now() FROM pgwork.job_limits WHERE limit_key = 'k'"
    )
    assert paused


async def test_the_old_starts_of_every_type_go_a_batch_at_a_time(
    state: PostgresStateAdapter, pgwork_dsn: str
) -> None:
    """Starts older than the horizon go, whatever their type, at most ``limit`` a
    call; a start younger than the horizon stays."""
    await _sql(
        pgwork_dsn,
        "INSERT INTO pgwork.job_starts (type_name, limit_group, started_at)"
        " SELECT t, '', now() - interval '2 days'"
        " FROM unnest(ARRAY['a', 'b', 'b', 'c']) AS t"
        " UNION ALL SELECT 'b', '', now() - interval '23 hours'",
    )
    prune = state.prune_limits
    assert (await prune(starts_older_than=MAX_RATE_PERIOD, limit=3)).starts == 3
    assert (await prune(starts_older_than=MAX_RATE_PERIOD, limit=3)).starts == 1
    assert (await prune(starts_older_than=MAX_RATE_PERIOD, limit=3)).starts == 0
    assert await _sql(pgwork_dsn, "SELECT type_name FROM pgwork.job_starts") == [("b",)]


async def test_a_type_no_longer_rated_has_its_starts_pruned(
    state: PostgresStateAdapter, pgwork_dsn: str
) -> None:
    """The acquire deletes the expired starts of the types it rates; once a type's
    rate is removed its acquires no longer do, and only the pruning does."""
    async with state.transaction() as tx:
        await state.insert_jobs(tx, jobs=[limited_job("fetch", None) for _ in range(3)])

    async def acquire(limits: TypeLimits) -> list[Any]:
        turn = await state.acquire_limited(
            completions=[],
            worker_id="w",
            leases={"fetch": timedelta(seconds=60)},
            queues=["default"],
            limit=1,
            limits={"fetch": limits},
        )
        return list(turn.acquired)

    assert len(await acquire(TypeLimits(rate_n=5, rate_per_s=60.0))) == 1
    await _sql(pgwork_dsn, "UPDATE pgwork.job_starts SET started_at = now() - interval '2 days'")
    assert len(await acquire(TypeLimits(concurrency=5))) == 1  # no longer rated
    assert await _sql(pgwork_dsn, "SELECT count(*) FROM pgwork.job_starts") == [(1,)]

    assert (await state.prune_limits(starts_older_than=MAX_RATE_PERIOD)).starts == 1
    assert await _sql(pgwork_dsn, "SELECT count(*) FROM pgwork.job_starts") == [(0,)]
