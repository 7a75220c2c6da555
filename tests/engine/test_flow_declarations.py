"""Flow limits as a job type declares them: kept on the type, or refused at declaration.

A limit that cannot work (zero, a bool, past the documented maximum, a window longer
than a day) raises ``InvalidOptionError`` naming the option when the type is declared
or the ``Rate`` built, not in a worker later.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from pgwork import ConfigurationError, InvalidOptionError, JobTypeRegistry, Rate
from pgwork._flow_control import MAX_CONCURRENCY, MAX_RATE_COUNT, MAX_RATE_PERIOD

SECOND = timedelta(seconds=1)


class Call(BaseModel):
    url: str


def test_each_limit_is_kept_on_its_type() -> None:
    reg = JobTypeRegistry()
    per_key = Rate(2, per=timedelta(minutes=1))
    both = reg.job_type(
        "both",
        input=Call,
        concurrency=5,
        key_concurrency=1,
        rate=Rate(10, SECOND),
        key_rate=per_key,
    )
    assert (both.concurrency, both.key_concurrency) == (5, 1)
    assert both.rate == Rate(10, per=SECOND)
    assert both.key_rate is per_key
    assert (both.limited, both.keyed) == (True, True)


@pytest.mark.parametrize(
    ("options", "limited", "keyed"),
    [
        ({}, False, False),
        ({"concurrency": 3}, True, False),
        ({"rate": Rate(1, per=SECOND)}, True, False),
        ({"key_concurrency": 3}, True, True),
        ({"key_rate": Rate(1, per=SECOND)}, True, True),
    ],
    ids=["none", "concurrency", "rate", "key_concurrency", "key_rate"],
)
def test_limited_and_keyed_say_which_limits_a_type_declares(
    options: dict[str, Any], limited: bool, keyed: bool
) -> None:
    job_type = JobTypeRegistry().job_type("call", input=Call, **options)
    assert (job_type.limited, job_type.keyed) == (limited, keyed)
    for option in ("concurrency", "key_concurrency", "rate", "key_rate"):
        assert getattr(job_type, option) == options.get(option)


def test_the_largest_limits_are_accepted() -> None:
    job_type = JobTypeRegistry().job_type(
        "call",
        input=Call,
        concurrency=MAX_CONCURRENCY,
        key_concurrency=1,
        rate=Rate(MAX_RATE_COUNT, per=MAX_RATE_PERIOD),
        key_rate=Rate(1, per=timedelta(microseconds=1)),
    )
    assert job_type.concurrency == 10_000
    assert job_type.rate == Rate(100_000, per=timedelta(days=1))


def test_a_rate_is_a_frozen_value() -> None:
    rate = Rate(10, per=SECOND)
    assert rate == Rate(10, SECOND)
    assert hash(rate) == hash(Rate(10, SECOND))
    assert rate != Rate(10, per=timedelta(minutes=1))
    assert repr(rate) == "Rate(10, per=datetime.timedelta(seconds=1))"
    with pytest.raises(AttributeError):
        rate.n = 11  # type: ignore[misc]


BAD_LIMITS: list[tuple[str, Any]] = [
    ("concurrency", 0),
    ("concurrency", -1),
    ("concurrency", True),
    ("concurrency", 2.0),
    ("concurrency", "3"),
    ("concurrency", MAX_CONCURRENCY + 1),
    ("key_concurrency", 0),
    ("key_concurrency", False),
    ("key_concurrency", 10**9),
    ("rate", (10, SECOND)),
    ("rate", 10),
    ("key_rate", {"n": 1, "per": SECOND}),
]


@pytest.mark.parametrize(
    ("option", "value"), BAD_LIMITS, ids=[f"{o}-{i}" for i, (o, _) in enumerate(BAD_LIMITS)]
)
def test_a_limit_that_cannot_work_is_refused_at_declaration(option: str, value: Any) -> None:
    reg = JobTypeRegistry()
    with pytest.raises(InvalidOptionError) as caught:
        reg.job_type("call", input=Call, **{option: value})
    assert caught.value.option == option
    assert str(caught.value).startswith(f"{option} of job type 'call' must be")
    assert isinstance(caught.value, ConfigurationError)
    assert "call" not in reg  # nothing half-declared is left behind
    assert reg.job_type("call", input=Call).name == "call"


BAD_RATES: list[tuple[str, Any, Any]] = [
    ("n", 0, SECOND),
    ("n", -5, SECOND),
    ("n", True, SECOND),
    ("n", 1.5, SECOND),
    ("n", MAX_RATE_COUNT + 1, SECOND),
    ("per", 10, timedelta(0)),
    ("per", 10, -SECOND),
    ("per", 10, MAX_RATE_PERIOD + timedelta(microseconds=1)),
    ("per", 10, timedelta(days=7)),
    ("per", 10, 1.0),
    ("per", 10, None),
]


@pytest.mark.parametrize(
    ("option", "n", "per"), BAD_RATES, ids=[f"{o}-{i}" for i, (o, _, _) in enumerate(BAD_RATES)]
)
def test_a_rate_that_cannot_work_is_refused_when_built(option: str, n: Any, per: Any) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        Rate(n, per=per)
    assert caught.value.option == option
    assert str(caught.value).startswith(f"{option} of Rate must be")


def test_a_window_past_a_day_is_refused_as_a_quota() -> None:
    with pytest.raises(InvalidOptionError, match="a longer window is a quota, not a rate"):
        Rate(1000, per=timedelta(days=30))
