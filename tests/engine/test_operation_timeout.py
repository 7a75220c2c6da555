"""An operation of the state adapter on its own connections is bounded in time
(``operation_timeout``): one that gets no answer ends with ``DatabaseTimeoutError``,
its connection is dropped, and the adapter goes on working over a new one.

A lock held by another session stands in for a server that does not answer: the
statement waits in the server exactly as it would behind a silent network path
(tests/faults/test_network_blackhole.py has the network itself).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest

from pgwork import DatabaseTimeoutError, PostgresStateAdapter
from pgwork.errors import ConfigurationError, DatabaseError

pytestmark = pytest.mark.anyio

LEASES = {"noop": timedelta(seconds=30)}


async def _acquire(state: PostgresStateAdapter) -> list[Any]:
    return await state.acquire(worker_id="w", leases=LEASES, queues=["default"], limit=1)


async def _locked_jobs_table(dsn: str) -> psycopg.AsyncConnection[Any]:
    holder = await psycopg.AsyncConnection.connect(dsn)
    await holder.execute("LOCK TABLE pgwork.jobs IN ACCESS EXCLUSIVE MODE")
    return holder


async def test_an_operation_without_an_answer_times_out_and_the_next_one_works(
    pgwork_dsn: str,
) -> None:
    state = await PostgresStateAdapter.connect(
        pgwork_dsn, min_size=1, max_size=2, operation_timeout=0.5
    )
    try:
        holder = await _locked_jobs_table(pgwork_dsn)
        started = time.monotonic()
        with pytest.raises(DatabaseTimeoutError) as caught:
            await _acquire(state)
        took = time.monotonic() - started
        await holder.rollback()
        await holder.close()

        assert isinstance(caught.value, DatabaseError)
        assert isinstance(caught.value, TimeoutError)
        assert caught.value.seconds == 0.5
        assert "operation_timeout" in str(caught.value)
        assert took < 5.0
        # The pool is whole again and its connections answer.
        for _ in range(4):
            assert await _acquire(state) == []
        assert state.pool.get_stats()["pool_max"] == 2
    finally:
        await state.close()


async def test_control_without_a_bound_the_operation_waits(pgwork_dsn: str) -> None:
    state = await PostgresStateAdapter.connect(
        pgwork_dsn, min_size=1, max_size=2, operation_timeout=None
    )
    try:
        holder = await _locked_jobs_table(pgwork_dsn)
        with anyio.move_on_after(2.0) as waited:
            await _acquire(state)
        await holder.rollback()
        await holder.close()
        assert waited.cancelled_caught
    finally:
        await state.close()


async def test_a_transaction_block_is_not_bounded(pgwork_dsn: str) -> None:
    """The block is the caller's (an atomic handler may run in it for minutes)."""
    state = await PostgresStateAdapter.connect(pgwork_dsn, operation_timeout=0.2)
    try:
        async with state.transaction():
            await anyio.sleep(0.6)
    finally:
        await state.close()


@pytest.mark.parametrize("value", [0, -1.0, float("nan")])
async def test_the_bound_must_be_positive(pgwork_dsn: str, value: float) -> None:
    with pytest.raises(ConfigurationError, match="operation_timeout"):
        await PostgresStateAdapter.connect(pgwork_dsn, operation_timeout=value)
