"""What the retention tests share: chains started and ended as the engine would, their
end moved into the past, counts of what is left, and the control builds' statements.

``end`` rewrites a chain's times (and status) in place, so a test can put a chain's
end hours or days back without waiting, its ``dedup_until`` left as its enqueue wrote
it; ``age`` moves a whole ended chain back, that too.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg

from pgwork import ChainStart, Client, StartedChain
from pgwork.postgres.state import PostgresStateAdapter

from .conftest import scalar

__all__ = ["age", "end", "ended", "execute", "job_count", "start", "start_many", "without"]


async def execute(dsn: str, query: str, params: Any = None) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        await c.execute(query, params)


async def start(
    client: Client, dsn: str, type_name: str, input: Any = None, **options: Any
) -> UUID:
    """Start (and commit) one chain of ``type_name`` (``start_chain``'s ``options``); its
    id."""
    job_type = client.registry.get(type_name)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        started: StartedChain[Any, Any] = await client.start_chain(
            conn, job_type, input if input is not None else job_type.input_model(), **options
        )
        await conn.commit()
    return started.id


async def start_many(client: Client, dsn: str, type_name: str, count: int) -> list[UUID]:
    """Start (and commit) ``count`` chains of ``type_name`` in one transaction."""
    job_type = client.registry.get(type_name)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        started = await client.start_chains(
            conn, [ChainStart(job_type, job_type.input_model()) for _ in range(count)]
        )
        await conn.commit()
    return [s.id for s in started]


async def end(
    dsn: str, chain_ids: UUID | list[UUID], status: str, *, ago: timedelta = timedelta(0)
) -> None:
    """End chains ``ago`` in the past (each created a minute before), as the engine would."""
    ids = chain_ids if isinstance(chain_ids, list) else [chain_ids]
    await execute(
        dsn,
        """
        UPDATE pgwork.jobs
        SET status = %(s)s::text::pgwork.job_status,
            completed_at = now() - %(ago)s,
            created_at = now() - %(ago)s - interval '1 minute',
            chain_status = CASE WHEN id = chain_id THEN %(s)s::text::pgwork.chain_status END,
            chain_completed_at = CASE WHEN id = chain_id THEN now() - %(ago)s END
        WHERE chain_id = ANY(%(ids)s)
        """,
        {"s": status, "ago": ago, "ids": ids},
    )


async def ended(
    client: Client, dsn: str, type_name: str, count: int, status: str, *, ago: timedelta
) -> list[UUID]:
    """``count`` chains of ``type_name`` started and ended ``status`` ``ago`` in the
    past (``start_many``, then ``end``); their ids."""
    chain_ids = await start_many(client, dsn, type_name, count)
    await end(dsn, chain_ids, status, ago=ago)
    return chain_ids


async def age(dsn: str, chain_id: UUID, ago: timedelta) -> None:
    """Move an ended chain's times ``ago`` into the past (its dedup window's end too),
    its status as it ended."""
    await execute(
        dsn,
        """
        UPDATE pgwork.jobs
        SET completed_at = completed_at - %(ago)s,
            created_at = created_at - %(ago)s,
            chain_completed_at = chain_completed_at - %(ago)s,
            dedup_until = dedup_until - %(ago)s
        WHERE chain_id = %(id)s
        """,
        {"ago": ago, "id": chain_id},
    )


async def job_count(dsn: str, chain_ids: list[UUID] | None = None) -> int:
    if chain_ids is None:
        return int(await scalar(dsn, "SELECT count(*) FROM pgwork.jobs"))
    return int(
        await scalar(dsn, "SELECT count(*) FROM pgwork.jobs WHERE chain_id = ANY(%s)", chain_ids)
    )


def without(client: Client, part: bytes, instead: bytes = b"true") -> None:
    """A control build: the client's retention statements with ``part`` (a condition
    that keeps chains) replaced by ``instead``. Fails if neither statement has it, so a
    control cannot pass for a statement that changed."""
    state = client.state
    assert isinstance(state, PostgresStateAdapter)
    queries = state.statements.queries
    lock, delete = queries.lock_expired_chains, queries.delete_expired_chains
    assert part in lock or part in delete, f"no {part!r} in the retention statements"
    state.statements = replace(
        state.statements,
        queries=replace(
            queries,
            lock_expired_chains=lock.replace(part, instead),
            delete_expired_chains=delete.replace(part, instead),
        ),
    )
