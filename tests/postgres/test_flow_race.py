"""The race the limited acquire's lock closes, made to happen every time.

Two acquires of a keyed type limited to two at once. The first takes its jobs, then
waits, before its commit, on a row a caller holds (``job_limits``, where it moves the
type's cursor). Without the lock the second would start meanwhile, count nothing
running (the first has not committed) and take two jobs more: four running. With it,
the second waits for the first to commit, counts its two jobs, and takes none.
Control: with the lock statement skipped, the second acquire takes two jobs and the
test fails.
"""

from __future__ import annotations

from datetime import timedelta

import anyio
import psycopg
import pytest
from tests.postgres._limited import limited_job

from pgwork.adapters.state import AcquiredJob, TypeLimits
from pgwork.postgres.state import PostgresStateAdapter

pytestmark = pytest.mark.anyio

LIMITS = {"fetch": TypeLimits(concurrency=2, key_concurrency=10)}


async def _acquire(state: PostgresStateAdapter) -> list[AcquiredJob]:
    turn = await state.acquire_limited(
        completions=(),
        worker_id="w",
        leases={"fetch": timedelta(seconds=60)},
        queues=["default"],
        limit=10,
        limits=LIMITS,
    )
    return turn.acquired


async def test_a_second_acquire_waits_for_the_first_and_counts_its_jobs(
    pgwork_dsn: str,
) -> None:
    state = await PostgresStateAdapter.connect(pgwork_dsn, max_size=4)
    try:
        async with state.transaction() as tx:
            # Three jobs a key: each acquire locks two of the keys it visits, so the
            # second finds a third job of each without the first's lock in its way.
            await state.insert_jobs(
                tx, jobs=[limited_job("fetch", k) for k in "abcd" for _ in range(3)]
            )
        # The type's cursor row exists, so that the first acquire updates it.
        await _acquire(state)
        async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
            await conn.execute("UPDATE pgwork.jobs SET status = 'pending', lease_token = NULL")
            await conn.commit()
            # A caller holds the cursor row: the first acquire waits on it to commit.
            await conn.execute("SELECT 1 FROM pgwork.job_limits FOR UPDATE")
            taken: list[list[AcquiredJob]] = []

            async def acquire() -> None:
                taken.append(await _acquire(state))

            async with anyio.create_task_group() as group:
                group.start_soon(acquire)
                await _waiting_on_a_lock(pgwork_dsn, count=1)
                group.start_soon(acquire)
                # The second either waits on the first's type lock, or (without it)
                # takes its own jobs and waits on the cursor row too.
                await _waiting_on_a_lock(pgwork_dsn, count=2)
                await conn.commit()
        assert sorted(len(jobs) for jobs in taken) == [0, 2]
    finally:
        await state.close()


async def _waiting_on_a_lock(dsn: str, *, count: int) -> None:
    """Until ``count`` backends of this database wait on a lock (read on a connection
    of its own: a transaction sees one snapshot of ``pg_stat_activity``)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        with anyio.fail_after(10):
            while True:
                cur = await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
                row = await cur.fetchone()
                if row is not None and row[0] >= count:
                    return
                await anyio.sleep(0.01)
