"""What retention keeps past its period, and why each would be lost without it: a dedup
key's open window (and a cron tick's), a blocker a waiting job still reads, the outcome
of a chain someone awaits.

Each guarantee has a control build: the retention statements without the condition
that keeps the chain (``_retention_kit.without``), where the test sees what goes wrong.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    ChainDeletedError,
    ChainNotFoundError,
    ChainStatus,
    Client,
    DedupSpec,
    JobTypeRegistry,
    Retention,
)
from pgwork.retention import AWAITED_HOLD
from pgwork.schedules import CronSchedule
from pgwork.worker._side.maintenance import Maintenance

from ._retention_kit import age, end, execute, job_count, start, without
from .conftest import ClientFactory, eventually, scalar

pytestmark = pytest.mark.anyio

BRIEF = Retention.uniform(timedelta(milliseconds=1))
DEDUP_HOLD = b"AND (r.dedup_until IS NULL OR r.dedup_until < now())"
AWAITED = b"NOT r.chain_awaited\n"
DEPENDANTS = b"NOT r.chain_has_dependants OR"


class Item(BaseModel):
    n: int = 0


def registry() -> JobTypeRegistry:
    reg = JobTypeRegistry()
    reg.job_type("short", input=Item, output=Item, retention=timedelta(hours=1))
    reg.job_type("brief", input=Item, output=Item, retention=BRIEF)
    reg.job_type("uses", input=Item, retention=Retention.forever())
    return reg


# Each hold's test runs as built, and as its control build: the retention statements
# without the condition that keeps the chain (``hold``, replaced by ``instead``).
HELD_OR_NOT = pytest.mark.parametrize("build", ["held", "control-no-hold"])


async def held_client(
    make_client: ClientFactory, build: str, hold: bytes, instead: bytes = b"true"
) -> Client:
    client = await make_client(registry())
    if build == "control-no-hold":
        without(client, hold, instead)
    return client


# --- dedup windows ---------------------------------------------------------------------


@HELD_OR_NOT
async def test_a_chain_is_kept_while_its_dedup_window_is_open(
    make_client: ClientFactory,
    pgwork_dsn: str,
    conn: psycopg.AsyncConnection[Any],
    build: str,
) -> None:
    client = await held_client(make_client, build, DEDUP_HOLD, b"")
    window = DedupSpec("invoice-7", scope="window", window=timedelta(days=3))
    first = await start(client, pgwork_dsn, "short", dedup=window)
    await end(pgwork_dsn, first, "completed", ago=timedelta(hours=2))  # past the hour

    deleted = await client.purge_expired()
    again = await client.start_chain(conn, client.registry.get("short"), Item(), dedup=window)
    await conn.commit()

    if build == "held":
        assert deleted == 0
        assert again.deduplicated
        assert again.id == first
    else:  # the window reopened two days and more early
        assert deleted == 1
        assert not again.deduplicated


async def test_a_chain_goes_once_its_dedup_window_has_passed(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    window = DedupSpec("report-3", scope="window", window=timedelta(days=3))
    first = await start(client, pgwork_dsn, "short", dedup=window)
    await end(pgwork_dsn, first, "completed", ago=timedelta(hours=2))
    held_until = await scalar(pgwork_dsn, "SELECT dedup_until - created_at FROM pgwork.jobs")
    assert held_until > timedelta(days=3)  # the window, from the enqueue (end moved it back)
    assert await client.purge_expired() == 0

    await execute(pgwork_dsn, "UPDATE pgwork.jobs SET dedup_until = now() - interval '1 s'")

    assert await client.purge_expired() == 1


async def test_a_key_deduplicated_for_ever_keeps_its_chain_for_ever(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    once = await start(client, pgwork_dsn, "short", dedup=DedupSpec("once", scope="ever"))
    incomplete = await start(client, pgwork_dsn, "short", dedup="while-active")
    await end(pgwork_dsn, [once, incomplete], "completed", ago=timedelta(days=400))

    assert await client.purge_expired() == 1
    assert await job_count(pgwork_dsn, [once]) == 1
    assert await scalar(pgwork_dsn, "SELECT dedup_until = 'infinity' FROM pgwork.jobs")


@HELD_OR_NOT
async def test_a_cron_tick_whose_chain_ended_does_not_fire_again_after_retention(
    make_client: ClientFactory, pgwork_dsn: str, conn: psycopg.AsyncConnection[Any], build: str
) -> None:
    client = await held_client(make_client, build, DEDUP_HOLD, b"")
    schedule = CronSchedule("minutely", "* * * * *", client.registry.get("brief"), Item())
    now = await client.state.now()
    assert await Maintenance(client, [schedule]).fire_due(now) == 1
    [tick] = (await client.list_chains(type_name="brief")).items
    await client.complete_job(conn, tick.id, Item(n=1))
    await conn.commit()
    await age(pgwork_dsn, tick.id, timedelta(seconds=1))  # past the type's millisecond

    deleted = await client.purge_expired()
    # A worker started since (no memory of the tick) looks at the same moment.
    fired_again = await Maintenance(client, [schedule]).fire_due(now)

    if build == "held":
        assert (deleted, fired_again) == (0, 0)
        # Once no worker would enqueue the tick again, its chain goes.
        await age(pgwork_dsn, tick.id, schedule.misfire_grace + timedelta(hours=1))
        assert await client.purge_expired() == 1
    else:
        assert (deleted, fired_again) == (1, 1)


# --- blockers --------------------------------------------------------------------------


@HELD_OR_NOT
async def test_a_blocker_is_kept_until_the_job_waiting_on_it_has_read_it(
    make_client: ClientFactory,
    pgwork_dsn: str,
    conn: psycopg.AsyncConnection[Any],
    build: str,
) -> None:
    client = await held_client(make_client, build, DEPENDANTS, b"true OR")
    made = await start(client, pgwork_dsn, "short")
    other = await start(client, pgwork_dsn, "short")
    waiting = await start(client, pgwork_dsn, "uses", blockers=[made, other])
    await client.complete_job(conn, made, Item(n=7))
    await conn.commit()
    await age(pgwork_dsn, made, timedelta(hours=2))  # past its type's hour

    deleted = await client.purge_expired()
    await client.complete_job(conn, other, Item(n=8))
    await conn.commit()
    blockers = client.capabilities.require_blockers("the test")
    outputs = await blockers.blocker_outputs(None, job_id=waiting)

    assert (await client.get_job(waiting)).status.value == "pending"  # released
    if build == "held":
        assert deleted == 0
        assert [(b.status, b.output) for b in outputs] == [
            (ChainStatus.COMPLETED, {"n": 7}),
            (ChainStatus.COMPLETED, {"n": 8}),
        ]
    else:  # the waiting job lost the output it waited for
        assert deleted == 1
        assert [b.status for b in outputs] == [None, ChainStatus.COMPLETED]


# --- await_chain -----------------------------------------------------------------------


@HELD_OR_NOT
async def test_an_awaited_chain_is_kept_for_its_awaiter_however_short_its_retention(
    make_client: ClientFactory,
    pgwork_dsn: str,
    conn: psycopg.AsyncConnection[Any],
    build: str,
) -> None:
    client = await held_client(make_client, build, AWAITED)
    chain = await start(client, pgwork_dsn, "brief")
    # An awaiter marks the chain, then misses the end's notice: retention runs between
    # the end and the awaiter's next read.
    await client.state.mark_chain_awaited(chain_id=chain)
    await client.complete_job(conn, chain, Item(n=5))
    await conn.commit()
    await age(pgwork_dsn, chain, timedelta(seconds=1))  # past the type's millisecond

    deleted = await client.purge_expired()

    if build == "held":
        assert deleted == 0
        with anyio.fail_after(10):
            assert await client.await_chain(chain, timeout=5) == Item(n=5)
        await age(pgwork_dsn, chain, AWAITED_HOLD)
        assert await client.purge_expired() == 1
    else:
        assert deleted == 1
        with pytest.raises(ChainNotFoundError):
            await client.await_chain(chain, timeout=5)


async def test_a_chain_deleted_while_awaited_raises_chain_deleted(
    make_client: ClientFactory, pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    chain = await start(client, pgwork_dsn, "short")
    raised: list[BaseException] = []

    async def awaiter() -> None:
        try:
            await client.await_chain(chain, timeout=30, poll_interval=0.05)
        except ChainNotFoundError as exc:
            raised.append(exc)

    async def awaited() -> bool:
        query = "SELECT chain_awaited FROM pgwork.jobs WHERE id = %s"
        return bool(await scalar(pgwork_dsn, query, chain))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(awaiter)
            await eventually(awaited, what="the awaiter's mark")
            assert await client.delete_chains(conn, [chain]) == 1
            await conn.commit()

    [error] = raised
    assert isinstance(error, ChainDeletedError)
    assert error.chain_id == chain
    assert "deleted while awaited" in str(error)
