"""No message on the channel can stop a worker or spoil its timers.

Anyone who can connect may NOTIFY on a schema's channel, and a newer pgwork may send
kinds or reasons an older worker does not know. Each test sends one family of
payloads a worker cannot use from a connection of its own, then proves the worker
still works by the two mechanisms those payloads could break: a job enqueued for it
starts by notification, and a job scheduled a second ahead starts by its timer. The
worker polls every 30 s, so neither can be the poll.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest

from pgwork import (
    InProcessNotifyAdapter,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
)
from pgwork.adapters.notify import Notice
from pgwork.worker._wakeups import MAX_TIMERS, Wakeups

from ._wakeup_kit import PROMPT, Num, Starts, enqueue

pytestmark = pytest.mark.anyio


QUEUE = "hostile"


def _unknown_aborts() -> list[str]:
    job = uuid.uuid4()
    return [
        f"abort|{job}||preempted||",  # a reason a newer version might add
        f"abort|{job}||CANCELLED||",
        "abort|not-a-uuid||cancelled||",
        "abort|||cancelled||",  # no job
        f"abort|{job}|{job}|cancelled|nan|",
    ]


def _bad_due_times() -> list[str]:
    odd = ["nan", "NaN", "inf", "-inf", "1e999", "-1e999", "1e308", "-1e308", "-5", "0"]
    odd += ["garbage", "1_0", " ", "0x10"]
    return [f"ready||||{at}|{QUEUE}" for at in odd]


def _garbage() -> list[str]:
    return [
        "",
        "|",
        "|||||",
        "unknown|||||",
        "reconnected|||||",  # the listener's own kind, never a payload
        "probe",
        "ready",
        f"ready|zzz||||{QUEUE}",
        "chain_done||not-a-uuid|||",
        "chain_done|||||",
        "ready|é|ü|ß|€|" + QUEUE,
        "\x01\x02\x7f\ufffd\U0001f4a5|ready||||",
        "ready||||" + "9" * 500 + "|" + QUEUE,
        "x" * 7_900,  # near the server's limit on a payload
        "|".join(["ready"] * 1_000),
    ]


def _far_due_times() -> list[str]:
    # More distinct due times than a worker keeps timers for, all a day or more away.
    base = time.time() + 86_400
    return [f"ready||||{base + n}|{QUEUE}" for n in range(MAX_TIMERS + 100)]


async def _notify(dsn: str, channel: str, payloads: Sequence[str]) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p", (channel, list(payloads))
        )


@pytest.mark.parametrize(
    "payloads",
    [_unknown_aborts, _bad_due_times, _garbage, _far_due_times],
    ids=["unknown-aborts", "bad-due-times", "garbage", "far-due-times"],
)
async def test_a_worker_ignores_notices_it_cannot_use_and_still_wakes_by_notice_and_timer(
    pgwork_dsn: str, clients: Any, start_worker: Any, payloads: Any
) -> None:
    reg = JobTypeRegistry()
    job_type = reg.job_type("sturdy", queue=QUEUE, input=Num)
    client = await clients(reg)
    starts = Starts()
    await start_worker(client=client, processors={job_type: starts})
    await _notify(pgwork_dsn, PostgresNotifyAdapter(pgwork_dsn).channel, payloads())

    await enqueue(pgwork_dsn, client, job_type)
    assert await starts.within(PROMPT), "the worker did not take a job by notification"
    scheduled = time.monotonic()
    await enqueue(pgwork_dsn, client, job_type, schedule=timedelta(seconds=1))
    assert await starts.within(1 + PROMPT, count=2), "the worker's timer did not start a job"
    assert starts.times[1] - scheduled >= 0.9


async def test_a_listener_logs_what_it_ignores_once_not_per_payload(
    pgwork_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    adapter = PostgresNotifyAdapter(pgwork_dsn)
    marker = f"ready|||||{QUEUE}"
    try:
        async with adapter.listen() as listener:
            with caplog.at_level(logging.WARNING, logger="pgwork.notify"):
                await _notify(pgwork_dsn, adapter.channel, [*_garbage(), marker])
                heard: list[Any] = []
                with anyio.fail_after(PROMPT):
                    while not any(n.queue == QUEUE for n in heard):
                        heard += await listener.wait(PROMPT)
    finally:
        await adapter.close()
    ignored = [r for r in caplog.records if "could not read" in r.getMessage()]
    assert len(ignored) == 1, [r.getMessage() for r in ignored]
    assert [n.kind for n in heard] == ["ready"]


@pytest.mark.parametrize(
    "notices",
    [
        [Notice(kind="abort", job_id=uuid.uuid4(), reason="preempted")],
        [Notice(kind="ready", queue=QUEUE, at=at) for at in (math.nan, math.inf, -math.inf)],
    ],
    ids=["unknown-abort-reason", "due-times-that-are-no-time"],
)
async def test_a_worker_ignores_notices_it_cannot_use_from_any_notify_adapter(
    pgwork_dsn: str, start_worker: Any, notices: list[Notice]
) -> None:
    # The in-process adapter hands notices over as they were published, undecoded:
    # the worker itself must not be stopped, nor its timers spoiled, by one.
    reg = JobTypeRegistry()
    job_type = reg.job_type("sturdy", queue=QUEUE, input=Num)
    notify = InProcessNotifyAdapter()
    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(pgwork_dsn),
        notify_adapter=notify,
        registry=reg,
    )
    starts = Starts()
    worker = await start_worker(client=client, processors={job_type: starts})
    try:
        await notify.publish(None, notices=notices)
        await enqueue(pgwork_dsn, client, job_type)
        # This adapter delivers at once, before the enqueue commits: say it again after.
        await notify.publish(None, notices=[Notice(kind="ready", queue=QUEUE)])
        assert await starts.within(PROMPT), "the worker did not take a job by notification"
        scheduled = time.monotonic()
        await enqueue(pgwork_dsn, client, job_type, schedule=timedelta(seconds=1))
        assert await starts.within(1 + PROMPT, count=2), "the worker's timer did not start a job"
        assert starts.times[1] - scheduled >= 0.9
    finally:
        await worker.stop(grace_period=0)
        await client.close()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_due_time_that_is_no_time_leaves_the_next_timer_first(bad: float) -> None:
    now = [100.0]
    wakeups = Wakeups(clock=lambda: now[0])
    wakeups.due_in(bad)
    wakeups.due_in(1.0)
    assert wakeups.deadline() == 101.0
    now[0] = 101.0
    generation = wakeups.generation
    wakeups.tick()
    assert wakeups.generation == generation + 1  # the timer fired: a hint
    assert wakeups.deadline() == math.inf
