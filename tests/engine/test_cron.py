"""Recurring schedules: which ticks exist (daylight saving included), which are still
due (``misfire_grace``), and that every tick starts exactly one chain however many
workers fire it, whatever the database's default isolation level.

Tick computation is tested purely, on instants chosen around each transition; the
maintenance step is driven with an injected ``now`` where the test must control the
set of ticks, so every count below is exact.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import psycopg
import psycopg.sql
import pytest
from pydantic import BaseModel

from pgwork import InvalidOptionError, JobTypeRegistry
from pgwork.schedules import CronSchedule
from pgwork.worker._side.maintenance import Maintenance

from .conftest import ClientFactory, scalar

pytestmark = pytest.mark.anyio


class Item(BaseModel):
    name: str


def registry() -> JobTypeRegistry:
    reg = JobTypeRegistry()
    reg.job_type("report", input=Item)
    return reg


def schedule(
    cron: str, *, timezone: str = "UTC", grace: timedelta = timedelta(minutes=1), reg: Any = None
) -> CronSchedule[Item]:
    report = (reg or registry()).get("report")
    return CronSchedule("report", cron, report, Item(name="r"), timezone, grace)


def ticks_between(cron: CronSchedule[Any], start: datetime, end: datetime) -> list[datetime]:
    """Every distinct tick a worker checking once a minute from ``start`` to ``end``
    (excluded) would see due."""
    seen: set[datetime] = set()
    now = start
    while now < end:
        tick = cron.due_tick(now)
        if tick is not None and tick >= start:
            seen.add(tick)
        now += timedelta(minutes=1)
    return sorted(seen)


# Each transition, as the instant (UTC) the offset changes.
PARIS_FALL = datetime(2026, 10, 25, 1, tzinfo=UTC)  # 03:00 CEST -> 02:00 CET
PARIS_SPRING = datetime(2026, 3, 29, 1, tzinfo=UTC)  # 02:00 CET -> 03:00 CEST
NEW_YORK_FALL = datetime(2026, 11, 1, 6, tzinfo=UTC)  # 02:00 EDT -> 01:00 EST
NEW_YORK_SPRING = datetime(2026, 3, 8, 7, tzinfo=UTC)  # 02:00 EST -> 03:00 EDT

TRANSITIONS = [
    ("Europe/Paris", PARIS_FALL, "fall"),
    ("Europe/Paris", PARIS_SPRING, "spring"),
    ("America/New_York", NEW_YORK_FALL, "fall"),
    ("America/New_York", NEW_YORK_SPRING, "spring"),
]


@pytest.mark.parametrize(("zone", "transition", "kind"), TRANSITIONS)
@pytest.mark.parametrize(("cron", "per_six_hours"), [("*/15 * * * *", 24), ("0 * * * *", 6)])
def test_every_wall_clock_tick_fires_once_across_a_daylight_saving_change(
    zone: str, transition: datetime, kind: str, cron: str, per_six_hours: int
) -> None:
    """Six real hours around the change hold the same number of ticks as any six: a
    repeated hour fires at both of its occurrences, and the ticks of a skipped hour
    fall on the ticks just after it (02:15 on 03:15), which fire once."""
    every = schedule(cron, timezone=zone)
    ticks = ticks_between(every, transition - timedelta(hours=3), transition + timedelta(hours=3))
    assert len(ticks) == per_six_hours
    # Each on its own instant with its own dedup key.
    assert len({every.dedup(tick).key for tick in ticks}) == per_six_hours


@pytest.mark.parametrize(
    ("zone", "transition", "wall", "fired_at"),
    [
        # The repeated hour: 02:30 in Paris, 01:30 in New York, at both offsets.
        ("Europe/Paris", PARIS_FALL, "30 2 * * *", ["02:30:00+02:00", "02:30:00+01:00"]),
        ("America/New_York", NEW_YORK_FALL, "30 1 * * *", ["01:30:00-04:00", "01:30:00-05:00"]),
        # The skipped hour: 02:30 never shows; it fires at 03:30, an hour later.
        ("Europe/Paris", PARIS_SPRING, "30 2 * * *", ["03:30:00+02:00"]),
        ("America/New_York", NEW_YORK_SPRING, "30 2 * * *", ["03:30:00-04:00"]),
    ],
)
def test_a_daily_tick_in_a_repeated_hour_fires_twice_and_in_a_skipped_hour_once(
    zone: str, transition: datetime, wall: str, fired_at: list[str]
) -> None:
    daily = schedule(wall, timezone=zone)
    ticks = ticks_between(daily, transition - timedelta(hours=3), transition + timedelta(hours=3))
    keys = [daily.dedup(tick).key for tick in ticks]
    day = transition.astimezone(daily._zone).date().isoformat()
    assert keys == [f"cron:report:{day}T{time}" for time in fired_at]


def test_a_tick_older_than_its_grace_is_not_due_and_a_younger_one_is() -> None:
    hourly = schedule("0 * * * *", grace=timedelta(minutes=5))
    tick = datetime(2026, 6, 1, 12, tzinfo=UTC)
    assert hourly.due_tick(tick) == tick
    assert hourly.due_tick(tick + timedelta(minutes=5)) == tick
    assert hourly.due_tick(tick + timedelta(minutes=5, microseconds=1)) is None
    assert hourly.due_tick(tick + timedelta(minutes=59)) is None


async def test_the_maintenance_step_fires_a_young_tick_and_skips_an_old_one(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    client = await make_client(registry())
    hourly = schedule("0 * * * *", grace=timedelta(minutes=5), reg=client.registry)
    tick = datetime(2026, 6, 1, 12, tzinfo=UTC)
    late = Maintenance(client, [hourly])
    assert await late.fire_due(tick + timedelta(minutes=6)) == 0
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs") == 0
    on_time = Maintenance(client, [hourly])
    assert await on_time.fire_due(tick + timedelta(minutes=4)) == 1
    keys = await scalar(pgwork_dsn, "SELECT array_agg(dedup_key) FROM pgwork.jobs")
    assert keys == ["cron:report:2026-06-01T12:00:00+00:00"]


async def test_workers_fire_both_occurrences_of_a_repeated_hour_once_each(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    clients = [await make_client(registry()) for _ in range(2)]
    makers = [
        Maintenance(c, [schedule("*/15 * * * *", timezone="Europe/Paris", reg=c.registry)])
        for c in clients
    ]
    now = PARIS_FALL - timedelta(hours=3)
    while now < PARIS_FALL + timedelta(hours=3):
        for maintenance in makers:
            await maintenance.fire_due(now)
        now += timedelta(minutes=1)
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs") == 24
    keys = await scalar(pgwork_dsn, "SELECT array_agg(dedup_key) FROM pgwork.jobs")
    assert len(set(keys)) == 24
    assert {
        "cron:report:2026-10-25T02:30:00+02:00",
        "cron:report:2026-10-25T02:30:00+01:00",
    } <= set(keys)


async def _default_isolation(dsn: str, level: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        await c.execute(
            psycopg.sql.SQL("ALTER DATABASE {} SET default_transaction_isolation = {}").format(
                psycopg.sql.Identifier(c.info.dbname), psycopg.sql.Literal(level)
            )
        )


async def _race(makers: list[Maintenance], now: datetime | None = None) -> list[int]:
    fired: list[int] = []

    async def fire(maintenance: Maintenance) -> None:
        fired.append(await maintenance.fire_due(now))

    async with anyio.create_task_group() as tg:
        for maintenance in makers:
            tg.start_soon(fire, maintenance)
    return fired


async def test_racing_workers_start_one_chain_per_tick_on_a_repeatable_read_database(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    """Four workers race each of five ticks (the ticks chosen by the test), on a database
    whose transactions default to REPEATABLE READ: exactly five chains."""
    await _default_isolation(pgwork_dsn, "repeatable read")
    clients = [await make_client(registry()) for _ in range(4)]
    makers = [Maintenance(c, [schedule("* * * * *", reg=c.registry)]) for c in clients]
    first = datetime(2026, 6, 1, 12, tzinfo=UTC)
    fired = []
    for minute in range(5):
        fired += await _race(makers, first + timedelta(minutes=minute, seconds=30))
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs") == 5
    assert sum(fired) == 5


async def test_racing_workers_on_the_database_clock_start_one_chain_for_its_one_tick(
    make_client: ClientFactory, pgwork_dsn: str
) -> None:
    """The same on the database clock, with a schedule whose only tick within its grace
    is ten minutes ago: five rounds of four workers start exactly one chain."""
    await _default_isolation(pgwork_dsn, "repeatable read")
    clients = [await make_client(registry()) for _ in range(4)]
    now = await clients[0].state.now()
    tick = now.astimezone(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
    cron = f"{tick.minute} {tick.hour} {tick.day} {tick.month} *"
    makers = [
        Maintenance(c, [schedule(cron, grace=timedelta(hours=1), reg=c.registry)]) for c in clients
    ]
    fired = []
    for _ in range(5):
        fired += await _race(makers)
    assert await scalar(pgwork_dsn, "SELECT count(*) FROM pgwork.jobs") == 1
    assert sum(fired) == 1
    key = await scalar(pgwork_dsn, "SELECT dedup_key FROM pgwork.jobs")
    assert key == f"cron:report:{tick.isoformat()}"


def test_a_misfire_grace_that_is_not_a_usable_timedelta_is_refused() -> None:
    with pytest.raises(InvalidOptionError) as caught:
        schedule("* * * * *", grace=60)  # type: ignore[arg-type]
    assert caught.value.option == "misfire_grace"


@pytest.mark.parametrize(("zone", "transition", "kind"), TRANSITIONS)
@pytest.mark.parametrize("cron", ["*/15 * * * *", "0 * * * *", "30 2 * * *", "30 1 * * *"])
def test_next_tick_is_the_first_tick_after_now_across_a_daylight_saving_change(
    zone: str, transition: datetime, kind: str, cron: str
) -> None:
    """At every minute of the six hours around a change, ``next_tick`` is the earliest
    of the ticks that fire (as ``due_tick`` sees them) that lies after that minute."""
    every = schedule(cron, timezone=zone)
    start, end = transition - timedelta(hours=3), transition + timedelta(hours=3)
    fired = ticks_between(every, start, end + timedelta(days=1, hours=1))
    now = start
    while now < end:
        assert every.next_tick(now) == min(t for t in fired if t > now), now
        now += timedelta(minutes=1)


def test_next_tick_of_a_yearly_schedule_is_next_year() -> None:
    yearly = schedule("0 0 1 1 *")
    assert yearly.next_tick(datetime(2026, 6, 1, tzinfo=UTC)) == datetime(2027, 1, 1, tzinfo=UTC)
    assert yearly.next_tick(datetime(2027, 1, 1, tzinfo=UTC)) == datetime(2028, 1, 1, tzinfo=UTC)
