"""Flow control on running workers: a type's ``concurrency`` and ``key_concurrency`` hold
across several workers, keys are served in turn, a freed place wakes a waiting job at
once (and only a waiting one: no notice where nobody waits), and a worker's
``type_slots`` caps what it runs of a type.

Exactness under crashes, stops and many processes is the fault suite's
(``tests/faults/test_flow_limits.py``); here every worker shares one process, so the
handlers count what runs in plain Python."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel
from tests._core_only import CoreOnly
from tests.engine.conftest import ClientFactory, eventually, scalar

from pgwork import ChainStart, JobTypeRegistry, Rate, create_in_process_worker
from pgwork.adapters.notify import Notice
from pgwork.errors import CapabilityMissingError, ConfigurationError
from pgwork.worker import _fetch

pytestmark = pytest.mark.anyio


class Item(BaseModel):
    n: int


class Overlap:
    """A handler that holds each attempt a moment and records how many ran at once, in
    all and per limit key, and the order attempts started in."""

    def __init__(self, hold: float = 0.05) -> None:
        self.hold = hold
        self.running: Counter[str | None] = Counter()
        self.most: Counter[str | None] = Counter()
        self.together = 0
        self.most_together = 0
        self.started: list[tuple[str | None, int]] = []

    async def __call__(self, attempt: Any) -> None:
        key = attempt.limit_key
        self.started.append((key, attempt.job.input.n))
        self.running[key] += 1
        self.together += 1
        self.most[key] = max(self.most[key], self.running[key])
        self.most_together = max(self.most_together, self.together)
        try:
            await anyio.sleep(self.hold)
        finally:
            self.running[key] -= 1
            self.together -= 1


async def _all_completed(dsn: str, count: int) -> Callable[[], Any]:
    async def done() -> bool:
        completed = await scalar(dsn, "SELECT count(*) FROM pgwork.jobs WHERE status = 'completed'")
        return bool(completed == count)

    return done


async def _enqueue(
    client: Any, conn: psycopg.AsyncConnection[Any], job_type: Any, keys: list[str | None]
) -> None:
    await client.start_chains(
        conn, [ChainStart(job_type, Item(n=n), limit_key=key) for n, key in enumerate(keys)]
    )
    await conn.commit()


async def test_a_types_concurrency_holds_across_workers(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """Three workers of five slots each run at most two attempts of a type limited to two
    at once, and do reach two. Control: without ``concurrency`` the same run reaches
    far more than two."""
    reg = JobTypeRegistry()
    export = reg.job_type("export", input=Item, concurrency=2)
    client = await make_client(reg)
    handler = Overlap()
    await _enqueue(client, conn, export, [None] * 30)
    for _ in range(3):
        await workers(client=client, processors={export: handler}, max_slots=5)
    await eventually(await _all_completed(pgwork_dsn, 30), what="every export completed")
    assert handler.most_together == 2


async def test_a_key_concurrency_holds_per_key_while_keys_run_side_by_side(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """At most one attempt per key runs, while the three keys (and the jobs enqueued
    without a key, a group of their own) run beside each other."""
    reg = JobTypeRegistry()
    call = reg.job_type("call", input=Item, key_concurrency=1)
    client = await make_client(reg)
    handler = Overlap()
    keys: list[str | None] = ["a", "b", "c", None] * 6
    await _enqueue(client, conn, call, keys)
    for _ in range(2):
        await workers(client=client, processors={call: handler}, max_slots=6)
    await eventually(await _all_completed(pgwork_dsn, len(keys)), what="every call completed")
    assert dict(handler.most) == {"a": 1, "b": 1, "c": 1, None: 1}
    assert handler.most_together > 1


async def test_a_key_with_a_deep_backlog_does_not_hold_back_a_newcomer(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """Keys are served in turn: a key that enqueues three jobs behind another's 5,000
    has all three started within the next two acquires' worth of starts (8 slots), not
    after the backlog, though neither key reaches its limit. Control: ranking the
    candidates by due time alone (no turns across keys, in the type's room and the
    final order) starts the newcomer's jobs after the 5,000."""
    reg = JobTypeRegistry()
    sync = reg.job_type("sync", input=Item, key_concurrency=50)
    client = await make_client(reg)
    handler = Overlap(hold=0.01)
    await _enqueue(client, conn, sync, ["big"] * 5000)
    await _enqueue(client, conn, sync, ["small"] * 3)
    await workers(client=client, processors={sync: handler}, max_slots=8, prefetch=0)

    async def newcomers_ran() -> bool:
        return sum(key == "small" for key, _ in handler.started) == 3 or len(handler.started) > 100

    await eventually(newcomers_ran, what="the newcomer's jobs, or a hundred others, started")
    order = [key for key, _ in handler.started]
    assert order.count("small") == 3, order[:40]
    last_small = max(i for i, key in enumerate(order) if key == "small")
    assert last_small < 2 * 8


async def test_a_freed_place_starts_the_next_job_without_waiting_for_the_poll(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """With one place and a poll of a minute, four jobs still run one after the other
    within seconds: the worker whose attempt ends acquires again at once (though its
    last acquire came back short) and, finding the other worker waiting, announces the
    place. Control: without that acquire the second job waits for the poll and this
    times out."""
    reg = JobTypeRegistry()
    one = reg.job_type("one", input=Item, concurrency=1)
    client = await make_client(reg)
    handler = Overlap(hold=0.02)
    for _ in range(2):
        await workers(client=client, processors={one: handler}, max_slots=4, poll_interval=60)
    await _enqueue(client, conn, one, [None] * 4)
    await eventually(
        await _all_completed(pgwork_dsn, 4), timeout=10, what="four jobs, one at a time"
    )
    assert handler.most_together == 1


async def test_a_place_freed_on_one_worker_wakes_another_that_waits_for_it(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """One place, two workers serving different queues, and a poll of a minute: the
    worker of queue "b" found the place taken and sleeps; the attempt that ends on the
    worker of queue "a" (which has nothing more to run) wakes it, so every job is done
    within seconds. Control: with the announcement of the waited-for type removed from
    the worker's turn, the job of queue "b" waits for the poll and this times out."""
    reg = JobTypeRegistry()
    one = reg.job_type("one", input=Item, concurrency=1)
    client = await make_client(reg)
    handler = Overlap(hold=1.0)
    await workers(client=client, processors={one: handler}, queues=["a"], poll_interval=60)
    await client.start_chain(conn, one, Item(n=0), queue="a")
    await conn.commit()
    await eventually(lambda: _running(pgwork_dsn, 1), what="the place taken")
    await workers(client=client, processors={one: handler}, queues=["b"], poll_interval=60)
    await client.start_chain(conn, one, Item(n=1), queue="b")
    await conn.commit()
    await eventually(
        await _all_completed(pgwork_dsn, 2), timeout=10, what="the job of queue b, woken"
    )
    assert handler.most_together == 1


async def test_a_key_freed_on_one_worker_wakes_another_that_waits_for_that_key(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """One place per key, as above across queues: key "a"'s attempt on the worker of
    queue "a" ends, and the worker of queue "b", held back by that key, is woken.
    Control: with the acquire told of no freed keys (``freed=()``), a keyed type is
    never reported and the job of queue "b" waits for the poll: this times out."""
    reg = JobTypeRegistry()
    per_key = reg.job_type("per_key", input=Item, key_concurrency=1)
    client = await make_client(reg)
    handler = Overlap(hold=1.0)
    await workers(client=client, processors={per_key: handler}, queues=["a"], poll_interval=60)
    await client.start_chain(conn, per_key, Item(n=0), queue="a", limit_key="k")
    await conn.commit()
    await eventually(lambda: _running(pgwork_dsn, 1), what="the key's place taken")
    await workers(client=client, processors={per_key: handler}, queues=["b"], poll_interval=60)
    await client.start_chain(conn, per_key, Item(n=1), queue="b", limit_key="k")
    await conn.commit()
    await eventually(
        await _all_completed(pgwork_dsn, 2), timeout=10, what="the job of queue b, woken"
    )
    assert handler.most["k"] == 1


async def test_an_attempt_that_ends_where_nobody_waits_sends_no_notice(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """A limit that never binds: the worker drains thirty jobs and no ``ready`` notice is
    sent but the enqueue's own. Control: announcing every ended attempt of a limited
    type (as if a worker always waited) sends one per turn, and this fails."""
    reg = JobTypeRegistry()
    wide = reg.job_type("wide", input=Item, concurrency=1000)
    client = await make_client(reg)
    async with client.notify.listen() as listener:
        await workers(client=client, processors={wide: Overlap(hold=0.01)}, max_slots=4)
        await _enqueue(client, conn, wide, [None] * 30)
        await eventually(await _all_completed(pgwork_dsn, 30), what="thirty jobs done")
        heard = await listener.wait(0.5)
        heard += await listener.wait(0.5)
    assert [n for n in heard if n.kind == "ready"] == [Notice(kind="ready", queue="default")]


async def _running(dsn: str, count: int) -> bool:
    running = await scalar(dsn, "SELECT count(*) FROM pgwork.jobs WHERE status = 'running'")
    return bool(running == count)


async def test_a_workers_type_slots_cap_what_it_runs_of_that_type(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """``type_slots={heavy: 2}`` on a worker of eight slots: at most two heavy attempts
    at once, while light jobs fill the other slots. Control: without the cap the
    heavy jobs take all eight."""
    reg = JobTypeRegistry()
    heavy = reg.job_type("heavy", input=Item)
    light = reg.job_type("light", input=Item)
    client = await make_client(reg)
    heavy_handler, light_handler = Overlap(hold=0.05), Overlap(hold=0.05)
    await _enqueue(client, conn, heavy, [None] * 20)
    await _enqueue(client, conn, light, [None] * 20)
    await workers(
        client=client,
        processors={heavy: heavy_handler, light: light_handler},
        max_slots=8,
        type_slots={heavy: 2},
    )
    await eventually(await _all_completed(pgwork_dsn, 40), what="every job completed")
    assert heavy_handler.most_together == 2
    assert light_handler.most_together > 2


async def test_a_limited_type_is_refused_on_a_store_without_flow_control(
    make_client: ClientFactory,
) -> None:
    reg = JobTypeRegistry()
    export = reg.job_type("export", input=Item, concurrency=2)
    client = await make_client(reg, store=CoreOnly)
    with pytest.raises(CapabilityMissingError, match="FlowControl"):
        create_in_process_worker(client=client, processors={export: Overlap()})


@pytest.mark.parametrize("cap", [0, -1, 1.5, True, "2"])
async def test_a_type_slots_cap_that_cannot_work_is_refused(
    make_client: ClientFactory, cap: Any
) -> None:
    reg = JobTypeRegistry()
    heavy = reg.job_type("heavy", input=Item)
    client = await make_client(reg)
    with pytest.raises(ConfigurationError, match="type_slots"):
        create_in_process_worker(
            client=client, processors={heavy: Overlap()}, type_slots={heavy: cap}
        )


async def test_type_slots_for_a_type_the_worker_does_not_run_is_refused(
    make_client: ClientFactory,
) -> None:
    reg = JobTypeRegistry()
    heavy = reg.job_type("heavy", input=Item)
    other = reg.job_type("other", input=Item)
    client = await make_client(reg)
    with pytest.raises(ConfigurationError, match="does not process"):
        create_in_process_worker(
            client=client, processors={heavy: Overlap()}, type_slots={other: 1}
        )


async def test_jobs_of_types_without_limits_carry_no_limit_group(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """Only limited types' jobs enter the indexes the limited acquire reads: a job of a
    type without limits has no group, even with a key; a keyed type's job without a key
    is in the group of its own ''."""
    reg = JobTypeRegistry()
    plain = reg.job_type("plain", input=Item)
    whole = reg.job_type("whole", input=Item, concurrency=3)
    keyed = reg.job_type("keyed", input=Item, key_concurrency=3)
    client = await make_client(reg)
    await _enqueue(client, conn, plain, ["t1"])
    await _enqueue(client, conn, whole, ["t1"])
    await _enqueue(client, conn, keyed, ["t1", None])
    async with await psycopg.AsyncConnection.connect(pgwork_dsn, autocommit=True) as c:
        cur = await c.execute(
            "SELECT type_name, limit_key, limit_group FROM pgwork.jobs"
            " ORDER BY type_name, limit_key"
        )
        rows = await cur.fetchall()
    assert rows == [
        ("keyed", "t1", "t1"),
        ("keyed", None, ""),
        ("plain", "t1", None),
        ("whole", "t1", ""),
    ]


async def test_a_rate_window_opening_starts_the_next_job_without_the_poll(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """One start a second, three jobs, a poll of a minute: the worker's acquire that
    the rate held back says when the window opens, and a timer starts the next job
    then, so all three are done within seconds (that each starts in a window of its
    own is the store's part, ``tests/postgres/test_limit_rates.py``). Control: with the
    worker ignoring that moment (no timer), the second job waits for the poll and this
    times out."""
    reg = JobTypeRegistry()
    paced = reg.job_type("paced", input=Item, rate=Rate(1, per=timedelta(seconds=1)))
    client = await make_client(reg)
    await workers(client=client, processors={paced: Overlap(hold=0.01)}, poll_interval=60)
    await _enqueue(client, conn, paced, [None] * 3)
    await eventually(
        await _all_completed(pgwork_dsn, 3), timeout=15, what="three jobs, a second apart"
    )


async def _paced_acquires(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    pgwork_dsn: str,
    *,
    wait_for_openings: bool = True,
) -> int:
    """Three jobs of a type allowed one start a second, drained by the ``workers``
    fixture's worker: how many limited acquires it sent."""
    reg = JobTypeRegistry()
    paced = reg.job_type("paced", input=Item, rate=Rate(1, per=timedelta(seconds=1)))
    acquires = 0

    def counting(state: Any) -> Any:
        if not wait_for_openings:
            limits = replace(state.statements.limits, await_opening=b"SELECT 1")
            state.statements = replace(state.statements, limits=limits)
        original = state.acquire_limited

        async def counted(**kwargs: Any) -> Any:
            nonlocal acquires
            acquires += 1
            return await original(**kwargs)

        state.acquire_limited = counted
        return state

    client = await make_client(reg, store=counting)
    await workers(client=client, processors={paced: Overlap(hold=0.01)}, poll_interval=60)
    await _enqueue(client, conn, paced, [None] * 3)
    await eventually(
        await _all_completed(pgwork_dsn, 3), timeout=15, what="three jobs, a second apart"
    )
    return acquires


async def test_a_full_rate_window_wakes_no_waiting_worker(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any], pgwork_dsn: str
) -> None:
    """A worker held back by a rate waits for its timer: an attempt of the type ending,
    or a mark it left, does not announce room while the window is full, which would
    only wake it to find the window full again. Three jobs a second apart take a
    handful of acquires. Control: clearing the marks without looking at the rate (as
    for a concurrency limit alone) has the worker ask dozens of times."""
    assert await _paced_acquires(make_client, workers, conn, pgwork_dsn) <= 15


async def test_a_store_that_cannot_wait_for_an_opening_is_not_asked_again_and_again(
    make_client: ClientFactory,
    workers: Any,
    conn: psycopg.AsyncConnection[Any],
    pgwork_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker sends its acquire a little before a rate's window opens, for a store
    that waits for the opening in the database. One that does not (here PostgreSQL with
    that wait left out) comes back with the same opening; the worker then waits for it
    exactly, rather than asking again at once until it comes. The early send made
    0.3 s to make the difference plain: a handful of acquires. Control: setting the
    timer early again for the same opening asks a couple of hundred times."""
    monkeypatch.setattr(_fetch, "OPENS_EARLY_S", 0.3)
    acquires = await _paced_acquires(
        make_client, workers, conn, pgwork_dsn, wait_for_openings=False
    )
    assert acquires <= 15
