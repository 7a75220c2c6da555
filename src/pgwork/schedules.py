"""Recurring schedules: start a chain on every tick of a cron expression.

Schedules are declared in code and handed to workers (``schedules=[...]``). Every worker
checks them; each tick is enqueued exactly once across all of them because the chain
is started with the dedup key ``cron:<name>:<tick>``, which pgwork serialises per key
in the database; the key deduplicates within a window of the misfire grace plus an
hour (past the grace no worker enqueues the tick again), and retention keeps the tick's
chain for that window, so a tick never fires twice. Ticks are computed on the database clock. A tick
missed by more than ``misfire_grace`` (no worker was running) is skipped, as cron does.

The expression is read on the zone's wall clock: a repeated hour (daylight saving
ends) fires at both of its occurrences, each with its own key (the key carries the UTC
offset); a tick in a skipped hour fires once, an hour later (``tick_instants``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from pgwork._limits import check_delay, check_queue_name
from pgwork.adapters.state import DedupSpec
from pgwork.errors import ConfigurationError, InvalidCronError
from pgwork.job_types import JobType

__all__ = ["CronSchedule"]

I = TypeVar("I")  # noqa: E741

_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,100}$")


@dataclass(frozen=True, slots=True)
class CronSchedule(Generic[I]):
    """Start ``job_type`` with ``input`` on every tick of ``cron`` (five fields,
    evaluated in ``timezone``)."""

    name: str
    cron: str
    job_type: JobType[I, Any]
    input: I
    timezone: str = "UTC"
    misfire_grace: timedelta = timedelta(minutes=1)
    queue: str | None = None
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ConfigurationError(
                f"schedule name {self.name!r} must be 1-100 letters, digits, '_', '.', ':', '-'"
            )
        if len(self.cron.split()) != 5 or not croniter.is_valid(self.cron):
            raise InvalidCronError(self.name, self.cron, "not a valid five-field expression")
        try:
            object.__setattr__(self, "_zone", ZoneInfo(self.timezone))
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ConfigurationError(
                f"schedule {self.name!r}: unknown timezone {self.timezone!r}"
            ) from exc
        check_delay("misfire_grace", self.misfire_grace, where=f"schedule {self.name!r}")
        if self.misfire_grace <= timedelta(0):
            raise ConfigurationError(f"schedule {self.name!r}: misfire_grace must be positive")
        if self.queue is not None:
            check_queue_name(self.queue, where=f"schedule {self.name!r}")

    def latest_tick(self, now: datetime) -> datetime:
        """The most recent tick at or before ``now`` (an aware datetime), in UTC.

        The expression is read on the zone's wall clock; each wall-clock tick is an
        instant (``tick_instants``): two in a repeated hour, and one shifted past a
        skipped hour. Instants are compared in UTC: Python compares two datetimes of
        one zone by their wall-clock fields, so both occurrences of 01:30 would be equal.
        """
        zone = self._zone
        wall = now.astimezone(zone).replace(tzinfo=None)
        steady = _steady(zone, now)
        # Without a transition near now, the latest wall-clock tick is the answer; near
        # one, a later wall-clock time may be an earlier instant, so look a little
        # ahead and keep looking back until no earlier wall time can be later.
        ticks = croniter(self.cron, wall + (_MICROSECOND if steady else _SHIFT))
        best: datetime | None = None
        floor: datetime | None = None
        while True:
            naive: datetime = ticks.get_prev(datetime)
            if floor is not None and naive < floor:
                assert best is not None  # found before the floor was set
                return best
            for instant in self.tick_instants(naive):
                if instant <= now and (best is None or instant > best):
                    best = instant
            if best is not None:
                if steady:
                    return best
                if floor is None:
                    floor = naive - _SHIFT

    def next_tick(self, now: datetime) -> datetime:
        """The first tick after ``now`` (an aware datetime), in UTC: when the schedule
        fires next. Wall-clock ticks are read as ``latest_tick`` reads them; near a
        change of offset a later wall-clock time may be an earlier instant, so every
        tick up to ``_SHIFT`` past the first candidate is weighed."""
        wall = now.astimezone(self._zone).replace(tzinfo=None)
        ticks = croniter(self.cron, wall - _SHIFT)
        best: datetime | None = None
        while True:
            naive = ticks.get_next(datetime)
            if best is not None and naive > wall + _SHIFT:
                return best
            for instant in self.tick_instants(naive):
                if instant > now and (best is None or instant < best):
                    best = instant

    def tick_instants(self, naive: datetime) -> tuple[datetime, ...]:
        """The instants (in UTC) of the wall-clock time ``naive`` in the schedule's zone.

        One, usually; two in a repeated hour (the fall-back: 01:30 happens at both
        offsets, and fires at both); in a skipped hour (the spring-forward: 02:30 never
        shows on the wall clock) one, read with the offset before the change, i.e. an
        hour later on the new wall clock (02:30 fires at 03:30), which is where
        ``zoneinfo`` puts a time that does not exist.
        """
        first = naive.replace(tzinfo=self._zone, fold=0).astimezone(UTC)
        second = naive.replace(tzinfo=self._zone, fold=1).astimezone(UTC)
        if first != second and _exists(first, naive, self._zone):
            return (first, second)
        return (first,)

    def due_tick(self, now: datetime) -> datetime | None:
        """The tick to enqueue now, or None when the latest one is past its grace."""
        tick = self.latest_tick(now)
        return tick if now - tick <= self.misfire_grace else None

    def dedup(self, tick: datetime) -> DedupSpec:
        """The tick's key: its instant as the zone's wall clock writes it, offset
        included, so the two occurrences of a repeated hour differ. Its window outlasts
        every enqueue of the tick (none after ``misfire_grace``, ``due_tick``), and the
        chain is kept as long (``pgwork.retention``); a window rather than ``"ever"``,
        which would keep every tick's chain for ever."""
        return DedupSpec(
            f"cron:{self.name}:{tick.astimezone(self._zone).isoformat()}",
            scope="window",
            window=self.misfire_grace + _TICK_MARGIN,
        )


# How long a tick's key deduplicates past its misfire grace: for a worker that read
# the clock within the grace, then paused before its enqueue.
_TICK_MARGIN = timedelta(hours=1)
_MICROSECOND = timedelta(microseconds=1)
# Longer than any zone's change of offset (Antarctica/Troll shifts by two hours).
_SHIFT = timedelta(hours=3)


def _steady(zone: ZoneInfo, now: datetime) -> bool:
    """Whether ``zone`` keeps one offset from ``_SHIFT`` before ``now`` to after it."""
    offset = now.astimezone(zone).utcoffset()
    return (
        (now - _SHIFT).astimezone(zone).utcoffset()
        == offset
        == (now + _SHIFT).astimezone(zone).utcoffset()
    )


def _exists(instant: datetime, naive: datetime, zone: ZoneInfo) -> bool:
    """Whether ``instant`` shows as ``naive`` on ``zone``'s wall clock (a time in a
    skipped hour does not)."""
    return instant.astimezone(zone).replace(tzinfo=None) == naive
