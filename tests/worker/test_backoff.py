"""The retry policy is a pure function: min(initial * multiplier**(attempt-1), maximum)."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgwork import ConfigurationError, RetryPolicy, backoff_delay


def test_defaults_are_ten_seconds_doubling_up_to_five_minutes() -> None:
    policy = RetryPolicy()
    delays = [backoff_delay(n, policy).total_seconds() for n in range(1, 8)]
    assert delays == [10, 20, 40, 80, 160, 300, 300]


def test_huge_attempt_numbers_stay_at_the_cap() -> None:
    assert backoff_delay(10_000, RetryPolicy()) == timedelta(seconds=300)


@given(
    attempt=st.integers(min_value=1, max_value=60),
    jitter=st.floats(min_value=0.0, max_value=1.0),
    seed=st.integers(),
)
def test_jitter_stays_within_its_band_and_under_the_cap(
    attempt: int, jitter: float, seed: int
) -> None:
    policy = RetryPolicy(jitter=jitter)
    plain = backoff_delay(attempt, RetryPolicy()).total_seconds()
    jittered = backoff_delay(attempt, policy, random.Random(seed)).total_seconds()
    # timedelta keeps microseconds: allow one of rounding.
    assert plain * (1 - jitter) - 1e-6 <= jittered <= min(plain * (1 + jitter), 300) + 1e-6


def test_the_same_seed_gives_the_same_schedule() -> None:
    policy = RetryPolicy(jitter=0.5)
    first = [backoff_delay(n, policy, random.Random(7)) for n in range(1, 6)]
    again = [backoff_delay(n, policy, random.Random(7)) for n in range(1, 6)]
    assert first == again


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial": timedelta(seconds=-1)},
        {"multiplier": 0.5},
        {"initial": timedelta(seconds=10), "maximum": timedelta(seconds=5)},
        {"jitter": 1.5},
    ],
)
def test_impossible_policies_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_attempts_are_counted_from_one() -> None:
    with pytest.raises(ValueError, match="1-based"):
        backoff_delay(0, RetryPolicy())
