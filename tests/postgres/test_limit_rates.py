"""Rates in the limited acquire: at most ``n`` attempts of a type (``rate``) or of one of
its keys (``key_rate``) started in any window of the rate's length, counted from the
starts the acquire records in ``job_starts`` under the type's lock.

The windows here are an hour long, so that nothing opens while a test runs; a test
moves recorded starts back in time (SQL of its own) to stand for the window passing.
Controls: without the rate in the room the acquire computes, the first test leases
all five jobs; without the starts recorded, the second acquire leases two more; with
every start counted whatever its age, the sliding-window test leases none."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from tests.postgres._limited import limited_job

from pgwork.adapters.state import AcquiredJob, Completion, LimitedTurn, TypeLimits
from pgwork.postgres.state import PostgresStateAdapter

pytestmark = pytest.mark.anyio

HOUR = 3600.0
TWO_AN_HOUR = {"fetch": TypeLimits(rate_n=2, rate_per_s=HOUR)}
ONE_A_KEY_AN_HOUR = {"fetch": TypeLimits(key_rate_n=1, key_rate_per_s=HOUR)}
# Every recorded start moved back past the windows: the hour has passed.
_AN_HOUR_AGO = "UPDATE pgwork.job_starts SET started_at = started_at - interval '61 min'"


async def _seed(state: PostgresStateAdapter, keys: list[str | None], each: int) -> None:
    async with state.transaction() as tx:
        await state.insert_jobs(
            tx, jobs=[limited_job("fetch", key) for key in keys for _ in range(each)]
        )


async def _turn(
    state: PostgresStateAdapter,
    limits: dict[str, TypeLimits],
    done: list[AcquiredJob] | None = None,
) -> LimitedTurn:
    """An acquire of up to ten, completing ``done`` first (so that what runs never
    holds the next one back: only the rate does)."""
    return await state.acquire_limited(
        completions=[Completion(j.id, j.lease_token, json.dumps(None)) for j in done or []],
        worker_id="w",
        leases={"fetch": timedelta(seconds=60)},
        queues=["default"],
        limit=10,
        limits=limits,
    )


async def _sql(dsn: str, query: str) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(query)  # a test's own SQL, no input
        return await cur.fetchall() if cur.description else []


async def test_a_type_starts_no_more_than_its_rate_in_a_window(
    state: PostgresStateAdapter, pgwork_dsn: str
) -> None:
    """Two an hour, five jobs: two start, then none (though nothing runs), and the
    acquire says when the window lets the next one start: an hour after the first."""
    await _seed(state, [None], each=5)
    first = await _turn(state, TWO_AN_HOUR)
    assert len(first.acquired) == 2
    held = await _turn(state, TWO_AN_HOUR, done=first.acquired)
    assert held.acquired == []
    [(started,)] = await _sql(pgwork_dsn, "SELECT min(started_at) FROM pgwork.job_starts")
    assert held.opens_at == started + timedelta(hours=1)


async def test_the_window_passing_lets_the_next_ones_start(
    state: PostgresStateAdapter, pgwork_dsn: str
) -> None:
    await _seed(state, [None], each=5)
    first = await _turn(state, TWO_AN_HOUR)
    await _sql(
        pgwork_dsn, "UPDATE pgwork.job_starts SET started_at = started_at - interval '61 min'"
    )
    second = await _turn(state, TWO_AN_HOUR, done=first.acquired)
    assert len(second.acquired) == 2
    # The two starts that left the window are deleted; the two new ones are kept.
    [(kept,)] = await _sql(pgwork_dsn, "SELECT count(*) FROM pgwork.job_starts")
    assert kept == 2


async def test_the_window_slides_rather_than_resetting(
    state: PostgresStateAdapter, pgwork_dsn: str
) -> None:
    """Of two starts, the older leaves the window: exactly one more may start."""
    await _seed(state, [None], each=5)
    first = await _turn(state, TWO_AN_HOUR)
    await _sql(
        pgwork_dsn,
        "UPDATE pgwork.job_starts SET started_at = started_at - interval '61 min'"
        " WHERE ctid = (SELECT min(ctid) FROM pgwork.job_starts)",
    )
    assert len((await _turn(state, TWO_AN_HOUR, done=first.acquired)).acquired) == 1


async def test_a_key_starts_no_more_than_its_key_rate(
    state: PostgresStateAdapter, pgwork_dsn: str
) -> None:
    """One a key an hour: one job of each key starts, then none of any, until the
    window passes."""
    await _seed(state, ["a", "b", "c"], each=2)
    first = await _turn(state, ONE_A_KEY_AN_HOUR)
    assert Counter(j.limit_key for j in first.acquired) == Counter("abc")
    held = await _turn(state, ONE_A_KEY_AN_HOUR, done=first.acquired)
    assert held.acquired == []
    assert held.opens_at is not None
    await _sql(
        pgwork_dsn, "UPDATE pgwork.job_starts SET started_at = started_at - interval '61 min'"
    )
    again = await _turn(state, ONE_A_KEY_AN_HOUR)
    assert Counter(j.limit_key for j in again.acquired) == Counter("abc")


async def test_an_operators_rate_overrides_the_declared_one(
    state: PostgresStateAdapter, pgwork_dsn: str
) -> None:
    await _seed(state, [None], each=5)
    await _sql(
        pgwork_dsn,
        "INSERT INTO pgwork.job_limits (type_name, rate_n, rate_per_s) VALUES ('fetch', 1, 3600)",
    )
    assert len((await _turn(state, TWO_AN_HOUR)).acquired) == 1


async def test_a_pause_says_when_it_ends(state: PostgresStateAdapter, pgwork_dsn: str) -> None:
    """A paused type's acquire comes back empty and names the pause's end, for the
    worker's timer."""
    await _seed(state, [None], each=2)
    until = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=5)
    await _sql(
        pgwork_dsn,
        "INSERT INTO pgwork.job_limits (type_name, paused_until)"
        f" VALUES ('fetch', '{until.isoformat()}')",
    )
    held = await _turn(state, {"fetch": TypeLimits(concurrency=5)})
    assert held.acquired == []
    assert held.opens_at == until


async def test_nothing_opens_where_nothing_waits(state: PostgresStateAdapter) -> None:
    """An acquire that takes every job it may names no moment: no timer to set."""
    await _seed(state, [None], each=2)
    turn = await _turn(state, TWO_AN_HOUR)
    assert len(turn.acquired) == 2
    assert turn.opens_at is None


async def test_an_acquire_just_before_a_window_opens_waits_for_it(
    state: PostgresStateAdapter, pgwork_dsn: str
) -> None:
    """Both starts of the window are moved back so that the older leaves it 40 ms from
    now, within the acquire's horizon: the acquire waits in the database for that
    moment, then leases one job, recorded as started no earlier than the moment the
    old start left. Control: without the wait (``AWAIT_OPENING`` not sent) it leases
    none and says when the window opens."""
    await _seed(state, [None], each=5)
    first = await _turn(state, TWO_AN_HOUR)
    await _sql(
        pgwork_dsn,
        "UPDATE pgwork.job_starts SET started_at = clock_timestamp() - interval '1 hour'"
        " + CASE WHEN ctid = (SELECT min(ctid) FROM pgwork.job_starts)"
        " THEN interval '40 ms' ELSE interval '30 min' END",
    )
    [(opening,)] = await _sql(
        pgwork_dsn, "SELECT min(started_at) + interval '1 hour' FROM pgwork.job_starts"
    )
    turn = await _turn(state, TWO_AN_HOUR, done=first.acquired)
    assert len(turn.acquired) == 1
    [(newest,)] = await _sql(pgwork_dsn, "SELECT max(started_at) FROM pgwork.job_starts")
    assert newest >= opening


async def test_an_opening_beyond_the_horizon_is_not_waited_for(
    state: PostgresStateAdapter, pgwork_dsn: str
) -> None:
    """The window opens in ten minutes: the acquire leases nothing at once and says
    when, for the worker's timer."""
    await _seed(state, [None], each=5)
    first = await _turn(state, TWO_AN_HOUR)
    await _sql(
        pgwork_dsn, "UPDATE pgwork.job_starts SET started_at = started_at - interval '50 min'"
    )
    turn = await _turn(state, TWO_AN_HOUR, done=first.acquired)
    assert turn.acquired == []
    [(opening,)] = await _sql(
        pgwork_dsn, "SELECT min(started_at) + interval '1 hour' FROM pgwork.job_starts"
    )
    assert turn.opens_at == opening
