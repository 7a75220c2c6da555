"""What the job table's columns accept, checked in Python before any SQL runs.

An option out of its column's range (a priority over a ``smallint``, a
``max_attempts`` over an ``integer``, a NUL character in a ``text``) would otherwise
reach PostgreSQL and fail there with a driver error — which also aborts the caller's
transaction, so the enqueue takes down the caller's other work. Each check here raises
``InvalidOptionError`` naming the option and the range it accepts, and leaves the
caller's transaction untouched.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from pgwork.errors import InvalidOptionError

__all__ = [
    "LATEST_SCHEDULE",
    "MAX_ATOMIC_DEADLINE",
    "MAX_ATTEMPTS_RANGE",
    "MAX_CONTEXT_BYTES",
    "MAX_DEDUP_KEY_BYTES",
    "MAX_LIMIT_KEY_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_PAYLOAD_CAP",
    "PRIORITY_RANGE",
    "check_atomic_deadline",
    "check_context",
    "check_dedup_key",
    "check_delay",
    "check_limit_key",
    "check_max_attempts",
    "check_pause",
    "check_payload_cap",
    "check_priority",
    "check_queue_name",
    "check_run_at",
    "check_seconds",
    "storable_text",
]

PRIORITY_RANGE = (-32768, 32767)  # smallint
MAX_ATTEMPTS_RANGE = (1, 2**31 - 1)  # integer, and at least one attempt
MAX_NAME_LENGTH = 128
MAX_CONTEXT_BYTES = 4096
# The largest jsonb value PostgreSQL stores (its binary form; a JSON text near it may
# still be refused, but one over it always is).
MAX_PAYLOAD_CAP = 2**28 - 1
# A dedup key is indexed: a btree entry holds at most about 2.7 kB (a third of a page),
# and the key shares it with the chain type's name.
MAX_DEDUP_KEY_BYTES = 1024
# A limit key is indexed with its job's type name (``jobs_limit_pending_idx``): 200
# characters keep an entry well inside a btree page's third in any encoding, and a
# tenant, an account or a host name fits.
MAX_LIMIT_KEY_LENGTH = 200
# The latest time a job may be scheduled for: read back in any session time zone (up
# to UTC+14) it is still in the year 9999, the last a Python datetime (and so the
# driver) can return.
LATEST_SCHEDULE = datetime(9999, 12, 30, tzinfo=UTC)
# An atomic attempt's transaction is bounded by a server setting in milliseconds (an
# int: at most 2**31 - 1, about 24.8 days) of its deadline plus a few seconds.
MAX_ATOMIC_DEADLINE = timedelta(days=24)

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


def check_payload_cap(value: Any) -> int:
    if not _is_int(value) or not 1 <= value <= MAX_PAYLOAD_CAP:
        raise InvalidOptionError(
            "max_payload_bytes", value, f"an integer from 1 to {MAX_PAYLOAD_CAP} (jsonb's limit)"
        )
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


def storable_text(value: str) -> bool:
    """Whether a ``text`` (or a JSON string) can hold ``value``: no NUL character, and
    UTF-8 encodable (a lone surrogate is not)."""
    if "\x00" in value:
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_dedup_key(value: Any, *, where: str = "") -> str:
    if (
        not isinstance(value, str)
        or not value
        or not storable_text(value)
        or len(value.encode()) > MAX_DEDUP_KEY_BYTES
    ):
        raise InvalidOptionError(
            "dedup",
            value,
            f"a non-empty string of at most {MAX_DEDUP_KEY_BYTES} bytes in UTF-8, without "
            "NUL characters or lone surrogates (or a DedupSpec, or a Debounce)",
            where,
        )
    return value


def check_limit_key(value: Any, *, where: str = "") -> str:
    """The key a job's flow limits are counted by (``start_chain(limit_key=...)``,
    ``Continue(..., limit_key=...)``). The empty string is refused: ``job_limits``
    uses it for a type's row as a whole, and no job's key may look like that."""
    if (
        not isinstance(value, str)
        or not value
        or len(value) > MAX_LIMIT_KEY_LENGTH
        or not storable_text(value)
    ):
        raise InvalidOptionError(
            "limit_key",
            value,
            f"a non-empty string of at most {MAX_LIMIT_KEY_LENGTH} characters, without NUL "
            "characters or lone surrogates (or None for no key)",
            where,
        )
    return value


def check_delay(option: str, value: timedelta, *, where: str = "") -> timedelta:
    """A delay (or window) the database can add to (or take from) now: the result must
    stay within the years a timestamp can be read back in (now + it at the latest
    ``LATEST_SCHEDULE``, now - it from the year 1)."""
    rule = (
        f"a timedelta that keeps now + it before {LATEST_SCHEDULE.date()} "
        "and now - it after the year 1"
    )
    if not isinstance(value, timedelta):
        raise InvalidOptionError(option, value, rule, where)
    try:
        now = datetime.now(UTC)
        late = now + abs(value) > LATEST_SCHEDULE
        now - abs(value)
    except OverflowError:
        late = True
    if late:
        raise InvalidOptionError(option, value, rule, where)
    return value


def check_pause(until: Any = None, after: Any = None, *, where: str = "") -> datetime | timedelta:
    """How long a flow limit's pause lasts: exactly one of ``until`` (an aware datetime
    later than now, at the latest ``LATEST_SCHEDULE``) or ``after`` (a timedelta longer
    than zero, from now on the database's clock). A naive time is refused rather than
    read in some zone, and a past one because it would pause nothing."""
    if (until is None) == (after is None):
        raise InvalidOptionError(
            "until/after", (until, after), "exactly one of until= or after=", where
        )
    if after is not None:
        if not isinstance(after, timedelta) or after <= timedelta(0):
            raise InvalidOptionError("after", after, "a timedelta longer than zero", where)
        return check_delay("after", after, where=where)
    if (
        not isinstance(until, datetime)
        or until.tzinfo is None
        or until.tzinfo.utcoffset(until) is None
    ):
        raise InvalidOptionError(
            "until", until, "a timezone-aware datetime (e.g. datetime.now(UTC) + ...)", where
        )
    try:
        late = until.astimezone(UTC) > LATEST_SCHEDULE
    except OverflowError:
        late = True
    if late or until <= datetime.now(UTC):
        raise InvalidOptionError(
            "until", until, f"a time later than now and at the latest {LATEST_SCHEDULE}", where
        )
    return until


def check_run_at(value: datetime, *, where: str = "") -> datetime:
    """A schedule's time: any aware datetime up to ``LATEST_SCHEDULE`` (an earlier one
    than now runs now)."""
    try:
        late = value.astimezone(UTC) > LATEST_SCHEDULE
    except OverflowError:  # past the year 9999 in UTC
        late = True
    if late:
        raise InvalidOptionError(
            "schedule", value, f"at the latest {LATEST_SCHEDULE.isoformat()}", where
        )
    return value


def check_seconds(option: str, value: Any, *, where: str = "") -> float:
    """A duration in seconds (a number or a timedelta) that the database can add to
    now: finite, and within ``check_delay``'s years."""
    if isinstance(value, timedelta):
        check_delay(option, value, where=where)
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidOptionError(option, value, "a finite number of seconds or a timedelta", where)
    try:
        check_delay(option, timedelta(seconds=value), where=where)
    except (OverflowError, InvalidOptionError):
        raise InvalidOptionError(
            option,
            value,
            "a number of seconds that keeps now ± it within the years 1 to 9999",
            where,
        ) from None
    return float(value)


def check_atomic_deadline(option: str, value: timedelta, *, where: str = "") -> timedelta:
    """The deadline of an atomic attempt (its type's timeout, or lease without one): the
    server ends its transaction a few seconds after it, with a setting that holds up
    to 2**31 - 1 milliseconds."""
    if value > MAX_ATOMIC_DEADLINE:
        raise InvalidOptionError(
            option,
            value,
            f"at most {MAX_ATOMIC_DEADLINE.days} days for an atomic job type (its "
            "transaction is bounded by a server setting in milliseconds)",
            where,
        )
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
        if not storable_text(key) or not storable_text(item):
            raise InvalidOptionError(
                "context", value, rule + ", without NUL characters or lone surrogates", where
            )
        size += len(key.encode()) + len(item.encode()) + 6
    if size > MAX_CONTEXT_BYTES:
        raise InvalidOptionError("context", f"<{size} bytes>", rule, where)
    return dict(value)
