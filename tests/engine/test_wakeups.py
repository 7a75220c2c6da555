"""What wakes an idle worker: notifications and due times, never a spin or the poll.

Every test here runs its workers with a 30 s poll interval, so a job that starts within
a second or two was started by a notification or a due-time timer. Each mechanism has
a control build with that mechanism taken out (a listener deaf to the notices that
carry it, an acquire that never marks the queues drained, no look-ahead), and the
control must show the failure the mechanism prevents.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from pgwork import (
    Attempt,
    Continue,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    RetryPolicy,
    create_client,
    create_in_process_worker,
)
from pgwork.worker._wakeups import Wakeups

from ._wakeup_kit import (
    PROMPT,
    Num,
    Starts,
    enqueue,
    no_due,
    no_ready,
)
from .conftest import eventually

pytestmark = pytest.mark.anyio


# --- an idle worker costs almost nothing --------------------------------------------

IDLE_S = 5.0


async def _transactions(admin_dsn: str, dbname: str) -> int:
    """Transactions the server counted in ``dbname``, once every backend of it ended
    (each flushes its counts when it exits), read from another database."""
    async with await psycopg.AsyncConnection.connect(admin_dsn, autocommit=True) as admin:
        last = -1
        for _ in range(50):
            await admin.execute("SELECT pg_stat_clear_snapshot()")
            cur = await admin.execute(
                "SELECT xact_commit + xact_rollback,"
                " (SELECT count(*) FROM pg_stat_activity WHERE datname = %s)"
                " FROM pg_stat_database WHERE datname = %s",
                (dbname, dbname),
            )
            row = await cur.fetchone()
            assert row is not None
            count, backends = int(row[0]), int(row[1])
            if backends == 0 and count == last:
                return count
            last = count
            await anyio.sleep(0.2)
    raise AssertionError(f"the transaction count of {dbname} did not settle")


@pytest.mark.parametrize("build", ["drained-acquires-rest", "control-spins"])
async def test_an_idle_worker_with_default_settings_costs_almost_nothing(
    pgwork_dsn: str,
    pg_server_dsn: str,
    build: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if build == "control-spins":
        # The mechanism removed: a short acquire never marks the queues drained.
        monkeypatch.setattr(Wakeups, "acquired", lambda self, *a, **k: None)
    reg = JobTypeRegistry()
    job_type = reg.job_type("idle", input=Num)
    client = create_client(
        state_adapter=await PostgresStateAdapter.connect(pgwork_dsn),
        notify_adapter=PostgresNotifyAdapter(pgwork_dsn),
        registry=reg,
    )
    worker = create_in_process_worker(client=client, processors={job_type: Starts()})
    try:
        await worker.start()
        cpu = time.process_time()
        await anyio.sleep(IDLE_S)
        cpu = time.process_time() - cpu
    finally:
        await worker.stop()
        await client.close()
    transactions = await _transactions(pg_server_dsn, conninfo_to_dict(pgwork_dsn)["dbname"])
    if build == "control-spins":
        assert transactions > 500, f"the control build made only {transactions} transactions"
        return
    # Start and stop (schema check, register, first acquire, look-ahead, stop mark)
    # take about ten; idling 5 s: two or three polls, a heartbeat, a reap. Counted
    # 22-26 run alone, and 30 in two loaded full-suite runs; the spinning control makes
    # hundreds, so the bound has room without letting a busy loop through.
    print(f"idle {IDLE_S}s: {transactions} transactions, {cpu:.3f}s CPU")
    assert transactions < 45, f"{transactions} transactions for {IDLE_S}s idle"
    assert cpu < 0.02 * IDLE_S, f"{cpu:.3f}s CPU in {IDLE_S}s idle"


# --- every path that makes a job ready wakes an idle worker by notification ----------


@pytest.mark.parametrize("build", ["notified", "control-deaf"])
async def test_an_enqueue_wakes_an_idle_worker(
    pgwork_dsn: str, clients: Any, start_worker: Any, build: str
) -> None:
    reg = JobTypeRegistry()
    job_type = reg.job_type("wake", input=Num)
    client = await clients(reg, drop=None if build == "notified" else no_ready)
    starts = Starts()
    await start_worker(client=client, processors={job_type: starts})
    await enqueue(pgwork_dsn, client, job_type)
    assert await starts.within(PROMPT) is (build == "notified")


@pytest.mark.parametrize("build", ["notified", "control-deaf"])
async def test_a_queue_named_with_a_bar_and_spaces_still_wakes_its_worker(
    pgwork_dsn: str, clients: Any, start_worker: Any, build: str
) -> None:
    # "|" once split the notice; the queue now travels last, so any allowed name survives.
    queue = "emails | urgent now"
    reg = JobTypeRegistry()
    job_type = reg.job_type("wake", input=Num, queue=queue)
    client = await clients(reg, drop=None if build == "notified" else no_ready)
    starts = Starts()
    await start_worker(client=client, processors={job_type: starts}, queues=[queue])
    await enqueue(pgwork_dsn, client, job_type)
    assert await starts.within(PROMPT) is (build == "notified")


@pytest.mark.parametrize("build", ["notified", "control-deaf"])
async def test_a_continuation_wakes_the_idle_worker_of_its_type(
    pgwork_dsn: str, clients: Any, start_worker: Any, build: str
) -> None:
    reg = JobTypeRegistry()
    second = reg.job_type("second", input=Num, entry=False)
    first = reg.job_type("first", input=Num, continue_with=[second])

    async def hand_on(attempt: Attempt[Num, Any]) -> Any:
        return Continue(second, Num(n=2))

    drop = None if build == "notified" else no_ready
    starts = Starts()
    await start_worker(client=await clients(reg), processors={first: hand_on})
    await start_worker(client=await clients(reg, drop=drop), processors={second: starts})
    await enqueue(pgwork_dsn, await clients(reg), first)
    assert await starts.within(PROMPT) is (build == "notified")


@pytest.mark.parametrize("build", ["notified", "control-deaf"])
async def test_a_resolved_blocker_wakes_the_idle_worker_of_the_dependant(
    pgwork_dsn: str, clients: Any, start_worker: Any, build: str
) -> None:
    reg = JobTypeRegistry()
    blocker = reg.job_type("blocker", input=Num)
    dependant = reg.job_type("dependant", input=Num)
    gate = anyio.Event()

    async def blocker_handler(attempt: Attempt[Num, Any]) -> None:
        await gate.wait()

    client = await clients(reg)
    drop = None if build == "notified" else no_ready
    starts = Starts()
    await start_worker(client=client, processors={blocker: blocker_handler})
    await start_worker(client=await clients(reg, drop=drop), processors={dependant: starts})
    first = await enqueue(pgwork_dsn, client, blocker)
    await enqueue(pgwork_dsn, client, dependant, blockers=[first])
    assert not await starts.within(0.5)  # blocked, and nobody polls
    gate.set()
    assert await starts.within(PROMPT) is (build == "notified")


@pytest.mark.parametrize("build", ["notified", "control-deaf"])
async def test_a_job_an_acquire_skipped_while_a_dependant_was_enqueued_wakes_its_worker(
    pgwork_dsn: str,
    clients: Any,
    start_worker: Any,
    build: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Enqueueing a job blocked on a chain locks the chain's root until commit. A worker
    # acquiring meanwhile skips that root (SKIP LOCKED) and takes its queues for
    # drained; the enqueue must announce the root's queue, or the job waits for the
    # poll. Here the worker's first acquire runs inside the enqueue's transaction.
    # The look-ahead is switched off: run after the commit, it would find the root due
    # and wake the worker itself, and only the notification is tested here.

    async def never(self: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(PostgresStateAdapter, "next_due", never)
    reg = JobTypeRegistry()
    blocker = reg.job_type("blocker", input=Num)
    dependant = reg.job_type("dependant", input=Num)
    client = await clients(reg)
    first = await enqueue(pgwork_dsn, client, blocker)
    starts = Starts()
    drop = None if build == "notified" else no_ready
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        await client.start_chain(conn, dependant, Num(n=2), blockers=[first])
        await start_worker(client=await clients(reg, drop=drop), processors={blocker: starts})
        assert not starts.times  # the root was locked: the first acquire found nothing
        await conn.commit()
    assert await starts.within(PROMPT) is (build == "notified")


@pytest.mark.parametrize("build", ["notified", "control-deaf"])
async def test_a_job_handed_back_by_a_stopping_worker_wakes_an_idle_one(
    pgwork_dsn: str, clients: Any, start_worker: Any, build: str
) -> None:
    reg = JobTypeRegistry()
    job_type = reg.job_type("handed", input=Num)
    running = anyio.Event()

    async def hang(attempt: Attempt[Num, Any]) -> None:
        running.set()
        await anyio.sleep_forever()

    client = await clients(reg)
    stopping = await start_worker(client=client, processors={job_type: hang}, max_slots=1)
    await enqueue(pgwork_dsn, client, job_type)
    with anyio.fail_after(PROMPT):
        await running.wait()
    drop = None if build == "notified" else no_ready
    starts = Starts()
    await start_worker(client=await clients(reg, drop=drop), processors={job_type: starts})
    await stopping.stop(grace_period=0)
    assert await starts.within(PROMPT) is (build == "notified")


# --- time has no notification: due times come from timers ----------------------------


@pytest.mark.parametrize("build", ["timed", "control-deaf-to-due-times"])
async def test_a_retry_starts_when_it_is_due_not_at_the_next_poll(
    clients: Any, pgwork_dsn: str, start_worker: Any, build: str
) -> None:
    reg = JobTypeRegistry()
    retry = RetryPolicy(initial=timedelta(seconds=1), maximum=timedelta(seconds=1))
    job_type = reg.job_type("flaky", input=Num, retry=retry, max_attempts=2)
    starts = Starts()

    async def fail_first(attempt: Attempt[Num, Any]) -> None:
        await starts(attempt)
        if attempt.job.attempt == 1:
            raise RuntimeError("first attempt fails")

    client = await clients(reg, drop=None if build == "timed" else no_due)
    await start_worker(client=client, processors={job_type: fail_first})
    await enqueue(pgwork_dsn, client, job_type)
    await starts.within(1.0 + PROMPT, count=2)
    if build != "timed":
        assert len(starts.times) == 1
        return
    assert len(starts.times) == 2
    assert 0.9 <= starts.times[1] - starts.times[0] <= 1.0 + PROMPT


@pytest.mark.parametrize("build", ["timed", "control-deaf-to-due-times"])
async def test_a_job_scheduled_while_the_worker_idles_starts_when_due(
    clients: Any, pgwork_dsn: str, start_worker: Any, build: str
) -> None:
    reg = JobTypeRegistry()
    job_type = reg.job_type("later", input=Num)
    client = await clients(reg, drop=None if build == "timed" else no_due)
    starts = Starts()
    await start_worker(client=client, processors={job_type: starts})
    enqueued = time.monotonic()
    await enqueue(pgwork_dsn, client, job_type, schedule=timedelta(seconds=1.5))
    started = await starts.within(1.5 + PROMPT)
    assert started is (build == "timed")
    if started:
        assert starts.times[0] - enqueued >= 1.4


@pytest.mark.parametrize("build", ["looks-back", "control-no-look-back"])
async def test_a_timer_that_fires_early_still_starts_the_job_when_due(
    clients: Any, pgwork_dsn: str, start_worker: Any, build: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's clock runs ahead of the database's, so its timer fires before the
    job is due and the acquire finds nothing; by the time it asks the database when
    the next job is due (a slow round trip), that job is due. It must still start now,
    not at the next poll."""
    ahead = 0.3
    due_at = Wakeups.due_at

    def early(self: Wakeups, epoch: float) -> None:
        due_at(self, epoch - ahead)

    next_due = PostgresStateAdapter.next_due
    looked_ahead_at_start = anyio.Event()

    async def slow(self: PostgresStateAdapter, **kwargs: Any) -> Any:
        if not looked_ahead_at_start.is_set():
            try:
                return await next_due(self, **kwargs)
            finally:
                looked_ahead_at_start.set()
        await anyio.sleep(2 * ahead)
        if build != "looks-back":
            kwargs["missed_after"] = None
        return await next_due(self, **kwargs)

    monkeypatch.setattr(Wakeups, "due_at", early)
    monkeypatch.setattr(PostgresStateAdapter, "next_due", slow)
    reg = JobTypeRegistry()
    job_type = reg.job_type("later", input=Num)
    client = await clients(reg)
    starts = Starts()
    await start_worker(client=client, processors={job_type: starts})
    with anyio.fail_after(PROMPT):
        await looked_ahead_at_start.wait()
    enqueued = time.monotonic()
    await enqueue(pgwork_dsn, client, job_type, schedule=timedelta(seconds=1))
    started = await starts.within(1 + PROMPT)
    assert started is (build == "looks-back")
    if started:
        assert starts.times[0] - enqueued >= 0.9


@pytest.mark.parametrize("build", ["looks-ahead", "control-no-look-ahead"])
async def test_a_job_scheduled_before_the_worker_started_starts_when_due(
    clients: Any, pgwork_dsn: str, start_worker: Any, build: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if build != "looks-ahead":

        async def never(self: Any, *, type_names: Sequence[str], queues: Sequence[str]) -> None:
            return None

        monkeypatch.setattr(PostgresStateAdapter, "next_due", never)
    reg = JobTypeRegistry()
    job_type = reg.job_type("planned", input=Num)
    client = await clients(reg)
    enqueued = time.monotonic()
    await enqueue(pgwork_dsn, client, job_type, schedule=timedelta(seconds=2))
    starts = Starts()
    await start_worker(client=client, processors={job_type: starts})
    started = await starts.within(2 + PROMPT)
    assert started is (build == "looks-ahead")
    if started:
        assert starts.times[0] - enqueued >= 1.9


# A staged hand-on, an atomic one, and atomic ones written in groups.
MODES = {
    "staged": ({"mode": "staged"}, {}),
    "atomic": ({"mode": "atomic"}, {}),
    "grouped": ({"mode": "atomic"}, {"atomic_group": 4}),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("build", ["timed", "control-deaf-to-due-times"])
async def test_a_delayed_continuation_starts_when_due_not_at_the_next_poll(
    clients: Any, pgwork_dsn: str, start_worker: Any, build: str, mode: str
) -> None:
    type_options, worker_options = MODES[mode]
    reg = JobTypeRegistry()
    second = reg.job_type("second", input=Num, entry=False)
    first = reg.job_type("first", input=Num, continue_with=[second], **type_options)
    handed_on: list[float] = []

    async def hand_on(attempt: Attempt[Num, Any]) -> Any:
        handed_on.append(time.monotonic())
        return Continue(second, Num(n=2), after=timedelta(seconds=1))

    starts = Starts()
    client = await clients(reg, drop=None if build == "timed" else no_due)
    await start_worker(client=client, processors={second: starts})
    await start_worker(client=await clients(reg), processors={first: hand_on}, **worker_options)
    await enqueue(pgwork_dsn, await clients(reg), first)
    started = await starts.within(1 + PROMPT)
    assert started is (build == "timed")
    if started:
        assert starts.times[0] - handed_on[0] >= 0.9


@pytest.mark.parametrize("build", ["timed", "control-deaf-to-due-times"])
async def test_a_scheduled_job_unblocked_before_its_time_starts_when_due(
    clients: Any, pgwork_dsn: str, start_worker: Any, build: str
) -> None:
    reg = JobTypeRegistry()
    blocker = reg.job_type("blocker", input=Num)
    dependant = reg.job_type("dependant", input=Num)
    starts = Starts()
    client = await clients(reg)
    await start_worker(client=client, processors={blocker: Starts()})
    await start_worker(
        client=await clients(reg, drop=None if build == "timed" else no_due),
        processors={dependant: starts},
    )
    gate = await enqueue(pgwork_dsn, client, blocker, schedule=timedelta(hours=1))
    enqueued = time.monotonic()
    await enqueue(pgwork_dsn, client, dependant, blockers=[gate], schedule=timedelta(seconds=2))
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        await client.trigger(conn, [gate.id])  # the blocker runs now, and ends
        await conn.commit()
    started = await starts.within(2 + PROMPT)
    assert started is (build == "timed")
    if started:
        assert starts.times[0] - enqueued >= 1.9


@pytest.mark.parametrize("build", ["timed", "control-deaf-to-due-times"])
async def test_a_scheduled_job_whose_blockers_already_ended_starts_when_due(
    clients: Any, pgwork_dsn: str, start_worker: Any, build: str
) -> None:
    reg = JobTypeRegistry()
    blocker = reg.job_type("blocker", input=Num)
    dependant = reg.job_type("dependant", input=Num)
    done = Starts()
    client = await clients(reg)
    await start_worker(client=client, processors={blocker: done})
    gate = await enqueue(pgwork_dsn, client, blocker)
    assert await done.within(PROMPT)

    async def ended() -> bool:
        return (await client.get_chain(gate.id)).status.value == "completed"

    await eventually(ended, timeout=PROMPT, what="the blocker chain to complete")
    starts = Starts()
    await start_worker(
        client=await clients(reg, drop=None if build == "timed" else no_due),
        processors={dependant: starts},
    )
    enqueued = time.monotonic()
    await enqueue(pgwork_dsn, client, dependant, blockers=[gate], schedule=timedelta(seconds=1.5))
    started = await starts.within(1.5 + PROMPT)
    assert started is (build == "timed")
    if started:
        assert starts.times[0] - enqueued >= 1.4


# --- the client's controls wake the idle worker they concern -------------------------


async def _drained(worker: Any) -> None:
    async def idle() -> bool:
        return not worker._wakeups.may_have_work and not worker._slots

    await eventually(idle, timeout=PROMPT, what="the worker to find its queues empty")


@pytest.mark.parametrize("build", ["notified", "control-deaf"])
async def test_resuming_a_queue_wakes_its_idle_worker(
    pgwork_dsn: str, clients: Any, start_worker: Any, build: str
) -> None:
    reg = JobTypeRegistry()
    job_type = reg.job_type("paused", input=Num, queue="held")
    client = await clients(reg, drop=None if build == "notified" else no_ready)
    starts = Starts()
    worker = await start_worker(client=client, processors={job_type: starts})
    await client.pause_queue("held")
    await enqueue(pgwork_dsn, client, job_type)
    assert not await starts.within(0.5)  # paused
    await _drained(worker)
    await client.resume_queue("held")
    assert await starts.within(PROMPT) is (build == "notified")


@pytest.mark.parametrize("build", ["notified", "control-deaf"])
async def test_triggering_a_scheduled_job_wakes_its_idle_worker(
    pgwork_dsn: str, clients: Any, start_worker: Any, build: str
) -> None:
    reg = JobTypeRegistry()
    job_type = reg.job_type("later", input=Num)
    client = await clients(reg, drop=None if build == "notified" else no_ready)
    starts = Starts()
    worker = await start_worker(client=client, processors={job_type: starts})
    started = await enqueue(pgwork_dsn, client, job_type, schedule=timedelta(hours=1))
    await _drained(worker)
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        await client.trigger(conn, [started.id])
        await conn.commit()
    assert await starts.within(PROMPT) is (build == "notified")


@pytest.mark.parametrize("build", ["notified", "control-deaf"])
async def test_retrying_a_failed_job_wakes_its_idle_worker(
    pgwork_dsn: str, clients: Any, start_worker: Any, build: str
) -> None:
    reg = JobTypeRegistry()
    job_type = reg.job_type("fragile", input=Num, max_attempts=1)
    starts = Starts()

    async def fail_first(attempt: Attempt[Num, Any]) -> None:
        await starts(attempt)
        if len(starts.times) == 1:
            raise RuntimeError("the only attempt fails")

    client = await clients(reg, drop=None if build == "notified" else no_ready)
    started = await enqueue(pgwork_dsn, client, job_type)
    # The worker's first acquire, at start, takes the job; it fails for good.
    worker = await start_worker(client=client, processors={job_type: fail_first})

    async def failed() -> bool:
        return (await client.get_job(started.id)).status.value == "failed"

    await eventually(failed, timeout=PROMPT, what="the job to fail")
    await _drained(worker)
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        await client.retry(conn, [started.id])
        await conn.commit()
    assert await starts.within(PROMPT, count=2) is (build == "notified")


@pytest.mark.parametrize("after", [None, timedelta(seconds=1)], ids=["now", "later"])
@pytest.mark.parametrize("build", ["notified", "control-deaf"])
async def test_a_continuation_given_by_complete_job_wakes_the_idle_worker_of_its_type(
    pgwork_dsn: str, clients: Any, start_worker: Any, build: str, after: timedelta | None
) -> None:
    reg = JobTypeRegistry()
    second = reg.job_type("second", input=Num, entry=False)
    first = reg.job_type("first", input=Num, continue_with=[second])
    client = await clients(reg)
    # Nobody runs ``first``: it waits, and is completed from outside (a webhook).
    waiting = await enqueue(pgwork_dsn, client, first, schedule=timedelta(hours=1))
    starts = Starts()
    await start_worker(
        client=await clients(reg, drop=None if build == "notified" else no_ready),
        processors={second: starts},
    )
    completed = time.monotonic()
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        await client.complete_job(
            conn, waiting.id, continue_with=Continue(second, Num(n=2), after=after)
        )
        await conn.commit()
    delay = after.total_seconds() if after else 0.0
    started = await starts.within(delay + PROMPT)
    assert started is (build == "notified")
    if started:
        assert starts.times[0] - completed >= delay - 0.1


@pytest.mark.parametrize("build", ["timed", "control-deaf-to-due-times"])
async def test_a_rescheduled_job_starts_again_when_due_not_at_the_next_poll(
    clients: Any, pgwork_dsn: str, start_worker: Any, build: str
) -> None:
    reg = JobTypeRegistry()
    job_type = reg.job_type("patient", input=Num)
    starts = Starts()

    proceed = anyio.Event()

    async def not_yet(attempt: Attempt[Num, Any]) -> None:
        await starts(attempt)
        if len(starts.times) == 1:
            with anyio.fail_after(PROMPT):
                await proceed.wait()
            await attempt.reschedule(after=timedelta(seconds=1))

    client = await clients(reg, drop=None if build == "timed" else no_due)
    await enqueue(pgwork_dsn, client, job_type)
    worker = await start_worker(client=client, processors={job_type: not_yet})
    assert await starts.within(PROMPT)  # the first acquire, at start

    # Its look for the next due time (at start) done, only a notice tells the worker.
    async def looked_ahead() -> bool:
        return not worker._wakeups.look_ahead and not worker._wakeups.may_have_work

    await eventually(looked_ahead, timeout=PROMPT, what="the worker's look-ahead")
    proceed.set()
    again = await starts.within(1 + PROMPT, count=2)
    assert again is (build == "timed")
    if again:
        assert starts.times[1] - starts.times[0] >= 0.9
