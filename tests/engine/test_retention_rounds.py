"""Retention at the pace chains end: a maintenance round deletes batch after batch
while batches come back full, runs again on the next tick while behind and backs off
once caught up; and what a job type keeps by default, and how it keeps everything."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

from pgwork import ConfigurationError, JobTypeRegistry, PostgresStateAdapter, Retention
from pgwork.retention import DEFAULT_RETENTION
from pgwork.worker._side.maintenance import RETENTION_BEHIND_EVERY_S, Maintenance

from ._retention_kit import end, ended, job_count, start_many
from .conftest import ClientFactory, eventually

pytestmark = pytest.mark.anyio


class Item(BaseModel):
    n: int = 0


def registry() -> JobTypeRegistry:
    reg = JobTypeRegistry()
    reg.job_type("short", input=Item, retention=timedelta(hours=1))
    return reg


# Past the hour "short" (and "hourly") keep their ended chains.
EXPIRED = timedelta(hours=2)


# --- batches, rounds -------------------------------------------------------------------


@pytest.mark.parametrize("build", ["batched", "control-one-batch"])
async def test_a_round_clears_a_backlog_larger_than_one_batch(
    make_client: ClientFactory, pgwork_dsn: str, build: str
) -> None:
    client = await make_client(registry())
    await ended(client, pgwork_dsn, "short", 25, "completed", ago=EXPIRED)
    # The control: one batch a round (a round with no time for a second), as retention
    # ran before it deleted in batches.
    maintenance = Maintenance(
        client, [], retention_batch=10, retention_round=60.0 if build == "batched" else 0.0
    )

    deleted = await maintenance.purge()

    if build == "batched":
        assert (deleted, await job_count(pgwork_dsn)) == (25, 0)
        assert maintenance.retention_wait == RETENTION_BEHIND_EVERY_S  # caught up, busy
    else:
        assert (deleted, await job_count(pgwork_dsn)) == (10, 15)
        assert maintenance.retention_wait == 0.0  # behind: again on the next tick


async def test_rounds_run_again_at_once_while_behind_and_back_off_once_caught_up(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    await ended(client, pgwork_dsn, "short", 25, "completed", ago=EXPIRED)
    maintenance = Maintenance(
        client, [], retention_every=6.0, retention_batch=10, retention_round=0.0
    )

    rounds = [(await maintenance.purge(), maintenance.retention_wait) for _ in range(6)]

    assert rounds == [(10, 0.0), (10, 0.0), (5, 1.0), (0, 2.0), (0, 4.0), (0, 6.0)]
    assert await job_count(pgwork_dsn) == 0


async def test_a_workers_maintenance_clears_a_backlog_of_batches_soon_after_it_starts(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    await ended(client, pgwork_dsn, "short", 35, "completed", ago=EXPIRED)
    # One batch a round: the rounds that clear the rest run on the next ticks, long
    # before the hour ``retention_every`` allows a caught-up worker to wait.
    maintenance = Maintenance(
        client, [], tick=0.05, retention_every=3600.0, retention_batch=10, retention_round=0.0
    )

    async def cleared() -> bool:
        return await job_count(pgwork_dsn) == 0

    async with anyio.create_task_group() as tg:
        tg.start_soon(maintenance.run_forever)
        try:
            await eventually(cleared, timeout=20, what="the expired chains deleted")
        finally:
            tg.cancel_scope.cancel()


async def test_purge_expired_deletes_one_batch_of_each_kind_of_ending(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    for status in ("completed", "failed", "cancelled"):
        await ended(client, pgwork_dsn, "short", 4, status, ago=EXPIRED)

    assert [await client.purge_expired(limit=5) for _ in range(4)] == [5, 5, 2, 0]


# --- the default, keeping everything ---------------------------------------------------


async def test_a_type_without_retention_keeps_completed_chains_a_day_and_the_others_a_week(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    reg = JobTypeRegistry()
    plain = reg.job_type("plain", input=Item)
    client = await make_client(reg)
    gone, kept = [], []
    for status, period in (
        ("completed", timedelta(days=1)),
        ("failed", timedelta(days=7)),
        ("cancelled", timedelta(days=7)),
    ):
        old, young = await start_many(client, pgwork_dsn, "plain", 2)
        await end(pgwork_dsn, old, status, ago=period + timedelta(minutes=5))
        await end(pgwork_dsn, young, status, ago=period - timedelta(minutes=5))
        gone.append(old)
        kept.append(young)

    assert plain.retention == DEFAULT_RETENTION == Retention()
    assert await client.purge_expired() == 3
    assert await job_count(pgwork_dsn, gone) == 0
    assert await job_count(pgwork_dsn, kept) == 3


@pytest.mark.parametrize("keep", [Retention.forever(), None], ids=["forever", "none"])
async def test_a_type_declared_to_keep_everything_keeps_every_ended_chain(
    make_client: ClientFactory, pgwork_dsn: str, keep: Retention | None
) -> None:
    reg = JobTypeRegistry()
    kept = reg.job_type("kept", input=Item, retention=keep)
    reg.job_type("short", input=Item, retention=timedelta(hours=1))
    client = await make_client(reg)
    for status in ("completed", "failed", "cancelled"):
        await ended(client, pgwork_dsn, "kept", 1, status, ago=timedelta(days=365))
    await ended(client, pgwork_dsn, "short", 1, "completed", ago=timedelta(days=365))

    assert kept.retention.keeps_everything
    assert await Maintenance(client, []).purge() == 1  # the other type's
    assert await job_count(pgwork_dsn) == 3


async def test_a_plain_period_applies_to_every_way_of_ending(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    reg = JobTypeRegistry()
    hourly = reg.job_type("hourly", input=Item, retention=timedelta(hours=1))
    client = await make_client(reg)
    for status in ("completed", "failed", "cancelled"):
        await ended(client, pgwork_dsn, "hourly", 1, status, ago=EXPIRED)

    assert hourly.retention == Retention.uniform(timedelta(hours=1))
    assert await client.purge_expired() == 3


REFUSED_RETENTIONS: dict[str, Callable[[], object]] = {
    "zero": lambda: timedelta(0),
    "negative": lambda: timedelta(seconds=-1),
    "zero-completed": lambda: Retention(completed=timedelta(0)),
    "unreadable-failed": lambda: Retention(failed=timedelta.max),
    "not-a-period": lambda: "7 days",
}


@pytest.mark.parametrize("retention", REFUSED_RETENTIONS.values(), ids=REFUSED_RETENTIONS.keys())
def test_a_retention_that_cannot_work_is_refused_at_declaration(
    retention: Callable[[], object],
) -> None:
    reg = JobTypeRegistry()
    with pytest.raises(ConfigurationError, match="retention"):
        reg.job_type("t", input=Item, retention=retention())  # type: ignore[call-overload]


# --- a stop mid-round ------------------------------------------------------------------


@pytest.mark.parametrize("build", ["winds-down", "control-cut-off"])
async def test_a_stop_lets_the_maintenance_step_in_progress_end_on_its_connection(
    make_client: ClientFactory,
    workers: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    build: str,
) -> None:
    """The worker stops while a retention batch is in the database: the batch ends, and
    its connection goes back to the pool whole. Cut off mid-statement (the control),
    psycopg closes the connection whose query's cancellation was itself cancelled, and
    warns twice."""
    in_flight = anyio.Event()
    ended: list[bool] = []

    async def slow_batch(self: PostgresStateAdapter, *, retention: Any, limit: int) -> int:
        in_flight.set()
        async with self._pooled() as conn:
            await conn.execute("SELECT pg_sleep(0.5)")
        ended.append(True)
        return 0

    monkeypatch.setattr(PostgresStateAdapter, "delete_expired_chains", slow_batch)
    if build.startswith("control"):

        async def cut_off(self: Maintenance) -> None:
            return None

        monkeypatch.setattr(Maintenance, "wind_down", cut_off)
    client = await make_client(registry())
    short = client.registry.get("short")

    async def handle(attempt: Any) -> None:
        return None

    worker = await workers(client=client, processors={short: handle})
    with anyio.fail_after(20):
        await in_flight.wait()
    await worker.stop()

    cut = [r.getMessage() for r in caplog.records if "cancellation interrupted" in r.getMessage()]
    if build.startswith("control"):
        assert ended == []
        assert cut
        return
    assert ended == [True]
    assert cut == []
