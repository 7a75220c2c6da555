"""Flow limits as a job type declares them: ``Rate``, and the bounds of each limit.

A job type may bound how many of its attempts run at once (``concurrency``, across
every worker) and how many start per window of time (``rate``), for the type as a
whole and per limit key (``key_concurrency``, ``key_rate``; the key is given at
enqueue, ``start_chain(limit_key=...)``). This module only says what a declaration
accepts; the worker's acquire enforces the limits (docs/design/flow-control.md).

Every bound here is checked when the type is declared (or the ``Rate`` built), so a
limit that cannot work fails at import, not in a worker hours later. An operator types
a rate as ``N/DURATION`` (``10/1s``, ``600/1h``) on the command line and in the
dashboard's forms: ``parse_rate`` reads it, ``rate_text`` writes it back. A leaf: it
imports nothing of pgwork but its errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pgwork.errors import ConfigurationError, InvalidOptionError

__all__ = [
    "MAX_CONCURRENCY",
    "MAX_RATE_COUNT",
    "MAX_RATE_PERIOD",
    "Rate",
    "check_concurrency",
    "check_rate",
    "duration_text",
    "parse_duration",
    "parse_rate",
    "rate_text",
]

# The acquire enforces a concurrency limit by counting the running attempts it bounds
# (an index range of running jobs). Past ten thousand that count costs every acquire
# more than the limit saves, and it is no bound a fleet of workers' slots would reach:
# declare no limit instead.
MAX_CONCURRENCY = 10_000
# The same for a rate: the attempts started in its window are counted.
MAX_RATE_COUNT = 100_000
# A window longer than a day is a quota, not a rate: enforcing it would mean keeping
# every start of the window (jobs that retention deleted included) and counting them
# on each acquire; and a worker fleet that waits a day for its next start looks hung.
# It is also the horizon of the recorded starts: the worker's maintenance deletes the
# starts older than this, which no window (declared or overridden, each a ``Rate``)
# can count.
MAX_RATE_PERIOD = timedelta(days=1)

_CONCURRENCY_RULE = f"an integer from 1 to {MAX_CONCURRENCY}, or None for no limit"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``n`` attempts started in any window of length ``per``:
    ``Rate(10, per=timedelta(seconds=1))``.

    A sliding window, not a fixed one: no span of ``per`` (starting at any instant)
    holds more than ``n`` starts, so a burst at the end of one second and another at
    the start of the next cannot add up to twice the rate. Each attempt counts, a
    retry as much as a first try, as it is what reaches the rate-limited service.

    ``n``: 1 to ``MAX_RATE_COUNT`` (100,000). ``per``: more than zero and at most
    ``MAX_RATE_PERIOD`` (one day; a longer window is a quota, which this is not). A
    faster rate takes a shorter window: a million a day is about
    ``Rate(41_667, per=timedelta(hours=1))``. Anything else is refused when the
    ``Rate`` is built, with ``InvalidOptionError``.
    """

    n: int
    per: timedelta

    def __post_init__(self) -> None:
        if not _is_int(self.n) or not 1 <= self.n <= MAX_RATE_COUNT:
            raise InvalidOptionError(
                "n", self.n, f"an integer from 1 to {MAX_RATE_COUNT} (attempts per window)", "Rate"
            )
        if not isinstance(self.per, timedelta) or not (timedelta(0) < self.per <= MAX_RATE_PERIOD):
            raise InvalidOptionError(
                "per",
                self.per,
                "a timedelta longer than zero and at most one day (a longer window is a "
                "quota, not a rate)",
                "Rate",
            )

    def __repr__(self) -> str:
        return f"Rate({self.n}, per={self.per!r})"


def check_concurrency(option: str, value: Any, *, where: str = "") -> int | None:
    """A concurrency limit (``concurrency``, ``key_concurrency``): None, or a count of
    attempts from 1 to ``MAX_CONCURRENCY``. Zero is refused rather than read as
    "paused": pausing is a control of its own."""
    if value is None:
        return None
    if not _is_int(value) or not 1 <= value <= MAX_CONCURRENCY:
        raise InvalidOptionError(option, value, _CONCURRENCY_RULE, where)
    return int(value)


def check_rate(option: str, value: Any, *, where: str = "") -> Rate | None:
    """A rate limit (``rate``, ``key_rate``): None or a ``Rate``, which checked its own
    bounds when it was built."""
    if value is None or isinstance(value, Rate):
        return value
    raise InvalidOptionError(
        option, value, "a pgwork.Rate, e.g. Rate(10, per=timedelta(seconds=1)), or None", where
    )


# A duration as an operator types it: a number of seconds, minutes, hours or days.
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$", re.ASCII)
_COUNT = re.compile(r"^\s*(\d+)\s*$", re.ASCII)


def parse_duration(value: str, option: str) -> timedelta:
    """``30s``, ``5m``, ``2h``, ``1d`` or a number of seconds; ``option`` names what was
    given in the error (``ConfigurationError``)."""
    found = _DURATION.match(value)
    try:
        if found:
            return timedelta(seconds=float(found[1]) * _UNITS[found[2] or "s"])
    except OverflowError:
        pass
    raise ConfigurationError(
        f"{option} {value!r} is not a duration: give a number with s, m, h or d (e.g. 30s, 5m, 2h)"
    )


def parse_rate(value: str, option: str) -> Rate:
    """``N/DURATION`` (``10/1s``, ``600/1h``) as a ``Rate``; ``option`` names what was
    given in the error (``ConfigurationError``), a rate out of ``Rate``'s bounds
    included."""
    count, _, per = value.partition("/")
    found = _COUNT.match(count)
    try:
        window = parse_duration(per, option) if found else None
    except ConfigurationError:
        window = None
    if found is None or window is None:
        raise ConfigurationError(
            f"{option} {value!r} is not a rate: give N/DURATION (a count, then a number "
            "with s, m, h or d), e.g. 10/1s or 600/1h"
        )
    try:
        return Rate(int(found[1]), per=window)
    except InvalidOptionError:
        raise ConfigurationError(
            f"{option} {value!r} is out of bounds: give N/DURATION with N from 1 to "
            f"{MAX_RATE_COUNT} and a DURATION longer than zero and at most 1d (a longer "
            "window is a quota, not a rate)"
        ) from None


def duration_text(span: timedelta) -> str:
    """``span`` as ``parse_duration`` reads it, in the largest unit it is a whole
    number of: ``1s``, ``90s``, ``1h``, ``1.5s``."""
    seconds = span.total_seconds()
    for unit in ("d", "h", "m"):
        if seconds and seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]:.0f}{unit}"
    return f"{seconds:.6f}".rstrip("0").rstrip(".") + "s"


def rate_text(rate: Rate) -> str:
    """``rate`` as ``parse_rate`` reads it: ``10/1s``, ``600/1h``, ``5/1.5s``."""
    return f"{rate.n}/{duration_text(rate.per)}"
