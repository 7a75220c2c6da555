"""Recurring schedules: start a chain on every tick of a cron expression.

Schedules are declared in code and handed to workers (``schedules=[...]``). Every worker
checks them; each tick is enqueued exactly once across all of them because the chain
is started with the dedup key ``cron:<name>:<tick>`` (scope ``ever``), which pgwork
serialises per key in the database. Ticks are computed on the database clock. A tick
missed by more than ``misfire_grace`` (no worker was running) is skipped, as cron does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from pgwork._limits import check_queue_name
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
        if self.misfire_grace <= timedelta(0):
            raise ConfigurationError(f"schedule {self.name!r}: misfire_grace must be positive")
        if self.queue is not None:
            check_queue_name(self.queue, where=f"schedule {self.name!r}")

    def latest_tick(self, now: datetime) -> datetime:
        """The most recent tick at or before ``now`` (an aware datetime)."""
        local = now.astimezone(self._zone)
        # croniter's get_prev excludes ``now`` itself; step a microsecond past it.
        tick: datetime = croniter(self.cron, local + timedelta(microseconds=1)).get_prev(datetime)
        return tick

    def due_tick(self, now: datetime) -> datetime | None:
        """The tick to enqueue now, or None when the latest one is past its grace."""
        tick = self.latest_tick(now)
        return tick if now - tick <= self.misfire_grace else None

    def dedup(self, tick: datetime) -> DedupSpec:
        return DedupSpec(f"cron:{self.name}:{tick.isoformat()}", scope="ever")
