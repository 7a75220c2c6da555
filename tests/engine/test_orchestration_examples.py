"""The chain and scheduling examples run as documented."""

from __future__ import annotations

import pytest
from examples import chains_with_blockers, scheduling

pytestmark = pytest.mark.anyio


async def test_chains_with_blockers_example_fans_in_and_branches(pgwork_dsn: str) -> None:
    decision = await chains_with_blockers.main(pgwork_dsn)
    assert decision == chains_with_blockers.Decision(
        customer="ACME", total_cents=11150, approved_by="sales"
    )


async def test_scheduling_example_triggers_and_fires_the_cron_tick_once(
    pgwork_dsn: str,
) -> None:
    ran = await scheduling.main(pgwork_dsn)
    assert "tomorrow" in ran
    # Two workers carry the schedule; every tick (one, or two across a minute
    # boundary) was enqueued and run exactly once.
    chains, ticks = await _digest_counts(pgwork_dsn)
    assert chains == ticks
    assert ran.count("digest for ops") <= ticks
    assert 1 <= ticks <= 2


async def _digest_counts(dsn: str) -> tuple[int, int]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT count(*), count(DISTINCT dedup_key) FROM pgwork.jobs "
            "WHERE type_name = 'send_digest'"
        )
        row = await cur.fetchone()
        assert row is not None
        return row[0], row[1]
