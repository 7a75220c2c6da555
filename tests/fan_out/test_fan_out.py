"""A handler fans out to a thousand child chains and hands on to a step that waits for
them; real workers run it all.

Every child completes: the step runs once, after the last, and reads a thousand
outputs in order. One child fails, under each of the step type's blocker policies:
``fail`` and ``cancel`` end the step (and its chain) at that child's end, the others
still run; ``unblock`` lets the step run once every child ended, reading ``None`` for
the failed one. ``need=3`` of ten releases the step at the third completion.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from tests.engine.conftest import eventually

from pgwork import ChainStatus, JobStatus
from pgwork.errors import ChainFailedError
from pgwork.job_types import BlockerFailurePolicy

from ._kit import Batch, Done, FanOut, Summary, rows, start, statuses

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

CHILDREN = 1000


async def test_a_thousand_children_complete_and_the_step_reads_every_output_once(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    fan = FanOut()
    client = await make_client(fan.registry)
    await workers(client=client, processors=fan.processors(), max_slots=50)
    chain_id = await start(pgwork_dsn, client, fan, Batch(id="b", size=CHILDREN))

    summary = await client.await_chain(chain_id, timeout=120)
    assert summary == Summary(read=CHILDREN, missing=0)
    assert fan.read == [[Done(index=i) for i in range(CHILDREN)]]
    assert fan.runs == {"split": 1, "part": CHILDREN, "collect": 1}
    assert await statuses(pgwork_dsn, "part") == {"completed": CHILDREN}
    # Each child is a chain of its own, marked as having a dependant.
    [(roots, marked)] = await rows(
        pgwork_dsn,
        "SELECT count(*) FILTER (WHERE id = chain_id), count(*) FILTER"
        " (WHERE chain_has_dependants) FROM pgwork.jobs WHERE type_name = 'part'",
    )
    assert (roots, marked) == (CHILDREN, CHILDREN)
    [(needed, met, open_)] = await rows(
        pgwork_dsn,
        "SELECT blockers_needed, blockers_met, blockers_open FROM pgwork.jobs"
        " WHERE type_name = 'collect'",
    )
    assert (needed, met, open_) == (CHILDREN, CHILDREN, 0)


@pytest.mark.parametrize("policy", ["fail", "cancel", "unblock"])
async def test_one_failing_child_of_a_thousand_under_each_policy(
    pgwork_dsn: str, make_client: Any, workers: Any, policy: BlockerFailurePolicy
) -> None:
    fan = FanOut(policy=policy)
    client = await make_client(fan.registry)
    await workers(client=client, processors=fan.processors(), max_slots=50)
    chain_id = await start(pgwork_dsn, client, fan, Batch(id="b", size=CHILDREN, fail_at=500))

    if policy == "unblock":
        summary = await client.await_chain(chain_id, timeout=120)
        assert summary == Summary(read=CHILDREN - 1, missing=1)
        [outputs] = fan.read
        assert outputs[500] is None
        assert [o for o in outputs if o is not None] == [
            Done(index=i) for i in range(CHILDREN) if i != 500
        ]
    else:
        with pytest.raises(ChainFailedError):
            await client.await_chain(chain_id, timeout=120)
        chain = await client.get_chain(chain_id)
        ended = ChainStatus.FAILED if policy == "fail" else ChainStatus.CANCELLED
        assert chain.status is ended
        [step] = [j for j in await client.list_chain_jobs(chain_id) if j.type_name == "collect"]
        assert step.status is (JobStatus.FAILED if policy == "fail" else JobStatus.CANCELLED)
        assert step.attempt == 0  # it never ran
        assert step.last_attempt_error is not None
        assert "BlockerChainEnded" in step.last_attempt_error.type
        [(failed_child,)] = await rows(
            pgwork_dsn, "SELECT id FROM pgwork.jobs WHERE type_name = 'part' AND status = 'failed'"
        )
        assert str(failed_child) in step.last_attempt_error.message

    # The other children run on to their end either way; the step never runs twice.
    async def all_ended() -> bool:
        return sum((await statuses(pgwork_dsn, "part")).values()) == CHILDREN and (
            await statuses(pgwork_dsn, "part")
        ) == {"completed": CHILDREN - 1, "failed": 1}

    await eventually(all_ended, timeout=120, what="every child's end")
    await anyio.sleep(0.5)
    assert fan.runs["collect"] == (1 if policy == "unblock" else 0)
    assert fan.runs["part"] == CHILDREN


async def test_need_three_of_ten_releases_the_step_at_the_third_completion(
    pgwork_dsn: str, make_client: Any, workers: Any
) -> None:
    fan = FanOut()
    gates = [anyio.Event() for _ in range(10)]
    finished: list[int] = []

    async def gated_part(attempt: Any) -> Done:
        index = attempt.job.input.index
        await gates[index].wait()
        finished.append(index)
        return Done(index=index)

    client = await make_client(fan.registry)
    processors = fan.processors() | {fan.part: gated_part}
    await workers(client=client, processors=processors, max_slots=12)
    chain_id = await start(pgwork_dsn, client, fan, Batch(id="b", size=10, need=3))

    async def step_status() -> str:
        [(status,)] = await rows(
            pgwork_dsn, "SELECT status::text FROM pgwork.jobs WHERE type_name = 'collect'"
        )
        return str(status)

    async def completed(count: int) -> bool:
        return (await statuses(pgwork_dsn, "part")).get("completed", 0) == count

    await eventually(lambda: _exists(pgwork_dsn), what="the step")
    for index, count in ((7, 1), (2, 2)):
        gates[index].set()
        await eventually(lambda count=count: completed(count), what=f"{count} completions")
        assert await step_status() == "blocked"
    gates[4].set()
    assert await fan.collected(20)
    assert await client.await_chain(chain_id, timeout=20) == Summary(read=3, missing=7)
    [outputs] = fan.read
    assert [i for i, o in enumerate(outputs) if o is not None] == [2, 4, 7]

    # The others still run to their end; their ends change nothing.
    for gate in gates:
        gate.set()
    await eventually(lambda: completed(10), what="every child's end")
    await anyio.sleep(0.5)
    assert fan.runs["collect"] == 1
    [(met, open_)] = await rows(
        pgwork_dsn,
        "SELECT blockers_met, blockers_open FROM pgwork.jobs WHERE type_name = 'collect'",
    )
    assert (met, open_) == (3, 7)


async def _exists(dsn: str) -> bool:
    return bool(await rows(dsn, "SELECT 1 FROM pgwork.jobs WHERE type_name = 'collect'"))
