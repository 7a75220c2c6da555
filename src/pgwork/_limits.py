"""What the job table's columns accept, checked in Python before any SQL runs.

An option out of its column's range (a priority over a ``smallint``, a
``max_attempts`` over an ``integer``, a NUL character in a ``text``) would otherwise
reach PostgreSQL and fail there with a driver error — which also aborts the caller's
transaction, so the enqueue takes down the caller's other work. Each check here raises
``InvalidOptionError`` naming the option and the range it accepts, and leaves the
caller's transaction untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from pgwork.errors import InvalidOptionError

__all__ = [
    "MAX_ATTEMPTS_RANGE",
    "MAX_CONTEXT_BYTES",
    "MAX_NAME_LENGTH",
    "PRIORITY_RANGE",
    "check_context",
    "check_dedup_key",
    "check_delay",
    "check_max_attempts",
    "check_priority",
    "check_queue_name",
]

PRIORITY_RANGE = (-32768, 32767)  # smallint
MAX_ATTEMPTS_RANGE = (1, 2**31 - 1)  # integer, and at least one attempt
MAX_NAME_LENGTH = 128
MAX_CONTEXT_BYTES = 4096

_QUEUE_RULE = (
    f"a non-empty string of at most {MAX_NAME_LENGTH} printable characters, "
    "without leading or trailing whitespace"
)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_priority(value: Any, *, where: str = "") -> int:
    low, high = PRIORITY_RANGE
    if not _is_int(value) or not low <= value <= high:
        raise InvalidOptionError("priority", value, f"an integer from {low} to {high}", where)
    return int(value)


def check_max_attempts(value: Any, *, where: str = "") -> int:
    low, high = MAX_ATTEMPTS_RANGE
    if not _is_int(value) or not low <= value <= high:
        raise InvalidOptionError("max_attempts", value, f"an integer from {low} to {high}", where)
    return int(value)


def check_queue_name(value: Any, *, where: str = "") -> str:
    """Queue names travel in notifications and CLI tables; any printable name survives
    both (the notice puts the queue last), so only the empty, the unprintable and the
    padded — which look like another queue — are refused."""
    if (
        not isinstance(value, str)
        or not value
        or len(value) > MAX_NAME_LENGTH
        or not value.isprintable()
        or value != value.strip()
    ):
        raise InvalidOptionError("queue", value, _QUEUE_RULE, where)
    return value


def check_dedup_key(value: Any, *, where: str = "") -> str:
    if not isinstance(value, str) or not value or "\x00" in value:
        raise InvalidOptionError(
            "dedup", value, "a non-empty string without NUL characters (or a DedupSpec)", where
        )
    return value


def check_delay(option: str, value: timedelta, *, where: str = "") -> timedelta:
    """A delay (or window) the database can add to (or take from) now: the result must
    stay within the years a timestamp holds (up to 9999, like a Python datetime)."""
    try:
        now = datetime.now(UTC)
        now + abs(value)
        now - abs(value)
    except OverflowError:
        raise InvalidOptionError(
            option, value, "a timedelta that keeps now ± it within the years 1 to 9999", where
        ) from None
    return value


def check_context(value: Any, *, where: str = "") -> dict[str, str] | None:
    """A job's logging context: a small mapping of strings to strings, stored as jsonb."""
    if value is None:
        return None
    rule = f"a mapping of str to str, at most {MAX_CONTEXT_BYTES} bytes encoded"
    if not isinstance(value, Mapping):
        raise InvalidOptionError("context", value, rule, where)
    size = 2
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise InvalidOptionError("context", value, rule, where)
        if "\x00" in key or "\x00" in item:
            raise InvalidOptionError("context", value, rule + ", without NUL characters", where)
        size += len(key.encode()) + len(item.encode()) + 6
    if size > MAX_CONTEXT_BYTES:
        raise InvalidOptionError("context", f"<{size} bytes>", rule, where)
    return dict(value)
