"""Flow limits as a job type declares them: ``Rate``, and the bounds of each limit.

A job type may bound how many of its attempts run at once (``concurrency``, across
every worker) and how many start per window of time (``rate``), for the type as a
whole and per limit key (``key_concurrency``, ``key_rate``; the key is given at
enqueue, ``start_chain(limit_key=...)``). This module only says what a declaration
accepts; the worker's acquire enforces the limits (docs/design/flow-control.md).

Every bound here is checked when the type is declared (or the ``Rate`` built), so a
limit that cannot work fails at import, not in a worker hours later. A leaf: it
imports nothing of pgwork but its errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pgwork.errors import InvalidOptionError

__all__ = [
    "MAX_CONCURRENCY",
    "MAX_RATE_COUNT",
    "MAX_RATE_PERIOD",
    "Rate",
    "check_concurrency",
    "check_rate",
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
