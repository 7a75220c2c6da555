"""The limits page's actions: set a type's (or a key's) concurrency limit or rate,
pause a type or a key for a while, resume it. Each reads its form (a rate as
``N/DURATION``, read as the command line reads it), and the client checks what it was
given (an unknown type, a key of a type without per-key limits, a value out of range)
and refuses with its own message."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from starlette.datastructures import FormData

from pgwork._flow_control import Rate, parse_rate, rate_text
from pgwork.client import Client
from pgwork.errors import ConfigurationError

__all__ = ["PAUSES", "pause_limit", "resume_limit", "set_limit"]

# The durations the pause form offers, by the value it posts.
PAUSES = {
    "60": "1 minute",
    "300": "5 minutes",
    "900": "15 minutes",
    "3600": "1 hour",
    "86400": "1 day",
}


def _type_and_key(form: FormData) -> tuple[str, str | None]:
    name = str(form.get("job_type", "")).strip()
    if not name:
        raise ConfigurationError("no job type given")
    key = str(form.get("limit_key", ""))
    return name, key or None


# The limits the form may set: the type's, and a key's own (or the per-key default);
# a count of attempts, or a rate.
_COUNTS = ("concurrency", "key_concurrency")
_RATES = ("rate", "key_rate")
_FIELDS = _COUNTS + _RATES


def _value(form: FormData, field: str) -> int | Rate | None:
    """A limit as typed: a whole number, or for a rate ``N/DURATION`` (``10/1s``);
    blank returns it to the declaration."""
    text = str(form.get("value", "")).strip()
    if not text:
        return None
    if field in _RATES:
        return parse_rate(text, field)
    try:
        return int(text)
    except ValueError:
        raise ConfigurationError(f"{field} must be a whole number, got {text!r}") from None


async def set_limit(client: Client, tx: object, form: FormData) -> tuple[str, str | None]:
    """Posts ``limit`` (which one) and ``value`` (blank: back to the declaration)."""
    name, key = _type_and_key(form)
    field = str(form.get("limit", ""))
    if field not in _FIELDS:
        raise ConfigurationError(f"limit must be one of {', '.join(_FIELDS)}, got {field!r}")
    value = _value(form, field)
    changes: dict[str, Any] = {field: value}
    await client.set_limits(name, key=key, tx=tx, **changes)
    what = f"key {key} of {name}" if key is not None else name
    if value is None:
        shown = "the declared limit"
    else:
        shown = rate_text(value) if isinstance(value, Rate) else str(value)
    return f"Set {field} of {what} to {shown}.", None


async def pause_limit(client: Client, tx: object, form: FormData) -> tuple[str, str | None]:
    name, key = _type_and_key(form)
    chosen = str(form.get("seconds", ""))
    if chosen not in PAUSES:
        raise ConfigurationError(f"pause for one of {', '.join(PAUSES.values())}")
    await client.pause_limits(name, key=key, after=timedelta(seconds=int(chosen)), tx=tx)
    what = f"key {key} of {name}" if key is not None else name
    return f"Paused {what} for {PAUSES[chosen]}.", None


async def resume_limit(client: Client, tx: object, form: FormData) -> tuple[str, str | None]:
    name, key = _type_and_key(form)
    await client.resume_limits(name, key=key, tx=tx)
    what = f"key {key} of {name}" if key is not None else name
    return f"Resumed {what}.", None
