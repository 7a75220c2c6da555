"""Deleting chains (on request, with dependants refused or cascaded) and retention."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    ChainHasDependantsError,
    ChainNotFoundError,
    Client,
    ConfigurationError,
    Continue,
    JobTypeRegistry,
    Retention,
)
from pgwork.postgres.sql.queries import retention_lock_key

from ._retention_kit import end, ended, execute, job_count, start
from .conftest import ClientFactory, scalar

pytestmark = pytest.mark.anyio


class Item(BaseModel):
    n: int = 0


def registry() -> JobTypeRegistry:
    reg = JobTypeRegistry()
    reg.job_type("short", input=Item, retention=timedelta(hours=1), continue_with=["short.next"])
    reg.job_type("short.next", input=Item, entry=False)
    reg.job_type("kept", input=Item, retention=None)
    return reg


async def edge_count(dsn: str) -> int:
    return int(await scalar(dsn, "SELECT count(*) FROM pgwork.job_blockers"))


# --- delete_chains ---------------------------------------------------------------------


async def test_delete_chains_removes_every_job_of_each_chain_in_the_callers_transaction(
    make_client: ClientFactory, pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    long_chain = await start(client, pgwork_dsn, "short")
    await client.complete_job(
        conn, long_chain, continue_with=Continue(client.registry.get("short.next"), Item(n=1))
    )
    await conn.commit()
    other = await start(client, pgwork_dsn, "kept")

    deleted = await client.delete_chains(conn, [long_chain])

    assert deleted == 1
    assert await job_count(pgwork_dsn, [long_chain]) == 2  # not committed yet
    await conn.commit()
    assert await job_count(pgwork_dsn, [long_chain]) == 0
    assert await job_count(pgwork_dsn, [other]) == 1


async def test_rolling_back_the_callers_transaction_keeps_the_chains(
    make_client: ClientFactory, pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    chain = await start(client, pgwork_dsn, "kept")

    assert await client.delete_chains(conn, [chain]) == 1
    await conn.rollback()

    assert await job_count(pgwork_dsn, [chain]) == 1


async def test_unknown_chain_ids_are_named_and_nothing_is_deleted(
    make_client: ClientFactory, pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    chain = await start(client, pgwork_dsn, "kept")
    continued = await start(client, pgwork_dsn, "short")
    await client.complete_job(
        conn, continued, continue_with=Continue(client.registry.get("short.next"), Item(n=1))
    )
    await conn.commit()
    (second_job,) = [j.id for j in await client.list_chain_jobs(continued) if j.id != continued]
    unknown = UUID(int=1)

    with pytest.raises(ChainNotFoundError) as caught:
        await client.delete_chains(conn, [chain, unknown, second_job])
    await conn.commit()

    assert caught.value.chain_ids == (unknown, second_job)  # a job id names no chain
    assert await job_count(pgwork_dsn) == 3


async def test_a_chain_other_chains_wait_for_is_not_deleted(
    make_client: ClientFactory, pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    blocker = await start(client, pgwork_dsn, "kept")
    waiting = await start(client, pgwork_dsn, "kept", blockers=[blocker])
    also_waiting = await start(client, pgwork_dsn, "short", blockers=[blocker])

    with pytest.raises(ChainHasDependantsError) as caught:
        await client.delete_chains(conn, [blocker])

    assert caught.value.chain_ids == (blocker,)
    assert set(caught.value.dependant_job_ids) == {waiting, also_waiting}
    assert set(caught.value.dependant_chain_ids) == {waiting, also_waiting}
    assert "cascade=True" in str(caught.value)
    # The transaction is still usable and nothing went.
    assert await client.delete_chains(conn, [blocker, waiting, also_waiting]) == 3
    await conn.rollback()
    assert await job_count(pgwork_dsn) == 3


@pytest.mark.parametrize("refusal", ["unknown id", "dependants"])
async def test_a_refused_delete_leaves_the_chains_to_the_workers_while_the_transaction_goes_on(
    refusal: str, make_client: ClientFactory, pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    """A delete that refuses holds no lock on the chains it named: a worker takes their
    jobs while the caller's transaction, which caught the error, stays open."""
    client = await make_client(registry())
    chain = await start(client, pgwork_dsn, "kept")
    if refusal == "dependants":
        await start(client, pgwork_dsn, "kept", blockers=[chain])
        refused: type[Exception] = ChainHasDependantsError
        named = [chain]
    else:
        refused = ChainNotFoundError
        named = [chain, UUID(int=1)]

    with pytest.raises(refused):
        await client.delete_chains(conn, named)
    taken = await client.state.acquire(
        worker_id="w", leases={"kept": timedelta(seconds=60)}, queues=None, limit=1
    )

    assert [job.id for job in taken] == [chain]
    await conn.rollback()


async def test_cascade_deletes_dependant_chains_transitively(
    make_client: ClientFactory, pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    root = await start(client, pgwork_dsn, "kept")
    middle = await start(client, pgwork_dsn, "kept", blockers=[root])
    leaf = await start(client, pgwork_dsn, "kept", blockers=[middle])
    unrelated = await start(client, pgwork_dsn, "kept")
    assert await edge_count(pgwork_dsn) == 2

    deleted = await client.delete_chains(conn, [root], cascade=True)
    await conn.commit()

    assert deleted == 3
    assert await job_count(pgwork_dsn, [root, middle, leaf]) == 0
    assert await job_count(pgwork_dsn, [unrelated]) == 1
    assert await edge_count(pgwork_dsn) == 0


async def test_finished_dependants_do_not_hold_their_blocker_back(
    make_client: ClientFactory, pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    blocker = await start(client, pgwork_dsn, "kept")
    done = await start(client, pgwork_dsn, "kept", blockers=[blocker])
    await end(pgwork_dsn, blocker, "completed")
    await end(pgwork_dsn, done, "completed")

    assert await client.delete_chains(conn, [blocker]) == 1
    await conn.commit()

    assert await job_count(pgwork_dsn, [done]) == 1


async def test_a_failed_dependant_may_be_retried_so_it_holds_its_blocker(
    make_client: ClientFactory, pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    blocker = await start(client, pgwork_dsn, "kept")
    failed = await start(client, pgwork_dsn, "kept", blockers=[blocker])
    await end(pgwork_dsn, blocker, "completed")
    await end(pgwork_dsn, failed, "failed")

    with pytest.raises(ChainHasDependantsError):
        await client.delete_chains(conn, [blocker])


# --- retention -------------------------------------------------------------------------


async def test_purge_deletes_only_ended_chains_past_their_types_retention(
    make_client: ClientFactory, pgwork_dsn: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    client = await make_client(registry())
    expired = [await start(client, pgwork_dsn, "short") for _ in range(3)]
    await client.complete_job(
        conn, expired[0], continue_with=Continue(client.registry.get("short.next"), Item(n=1))
    )
    await conn.commit()
    for chain_id, status in zip(expired, ["completed", "failed", "cancelled"], strict=True):
        await end(pgwork_dsn, chain_id, status, ago=timedelta(hours=2))
    recent = await start(client, pgwork_dsn, "short")
    await end(pgwork_dsn, recent, "completed", ago=timedelta(minutes=10))
    active = await start(client, pgwork_dsn, "short")
    await execute(
        pgwork_dsn,
        "UPDATE pgwork.jobs SET created_at = now() - interval '1 day' WHERE id = %s",
        [active],
    )
    no_retention = await start(client, pgwork_dsn, "kept")
    await end(pgwork_dsn, no_retention, "completed", ago=timedelta(days=30))

    assert await client.purge_expired() == 3
    assert await client.purge_expired() == 0

    assert await job_count(pgwork_dsn, expired) == 0
    assert await job_count(pgwork_dsn, [recent, active, no_retention]) == 3


async def test_purge_deletes_at_most_limit_chains_per_call(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    await ended(client, pgwork_dsn, "short", 5, "completed", ago=timedelta(hours=3))

    assert [await client.purge_expired(limit=2) for _ in range(4)] == [2, 2, 1, 0]
    assert await job_count(pgwork_dsn) == 0


async def test_purge_keeps_a_chain_until_its_dependants_have_finished(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    blocker = await start(client, pgwork_dsn, "short")
    waiting = await start(client, pgwork_dsn, "kept", blockers=[blocker])
    await end(pgwork_dsn, blocker, "completed", ago=timedelta(hours=2))
    await execute(pgwork_dsn, "UPDATE pgwork.jobs SET status = 'pending' WHERE id = %s", [waiting])

    assert await client.purge_expired() == 0

    await end(pgwork_dsn, waiting, "completed")
    assert await client.purge_expired() == 1
    assert await job_count(pgwork_dsn, [blocker]) == 0
    assert await job_count(pgwork_dsn, [waiting]) == 1


async def test_a_registry_that_keeps_everything_purges_nothing(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    reg = JobTypeRegistry()
    reg.job_type("short", input=Item, retention=Retention.forever())
    client = await make_client(reg)
    await end(
        pgwork_dsn, await start(client, pgwork_dsn, "short"), "completed", ago=timedelta(days=9)
    )

    assert await client.purge_expired() == 0
    assert await job_count(pgwork_dsn) == 1


@pytest.mark.parametrize("limit", [0, -1, "100", 2.5, True, 10**20])
async def test_a_purge_limit_that_is_not_a_batch_size_is_refused_before_any_sql(
    make_client: ClientFactory, limit: Any
) -> None:
    client = await make_client(registry())
    with pytest.raises(ConfigurationError, match="limit"):
        await client.purge_expired(limit=limit)


async def test_a_sweep_that_finds_another_in_progress_returns_zero_at_once(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    await ended(client, pgwork_dsn, "short", 3, "completed", ago=timedelta(hours=2))
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as holder:
        await holder.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [retention_lock_key("pgwork")]
        )
        with anyio.fail_after(5):
            assert await client.purge_expired() == 0
        assert await job_count(pgwork_dsn) == 3
        await holder.rollback()

    assert await client.purge_expired() == 3


async def test_two_concurrent_sweeps_delete_each_expired_chain_once(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    first, second = await make_client(registry()), await make_client(registry())
    await ended(first, pgwork_dsn, "short", 20, "completed", ago=timedelta(hours=2))
    results: list[int] = []

    async def sweep(client: Client) -> None:
        results.append(await client.purge_expired(limit=100))

    async with anyio.create_task_group() as tg:
        tg.start_soon(sweep, first)
        tg.start_soon(sweep, second)

    assert sorted(results) == [0, 20]
    assert await job_count(pgwork_dsn) == 0
