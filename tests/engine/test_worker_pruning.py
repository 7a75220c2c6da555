"""A worker's maintenance prunes workers stopped longer than the retention, and only them."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from pydantic import BaseModel

from pgwork import JobTypeRegistry
from pgwork.adapters.state import WorkerInfo
from pgwork.worker._side.maintenance import WORKER_RETENTION_S, Maintenance

from .conftest import ClientFactory, eventually

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
