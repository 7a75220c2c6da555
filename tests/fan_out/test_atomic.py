"""An atomic handler's children and its step commit with what the handler wrote, or
not at all.

The handler writes a row that a deferred constraint refuses at its first attempt's
COMMIT, after the completion wrote its children and step in the same transaction: the
whole transaction rolls back, the attempt counts as failed, and the retry fans out
again. The children exist once. The control build commits the children in a
transaction of their own: the failed attempt's children then stay, beside the retry's.
A worker that groups atomic attempts (one transaction for several) fans out the same.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from pgwork import Attempt, PostgresNotifyAdapter, PostgresStateAdapter, create_client

from ._kit import (
    Batch,
    Done,
    FanOut,
    Part,
    RefusedOnce,
    Summary,
    children_apart,
    rows,
    start,
    statuses,
)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

PROMPT = 30.0
SIZE = 5


@pytest.mark.parametrize("build", ["one-transaction", "control-children-apart"])
async def test_an_atomic_fan_out_commits_with_the_handlers_writes_or_not_at_all(
    pgwork_dsn: str, make_client: Any, workers: Any, build: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if build.startswith("control"):
        monkeypatch.setattr(PostgresStateAdapter, "insert_jobs", children_apart())
    fan = FanOut(split_mode="atomic", collect_mode="atomic")
    split = RefusedOnce(fan, SIZE)
    await split.create(pgwork_dsn)
    client = await make_client(fan.registry)
    processors = fan.processors() | {fan.split: split}
    await workers(client=client, processors=processors)
    chain_id = await start(pgwork_dsn, client, fan, Batch(id="b", size=SIZE))

    assert await client.await_chain(chain_id, timeout=PROMPT) == Summary(read=SIZE, missing=0)
    assert list(split.started) == [1, 2]
    assert await rows(pgwork_dsn, "SELECT k FROM fan_once") == [(1,)]
    [split_job] = [j for j in await client.list_chain_jobs(chain_id) if j.type_name == "split"]
    assert split_job.attempt == 2
    assert split_job.attempt_history[0].error.message.find("fan_once_k") >= 0
    parts = await statuses(pgwork_dsn, "part")
    if build.startswith("control"):
        assert sum(parts.values()) == 2 * SIZE  # the failed attempt's children stayed
        return
    assert parts == {"completed": SIZE}
    assert fan.runs["collect"] == 1


async def test_grouped_atomic_attempts_fan_out_in_their_groups_transaction(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    fan = FanOut(split_mode="atomic", part_mode="atomic", collect_mode="atomic")
    client = await make_client(fan.registry)
    await workers(client=client, processors=fan.processors(), atomic_group=8, max_slots=8)
    # 300 children go by COPY, inside the group's transaction and the member's savepoint.
    sizes = (40, 300, 40)
    chain_ids = [
        await start(pgwork_dsn, client, fan, Batch(id=f"b{n}", size=size))
        for n, size in enumerate(sizes)
    ]
    for chain_id, size in zip(chain_ids, sizes, strict=True):
        assert await client.await_chain(chain_id, timeout=PROMPT) == Summary(read=size, missing=0)
    assert fan.runs == {"split": 3, "part": sum(sizes), "collect": 3}
    assert await statuses(pgwork_dsn, "part") == {"completed": sum(sizes)}


async def test_atomic_children_ending_together_settle_their_parent_on_their_own_connections(
    pgwork_dsn: str, workers: Any
) -> None:
    """Every slot runs an atomic child, on a pool no larger than the slots: each child's
    end settles the waiting step on the connection its attempt already holds. Settling
    on a second pooled connection, each attempt would wait for one that only another
    attempt's end gives back, and none ends."""
    slots = 3
    fan = FanOut(part_mode="atomic")
    started = 0
    all_running = anyio.Event()

    async def part(attempt: Attempt[Part, Done]) -> Done:
        nonlocal started
        started += 1
        if started == slots:
            all_running.set()
        await all_running.wait()
        return await fan.do_part(attempt)

    state = await PostgresStateAdapter.connect(pgwork_dsn, max_size=slots)
    client = create_client(
        state_adapter=state, notify_adapter=PostgresNotifyAdapter(pgwork_dsn), registry=fan.registry
    )
    try:
        await workers(
            client=client, processors=fan.processors() | {fan.part: part}, max_slots=slots
        )
        chain_id = await start(pgwork_dsn, client, fan, Batch(id="b", size=slots))
        summary = await client.await_chain(chain_id, timeout=PROMPT)
        assert summary == Summary(read=slots, missing=0)
        assert started == slots
    finally:
        await client.close()
