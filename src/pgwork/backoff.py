"""The retry policy: how long a failed attempt waits before the next one.

Pure functions of (attempt, policy, rng) so the schedule can be tested exactly and the
worker can inject its own randomness.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta

from pgwork._limits import check_delay
from pgwork.errors import ConfigurationError

__all__ = ["RetryPolicy", "backoff_delay"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff: ``min(initial * multiplier ** (attempt - 1), maximum)``.

    ``jitter`` spreads retries of jobs that failed together: the delay is multiplied by
    a random factor in ``[1 - jitter, 1 + jitter]`` (then capped at ``maximum``).
    Defaults: 10 s, x2, 300 s cap, no jitter.
    """

    initial: timedelta = timedelta(seconds=10)
    multiplier: float = 2.0
    maximum: timedelta = timedelta(seconds=300)
    jitter: float = 0.0

    def __post_init__(self) -> None:
        # A retry is scheduled at now + the delay, on the database clock.
        check_delay("RetryPolicy.initial", self.initial)
        check_delay("RetryPolicy.maximum", self.maximum)
        if self.initial < timedelta(0):
            raise ConfigurationError(f"RetryPolicy.initial must not be negative: {self.initial}")
        if self.multiplier < 1.0:
            raise ConfigurationError(f"RetryPolicy.multiplier must be >= 1 (got {self.multiplier})")
        if self.maximum < self.initial:
            raise ConfigurationError(
                f"RetryPolicy.maximum ({self.maximum}) is shorter than initial ({self.initial})"
            )
        if not 0.0 <= self.jitter <= 1.0:
            raise ConfigurationError(f"RetryPolicy.jitter must be in [0, 1] (got {self.jitter})")


def backoff_delay(attempt: int, policy: RetryPolicy, rng: random.Random | None = None) -> timedelta:
    """Delay before the attempt after ``attempt`` (1-based: the attempt that just failed)."""
    if attempt < 1:
        raise ValueError(f"attempt is 1-based, got {attempt}")
    initial = policy.initial.total_seconds()
    cap = policy.maximum.total_seconds()
    # Exponent capped so huge attempt counts cannot overflow a float.
    exponent = min(attempt - 1, 1024)
    try:
        seconds = min(initial * policy.multiplier**exponent, cap)
    except OverflowError:
        seconds = cap
    if policy.jitter:
        factor = (rng or random).uniform(1.0 - policy.jitter, 1.0 + policy.jitter)
        seconds = min(seconds * factor, cap)
    return timedelta(seconds=seconds)
