"""A worker's maintenance prunes workers stopped longer than the retention, and only them;
and flow control's rows that nothing reads any more."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import JobTypeRegistry
from pgwork.adapters.state import WorkerInfo
from pgwork.worker._side.maintenance import WORKER_RETENTION_S, Maintenance

from .conftest import ClientFactory, eventually, scalar

pytestmark = pytest.mark.anyio


class Num(BaseModel):
    n: int


def info(worker_id: str) -> WorkerInfo:
    return WorkerInfo(
        id=worker_id, host="h", pid=1, queues=("default",), job_types=("t",), max_slots=1
    )


@pytest.mark.parametrize("build", ["pruning", "control-no-pruning"])
async def test_maintenance_removes_stopped_workers_after_the_retention(
    make_client: ClientFactory, build: str
) -> None:
    reg = JobTypeRegistry()
    reg.job_type("t", input=Num)
    client = await make_client(reg)
    state = client.state
    await state.register_worker(worker=info("gone"))
    assert await state.heartbeat(worker_id="gone", active_slots=0, status="stopped")
    await state.register_worker(worker=info("running"))
    # The control keeps the default retention: a day, so nothing is old enough.
    retention = 0.2 if build == "pruning" else WORKER_RETENTION_S
    maintenance = Maintenance(client, [], tick=0.05, worker_retention=retention, prune_every=0.1)

    async def listed() -> set[str]:
        return {w.id for w in await state.list_workers(alive_within_s=3600)}

    async def gone_is_pruned() -> bool:
        return "gone" not in await listed()

    rounds = 0
    three_rounds = anyio.Event()
    prune = maintenance.prune_workers

    async def counted() -> None:
        nonlocal rounds
        await prune()
        rounds += 1
        if rounds == 3:
            three_rounds.set()

    maintenance.prune_workers = counted  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(maintenance.run_forever)
        try:
            if build == "pruning":
                await eventually(gone_is_pruned, timeout=10, what="the stopped worker pruned")
            else:
                with anyio.fail_after(10):
                    await three_rounds.wait()  # pruning ran; the control keeps the worker
        finally:
            tg.cancel_scope.cancel()
    expected: dict[str, Any] = {"pruning": {"running"}, "control-no-pruning": {"gone", "running"}}
    assert await listed() == expected[build]


async def test_maintenance_removes_flow_control_rows_nothing_reads(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    """A key whose pause has passed loses its row; a key still paused and the type keep
    theirs. A start older than any rate's window goes (its type is rated no more, so no
    acquire deletes it); a recent one stays. Control: without the step in the
    maintenance's round, nothing goes and the wait times out."""
    reg = JobTypeRegistry()
    sync = reg.job_type("sync", input=Num, key_concurrency=2)
    client = await make_client(reg)
    await client.set_limits(sync, key_concurrency=3)
    await client.pause_limits(sync, key="tenant-1", after=timedelta(milliseconds=100))
    await client.pause_limits(sync, key="tenant-2", after=timedelta(hours=1))
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO pgwork.job_starts (type_name, limit_group, started_at) VALUES"
            " ('unrated', '', now() - interval '25 hours'), ('sync', '', now())"
        )

    async def rows() -> tuple[str, ...]:
        return tuple(
            await scalar(
                pgwork_dsn,
                "SELECT array_agg(r ORDER BY r) FROM ("
                " SELECT 'limits:' || limit_key AS r FROM pgwork.job_limits"
                " UNION ALL SELECT 'starts:' || type_name FROM pgwork.job_starts) AS x",
            )
        )

    async def pruned() -> bool:
        return await rows() == ("limits:", "limits:tenant-2", "starts:sync")

    maintenance = Maintenance(client, [], tick=0.05, prune_every=0.1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(maintenance.run_forever)
        try:
            await eventually(pruned, timeout=10, what="the idle flow-control rows pruned")
        finally:
            tg.cancel_scope.cancel()
