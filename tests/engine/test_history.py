"""The job history counts every job that completed or failed exactly once: across
batches, beside retention, with several workers rolling up at once, behind a
transaction still open; and old buckets are pruned.

Ended jobs are written straight into ``jobs`` with known times (the columns a
completion writes), so each figure of the history can be worked out here.
"""

from __future__ import annotations

import bisect
import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import anyio
import psycopg
import pytest
from pydantic import BaseModel

from pgwork import Client, JobTypeRegistry
from pgwork.adapters.history import DURATION_BINS_S, Durations, HistoryFigures, JobHistory
from pgwork.postgres._history import HISTORY_WIDTHS_S
from pgwork.postgres.sql import render
from pgwork.worker._side.maintenance import Maintenance

from .conftest import ClientFactory, eventually, scalar

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


class Item(BaseModel):
    n: int = 0


def registry() -> JobTypeRegistry:
    reg = JobTypeRegistry()
    for name in ("mail", "resize", "report"):
        reg.job_type(name, input=Item, retention=timedelta(hours=1))
    return reg


@dataclass(frozen=True)
class Ended:
    """A job as its end left it: ``ago`` seconds before now, after ``run`` seconds of
    running and ``wait`` seconds of waiting (on its last attempt)."""

    queue: str
    type_name: str
    status: str
    ago: float
    wait: float
    run: float
    attempt: int = 1


INSERT = """
INSERT INTO pgwork.jobs (id, type_name, chain_id, chain_type_name, status, queue,
    created_at, scheduled_at, started_at, completed_at, attempt, max_attempts,
    chain_status, chain_completed_at)
SELECT v.id, v.type_name, v.id, v.type_name, v.status::pgwork.job_status, v.queue,
       e.completed_at - interval '1 day', v.scheduled_at, v.started_at, e.completed_at,
       v.attempt, 5, v.status::pgwork.chain_status, e.completed_at
FROM (SELECT now() - %(ago)s * interval '1 second' AS completed_at) AS e,
LATERAL (SELECT %(id)s::uuid AS id, %(type_name)s AS type_name, %(status)s AS status,
                %(queue)s AS queue, %(attempt)s::int AS attempt,
                e.completed_at - (%(run)s + %(wait)s) * interval '1 second' AS scheduled_at,
                -- a retried job started (its first attempt) before its last due time
                e.completed_at - %(run)s * interval '1 second'
                    - CASE WHEN %(attempt)s::int > 1 THEN interval '1 hour'
                           ELSE interval '0' END AS started_at) AS v
"""


async def seed(dsn: str, jobs: Sequence[Ended]) -> None:
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
        conn.cursor() as cur,
    ):
        await cur.executemany(
            INSERT,
            [_params(j) for j in jobs],
        )


def workload(n: int = 240, *, seed_value: int = 7) -> list[Ended]:
    """Jobs that ended over the last 40 hours in two queues and three types, some
    retried, some failed; plus 25 that ended in the same instant (one transaction)."""
    rng = random.Random(seed_value)
    jobs = [
        Ended(
            queue=rng.choice(["default", "media"]),
            type_name=rng.choice(["mail", "resize", "report"]),
            status="failed" if rng.random() < 0.2 else "completed",
            ago=rng.uniform(120, 40 * 3600),
            wait=rng.choice([0.0, 0.004, 0.2, 3.0, 45.0, 700.0]),
            run=rng.choice([0.002, 0.03, 0.7, 8.0, 120.0, 4000.0]),
            attempt=rng.choice([1, 1, 1, 2]),
        )
        for _ in range(n)
    ]
    jobs += [Ended("default", "mail", "completed", 3600.0, 0.5, 0.5) for _ in range(25)]
    return jobs


def expected(jobs: Sequence[Ended]) -> HistoryFigures:
    """What the history must say about ``jobs`` (pgwork.adapters.history's definitions:
    a retried job's wait is unknown; its run counts from its last due time)."""
    waits = [j.wait for j in jobs if j.attempt == 1]
    runs = [j.run if j.attempt == 1 else j.run + j.wait for j in jobs]
    return HistoryFigures(
        completed=sum(j.status == "completed" for j in jobs),
        failed=sum(j.status == "failed" for j in jobs),
        wait=_durations(waits),
        run=_durations(runs),
    )


def _durations(values: Sequence[float]) -> Durations:
    histogram = [0] * (len(DURATION_BINS_S) + 1)
    for value in values:
        histogram[bisect.bisect_right(DURATION_BINS_S, value)] += 1
    return Durations(len(values), sum(values), max(values, default=0.0), tuple(histogram))


def total(history: JobHistory) -> HistoryFigures:
    """The figures of every point of ``history`` added up (as a longer bucket would)."""
    figures = [p.figures for p in history.points]
    return HistoryFigures(
        completed=sum(f.completed for f in figures),
        failed=sum(f.failed for f in figures),
        wait=_sum([f.wait for f in figures]),
        run=_sum([f.run for f in figures]),
    )


def _sum(parts: Sequence[Durations]) -> Durations:
    return Durations(
        sum(d.count for d in parts),
        sum(d.total_s for d in parts),
        max((d.max_s for d in parts), default=0.0),
        tuple(map(sum, zip(*(d.histogram for d in parts), strict=True))),
    )


def same(actual: HistoryFigures, wanted: HistoryFigures) -> None:
    assert (actual.completed, actual.failed) == (wanted.completed, wanted.failed)
    for got, want in ((actual.wait, wanted.wait), (actual.run, wanted.run)):
        assert (got.count, got.histogram) == (want.count, want.histogram)
        assert got.total_s == pytest.approx(want.total_s, abs=0.01)
        assert got.max_s == pytest.approx(want.max_s, abs=0.001)


async def roll_up_all(client: Client, *, limit: int = 10_000, **kwargs: Any) -> int:
    """Roll up until caught up; how many jobs that counted. Each step must progress."""
    counted = 0
    for _ in range(100):
        step = await client.roll_up_history(limit=limit, **kwargs)
        assert not step.skipped
        counted += step.jobs
        if step.caught_up:
            return counted
        assert step.jobs, "a rollup step that is not caught up counted nothing"
    raise AssertionError("the rollup did not catch up in 100 steps")


async def test_the_history_counts_each_ended_job_once_with_its_wait_and_run_time(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    jobs = workload()
    await seed(pgwork_dsn, jobs)
    # Not ended: never counted.
    await seed(pgwork_dsn, [Ended("default", "mail", s, 60.0, 1.0, 1.0) for s in ("cancelled",)])

    # Batches of 10 jobs: the 25 that ended in one instant are taken whole.
    assert await roll_up_all(client, limit=10) == len(jobs)
    assert await roll_up_all(client, limit=10) == 0

    # Five-minute, hourly and daily buckets.
    for window in (timedelta(days=2), timedelta(days=3), timedelta(days=30)):
        history = await client.job_history(window=window)
        same(total(history), expected(jobs))
        assert history.rolled_up_to is not None
        for group in history.groups:
            mine = [j for j in jobs if (j.queue, j.type_name) == (group.queue, group.type_name)]
            same(group.figures, expected(mine))
        assert len(history.groups) == 6
    day = await client.job_history(window=timedelta(hours=12))
    assert day.resolution == day.step == timedelta(minutes=5)
    assert all(p.start >= day.since for p in day.points)

    filters: list[tuple[str | None, str | None]] = [("media", "mail"), ("media", None)]
    for queue, type_name in [*filters, (None, "report")]:
        mine = await client.job_history(window=timedelta(days=2), queue=queue, type_name=type_name)
        wanted = [j for j in jobs if queue in (None, j.queue) and type_name in (None, j.type_name)]
        same(total(mine), expected(wanted))
        assert {(g.queue, g.type_name) for g in mine.groups} == {
            (j.queue, j.type_name) for j in wanted
        }


async def test_jobs_retention_deletes_before_the_rollup_reaches_them_are_counted_once(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    counted_first = [Ended("default", "mail", "completed", 7200.0 + i, 1.0, 2.0) for i in range(5)]
    deleted_first = [Ended("default", "report", "failed", 7000.0 + i, 0.3, 9.0) for i in range(7)]
    await seed(pgwork_dsn, counted_first + deleted_first)
    # One batch of five: the rollup counts the five oldest and stops.
    step = await client.roll_up_history(limit=5)
    assert (step.jobs, step.caught_up) == (5, False)

    # Retention (an hour for these types) deletes all twelve: five counted, seven not.
    assert await client.purge_expired() == 12
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs") == 0
    assert await roll_up_all(client) == 0

    history = await client.job_history(window=timedelta(days=1))
    same(total(history), expected(counted_first + deleted_first))


async def test_two_rollups_at_once_count_each_job_once(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    """One rollup holds the progress, uncommitted, while a second one runs: the second
    must not count the same jobs (it skips)."""
    client = await make_client(registry())
    jobs = workload(60)
    await seed(pgwork_dsn, jobs)
    statements = render("pgwork").history

    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as first:
        cur = await first.execute(
            statements.lock_progress, {"keep_s": 90 * 86400.0, "settle_s": 1.0, "max_lag_s": 3600}
        )
        since, horizon = await cur.fetchone() or (None, None)
        await first.execute(
            statements.roll_up,
            {"since": since, "horizon": horizon, "limit": 100_000, "widths": HISTORY_WIDTHS_S},
        )
        results: list[Any] = []

        async def second() -> None:
            results.append(await client.roll_up_history())

        async with anyio.create_task_group() as tg:
            tg.start_soon(second)
            # Until the second rollup returned, or waits for the first one's rows.
            await eventually(lambda: _done_or_waiting(pgwork_dsn, results), what="second")
            await first.commit()
    assert await roll_up_all(client) == 0

    same(total(await client.job_history(window=timedelta(days=2))), expected(jobs))
    assert results[0].skipped


async def _done_or_waiting(dsn: str, results: list[Any]) -> bool:
    if results:
        return True
    waiting = await scalar(
        dsn,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock'",
    )
    return bool(waiting)


async def test_concurrent_rollups_through_the_api_count_each_job_once(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    clients = [await make_client(registry()) for _ in range(4)]
    jobs = workload(200, seed_value=11)
    await seed(pgwork_dsn, jobs)
    steps: list[Any] = []

    async def roll(client: Client) -> None:
        for _ in range(20):
            steps.append(await client.roll_up_history(limit=15))

    async with anyio.create_task_group() as tg:
        for client in clients:
            tg.start_soon(roll, client)
    await roll_up_all(clients[0])

    assert sum(s.jobs for s in steps if not s.skipped) <= len(jobs)
    same(total(await clients[0].job_history(window=timedelta(days=2))), expected(jobs))


async def test_an_end_committed_late_by_an_open_transaction_is_still_counted(
    make_client: ClientFactory, pgwork_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction that ends a job writes its own start as ``completed_at``: a rollup
    while it is open must stop before that instant, or the job is never counted."""
    monkeypatch.setattr("pgwork.postgres._history.SETTLE_S", 0.0)  # no margin to hide in
    client = await make_client(registry())
    early = [Ended("default", "mail", "completed", 600.0, 0.1, 0.1)]
    await seed(pgwork_dsn, early)
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as late:
        await late.execute(INSERT, _params(Ended("default", "mail", "failed", 0.0, 0.2, 0.0)))
        await seed(pgwork_dsn, [Ended("default", "resize", "completed", 0.0, 0.1, 0.1)])
        assert await roll_up_all(client) == 1  # only what ended before it began
        await late.commit()
    assert await roll_up_all(client) == 2

    counted = total(await client.job_history(window=timedelta(hours=1)))
    assert (counted.completed, counted.failed) == (2, 1)


async def test_a_window_reaches_back_to_the_start_of_the_hour_it_begins_in(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    """An hour's window read at any minute holds every job that ended within the hour:
    it starts at the start of the hour the window begins in (the totals per queue and
    type come from hourly buckets), never later. (Control: a window starting at the
    next whole hour instead misses a job that ended 59 minutes ago at every minute but
    the first of the hour.)"""
    client = await make_client(registry())
    await seed(pgwork_dsn, [Ended("default", "mail", "completed", 59 * 60.0, 0.1, 0.1)])
    assert await roll_up_all(client) == 1
    history = await client.job_history(window=timedelta(hours=1))
    assert history.since <= history.now - timedelta(hours=1)
    assert total(history).completed == 1
    assert [(g.type_name, g.figures.completed) for g in history.groups] == [("mail", 1)]


def _params(job: Ended) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(),
        "type_name": job.type_name,
        "status": job.status,
        "queue": job.queue,
        "attempt": job.attempt,
        "ago": job.ago,
        "wait": job.wait,
        "run": job.run,
    }


async def test_buckets_past_their_keep_period_are_pruned_and_old_jobs_not_counted(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    recent = [Ended("default", "mail", "completed", 3600.0, 1.0, 1.0)]
    three_days = [Ended("default", "mail", "completed", 3 * 86400.0, 1.0, 1.0)]
    too_old = [Ended("default", "mail", "completed", 6 * 86400.0, 1.0, 1.0)]
    await seed(pgwork_dsn, recent + three_days + too_old)

    assert await roll_up_all(client, keep=timedelta(days=5)) == 2

    async def buckets(width: int) -> int:
        query = (
            "SELECT count(*) FROM pgwork.job_history"
            " WHERE bucket_seconds = %s AND queue <> '' AND type_name <> ''"
        )
        return int(await scalar(pgwork_dsn, query, width))

    # Five-minute buckets live two days: the three-day-old job has its hourly and
    # daily ones only.
    assert [await buckets(w) for w in (300, 3600, 86400)] == [1, 2, 2]
    step = await client.roll_up_history(keep=timedelta(days=2, hours=12))
    assert step.pruned == 3  # its daily bucket, its queue's and the total's
    assert [await buckets(w) for w in (300, 3600, 86400)] == [1, 2, 1]
    week = await client.job_history(window=timedelta(days=7))  # hourly buckets
    assert total(week).completed == 2
    month = await client.job_history(window=timedelta(days=30))  # daily buckets
    assert total(month).completed == 1


async def test_a_workers_maintenance_rolls_up_what_its_jobs_ended(
    make_client: ClientFactory, pgwork_dsn: str, workers: Any
) -> None:
    reg = JobTypeRegistry()
    done = reg.job_type("done", input=Item)
    client = await make_client(reg)

    async def handle(attempt: Any) -> Any:
        return None

    await workers(client=client, processors={done: handle}, max_slots=4, poll_interval=0.1)
    async with await psycopg.AsyncConnection.connect(pgwork_dsn) as conn:
        for n in range(30):
            await client.start_chain(conn, done, Item(n=n))
        await conn.commit()
    maintenance = Maintenance(client, [], tick=0.05, history_every=0.05)

    async def counted() -> bool:
        return total(await client.job_history(window=timedelta(hours=1))).completed == 30

    async with anyio.create_task_group() as tg:
        tg.start_soon(maintenance.run_forever)
        await eventually(counted, what="thirty completed jobs in the history")
        tg.cancel_scope.cancel()
    figures = total(await client.job_history(window=timedelta(hours=1)))
    assert figures.wait.count == figures.run.count == 30
