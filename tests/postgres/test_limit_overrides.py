"""The limited acquire reads an operator's rows in ``job_limits`` at every acquire: a
type's own limits and pause (``limit_key`` ''), and one key's limit and pause (the key's
row). The code's declarations are what a NULL column, or no row, leaves in force.

Each test writes the rows with SQL of its own, as any tool writing ``job_limits``
would, and reads what acquires lease. Controls: the acquire that read only the type
row's two limits fails the four tests of pauses and key rows; a walk that counts every
group it visits, paused or full, towards the room it may fill (rather than only those
with room) stops at the paused key and fails the test that passes it over."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import timedelta

import psycopg
import pytest
from tests.postgres._limited import limited_job

from pgwork.adapters.state import AcquiredJob, TypeLimits
from pgwork.postgres.state import PostgresStateAdapter

pytestmark = pytest.mark.anyio

KEYED = {"fetch": TypeLimits(key_concurrency=1)}
WHOLE = {"fetch": TypeLimits(concurrency=2)}


async def _seed(state: PostgresStateAdapter, keys: Iterable[str], each: int = 3) -> None:
    """``each`` jobs of every key in ``keys`` ("" for jobs enqueued without one)."""
    async with state.transaction() as tx:
        await state.insert_jobs(
            tx, jobs=[limited_job("fetch", k or None) for k in keys for _ in range(each)]
        )


async def _acquire(
    state: PostgresStateAdapter, limits: dict[str, TypeLimits], limit: int = 10
) -> list[AcquiredJob]:
    turn = await state.acquire_limited(
        completions=(),
        worker_id="w",
        leases={"fetch": timedelta(seconds=60)},
        queues=["default"],
        limit=limit,
        limits=limits,
    )
    return turn.acquired


async def _sql(dsn: str, query: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(query)  # a test's own SQL, no input


def _keys(jobs: list[AcquiredJob]) -> Counter[str]:
    return Counter(j.limit_key or "" for j in jobs)


async def test_a_type_row_lowers_and_raises_the_declared_concurrency(
    state: PostgresStateAdapter, pgwork_dsn: str
) -> None:
    await _seed(state, [""], each=10)
    await _sql(
        pgwork_dsn, "INSERT INTO pgwork.job_limits (type_name, concurrency) VALUES ('fetch', 1)"
    )
    assert len(await _acquire(state, WHOLE)) == 1
    await _sql(pgwork_dsn, "UPDATE pgwork.job_limits SET concurrency = 5")
    assert len(await _acquire(state, WHOLE)) == 4  # five running now
    await _sql(pgwork_dsn, "UPDATE pgwork.job_limits SET concurrency = NULL")
    assert await _acquire(state, WHOLE) == []  # back to the declared two: five run already


async def test_a_paused_type_starts_nothing_until_its_pause_ends(
    state: PostgresStateAdapter, pgwork_dsn: str
) -> None:
    await _seed(state, [""], each=3)
    await _sql(
        pgwork_dsn,
        "INSERT INTO pgwork.job_limits (type_name, paused_until)"
        " VALUES ('fetch', now() + interval '1 hour')",
    )
    assert await _acquire(state, WHOLE) == []
    await _sql(pgwork_dsn, "UPDATE pgwork.job_limits SET paused_until = now() - interval '1 s'")
    assert len(await _acquire(state, WHOLE)) == 2


async def test_a_paused_key_is_passed_over_and_the_others_are_served(
    state: PostgresStateAdapter, pgwork_dsn: str
) -> None:
    """The walk passes over a paused key rather than stopping at it: asked for one job,
    with the paused key first in the walk's order, the acquire still leases one (of the
    next key), every time, until each other key has its one running."""
    await _seed(state, "abc")
    await _sql(
        pgwork_dsn,
        "INSERT INTO pgwork.job_limits (type_name, limit_key, paused_until)"
        " VALUES ('fetch', 'a', now() + interval '1 hour')",
    )
    taken = [await _acquire(state, KEYED, limit=1) for _ in range(3)]
    assert [_keys(t) for t in taken] == [Counter("b"), Counter("c"), Counter()]
    await _sql(pgwork_dsn, "UPDATE pgwork.job_limits SET paused_until = NULL")
    assert _keys(await _acquire(state, KEYED)) == Counter("a")


async def test_a_key_row_gives_one_key_its_own_limit(
    state: PostgresStateAdapter, pgwork_dsn: str
) -> None:
    """Declared one per key; key "a" may run three, key "b" stays at one."""
    await _seed(state, "ab", each=5)
    await _sql(
        pgwork_dsn,
        "INSERT INTO pgwork.job_limits (type_name, limit_key, key_concurrency)"
        " VALUES ('fetch', 'a', 3)",
    )
    assert _keys(await _acquire(state, KEYED)) == Counter({"a": 3, "b": 1})
    assert await _acquire(state, KEYED) == []


async def test_a_type_row_sets_every_key_s_limit_and_a_key_row_overrides_it(
    state: PostgresStateAdapter, pgwork_dsn: str
) -> None:
    await _seed(state, "ab", each=5)
    await _sql(
        pgwork_dsn,
        "INSERT INTO pgwork.job_limits (type_name, limit_key, key_concurrency)"
        " VALUES ('fetch', '', 2), ('fetch', 'b', 4)",
    )
    assert _keys(await _acquire(state, KEYED)) == Counter({"a": 2, "b": 4})


async def test_a_key_at_its_limit_does_not_hold_back_the_keys_after_it(
    state: PostgresStateAdapter,
) -> None:
    """Key "a" runs its one; acquires asking for one job each still reach "b" and "c"."""
    await _seed(state, "abc")
    assert _keys(await _acquire(state, KEYED, limit=1)) == Counter("a")
    assert _keys(await _acquire(state, KEYED, limit=1)) == Counter("b")
    assert _keys(await _acquire(state, KEYED, limit=1)) == Counter("c")
    assert await _acquire(state, KEYED, limit=1) == []
