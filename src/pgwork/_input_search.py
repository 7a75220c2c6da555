"""Checking a search by input field before any SQL runs: the type, the path, the value.

``Client.find_by_input`` compares one field of each job's input with a JSON value. What
an operator types there (a dashboard form, a script) reaches the database only as
bound parameters, and only once it is known to be something the database accepts: a
NUL character, a lone surrogate or a number JSON cannot hold would otherwise fail the
statement with a driver error. Each check raises ``ConfigurationError`` saying what is
wrong and how to write it instead.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pgwork._limits import MAX_NAME_LENGTH
from pgwork.errors import ConfigurationError

__all__ = [
    "MAX_PATH_DEPTH",
    "MAX_VALUE_CHARS",
    "input_path",
    "input_type_name",
    "input_value_json",
    "parse_input_value",
]

# Keys (or array indexes) in a path, and characters in one key.
MAX_PATH_DEPTH = 16
MAX_KEY_CHARS = 256
# Characters of the value's JSON text: a field is compared with a value one types, not
# with a document.
MAX_VALUE_CHARS = 1000


def _text(what: str, value: str, limit: int) -> str:
    if not value:
        raise ConfigurationError(f"{what} is empty")
    if len(value) > limit:
        raise ConfigurationError(f"{what} is {len(value)} characters long; at most {limit}")
    if "\x00" in value:
        raise ConfigurationError(f"{what} holds a NUL character, which no job's input can")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigurationError(f"{what} holds a character that is not Unicode text") from None
    return value


def input_type_name(type_name: str) -> str:
    """``type_name`` if it can name a job type; ConfigurationError otherwise."""
    if not isinstance(type_name, str):
        raise ConfigurationError(f"the job type is a string, got {type_name!r}")
    return _text("the job type", type_name.strip(), MAX_NAME_LENGTH)


def input_path(field: str | Sequence[str]) -> tuple[str, ...]:
    """The keys of ``field``: ``"user_id"``, ``"address.city"``, ``"items.0.sku"`` (a
    leading ``input.`` is ignored), or the keys as a sequence when one holds a dot."""
    if isinstance(field, str):
        text = field.strip()
        if text == "input" or text.startswith("input."):
            text = text[len("input.") :]
        keys: Sequence[str] = text.split(".") if text else []
    else:
        keys = list(field)
    if not keys:
        raise ConfigurationError("the input field is empty; name a key, e.g. user_id")
    if len(keys) > MAX_PATH_DEPTH:
        raise ConfigurationError(
            f"the input field has {len(keys)} keys; at most {MAX_PATH_DEPTH} are followed"
        )
    for key in keys:
        if not isinstance(key, str):
            raise ConfigurationError(f"an input field's keys are strings, got {key!r}")
        _text(
            f"the key {key[:40]!r} of the input field" if key else "a key of the input field",
            key,
            MAX_KEY_CHARS,
        )
    return tuple(keys)


def _refuse_constant(name: str) -> Any:
    raise ConfigurationError(f"{name} is not a JSON value; JSON numbers are finite")


def parse_input_value(text: str) -> Any:
    """The JSON value ``text`` holds: ``42``, ``"42"``, ``true``, ``null``, ``[1, 2]``.

    ConfigurationError when it is not JSON, with the hint that a string is quoted."""
    text = text.strip()
    if len(text) > MAX_VALUE_CHARS:
        raise ConfigurationError(
            f"the value is {len(text)} characters long; at most {MAX_VALUE_CHARS}"
        )
    if not text:
        raise ConfigurationError('the value is empty; write JSON: 42, "text", true or null')
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:
        if isinstance(exc, ConfigurationError):
            raise
        shown = text if len(text) <= 40 else text[:40] + "…"
        quoted = json.dumps(text[:40] + ("…" if len(text) > 40 else ""), ensure_ascii=False)
        raise ConfigurationError(
            f"the value {shown!r} is not JSON ({getattr(exc, 'msg', exc)}); values are compared "
            "as JSON: "
            f"a number (42), a string in double quotes ({quoted}), true, false or null"
        ) from None


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_nul(v) for v in value)
    return False


def input_value_json(value: Any) -> str:
    """``value`` as the JSON text the search compares with; ConfigurationError if it
    is not JSON the database can hold (NaN, a NUL character, a lone surrogate) or
    longer than ``MAX_VALUE_CHARS``."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"the value cannot be written as JSON: {exc}") from None
    if len(text) > MAX_VALUE_CHARS:
        raise ConfigurationError(
            f"the value is {len(text)} characters of JSON; at most {MAX_VALUE_CHARS}"
        )
    if _holds_nul(value):
        raise ConfigurationError("the value holds a NUL character, which no job's input can")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigurationError("the value holds a character that is not Unicode text") from None
    return text
