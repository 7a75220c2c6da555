"""Turning job inputs and outputs into stored JSON and back.

Every model kind (pydantic model, dataclass, TypedDict, plain types) goes through one
pydantic ``TypeAdapter``: validated on the way in, decoded on the way out. Errors are
raised before any SQL runs and name the offending path (``$.items[2].name``) so the
caller's transaction stays usable and the fix is obvious.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import math
import uuid
from collections.abc import Mapping
from typing import Any, Generic, TypeVar, cast

import pydantic
import pydantic_core

from pgwork.errors import (
    ConfigurationError,
    PayloadNotSerializableError,
    PayloadTooDeepError,
    PayloadTooLargeError,
    PayloadUndecodableError,
    PayloadValidationError,
)
from pgwork.records import UndecodablePayload

__all__ = ["DEFAULT_MAX_PAYLOAD_BYTES", "MAX_PAYLOAD_DEPTH", "Codec"]

T = TypeVar("T")

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
# pydantic serialises at most this many levels of nesting; deeper values also exhaust
# Python's recursion limit when validated or parsed, so they are refused by name.
MAX_PAYLOAD_DEPTH = 255


_SCALARS = (
    str,
    int,
    float,
    bool,
    type(None),
    # Types pydantic itself turns into JSON strings.
    dt.datetime,
    dt.date,
    dt.time,
    dt.timedelta,
    uuid.UUID,
    decimal.Decimal,
    enum.Enum,
)


class Codec(Generic[T]):
    """Validates, encodes and decodes one model type for one job type.

    ``what`` is "input" or "output", used in error messages.
    """

    __slots__ = (
        "_adapter",
        "_is_instance",
        "_serializer",
        "_validator",
        "model",
        "type_name",
        "what",
    )

    def __init__(self, model: type[T] | Any, *, type_name: str, what: str) -> None:
        self.model = model
        self.type_name = type_name
        self.what = what
        try:
            self._adapter: pydantic.TypeAdapter[T] = pydantic.TypeAdapter(model)
        except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError) as exc:
            raise ConfigurationError(
                f"the {what} model {model!r} of job type {type_name!r} cannot be used: {exc}"
            ) from exc
        # Instances of BaseModel were validated when built; skip re-validating them.
        self._is_instance = isinstance(model, type) and issubclass(model, pydantic.BaseModel)
        # ``TypeAdapter.dump_json`` with its defaults, minus a Python layer per call.
        self._serializer = self._adapter.serializer
        # And ``TypeAdapter.validate_python`` with its defaults: a worker validates an
        # input and an output per job, and the wrapper cost a third of each.
        self._validator = self._adapter.validator

    def validate(self, value: Any) -> T:
        """Return ``value`` as the model type, raising PayloadValidationError if it isn't."""
        if self._is_instance and isinstance(value, self.model):
            return cast(T, value)
        try:
            validated: T = self._validator.validate_python(value)  # (``cast`` is a call)
        except pydantic.ValidationError as exc:
            # ``from None``: pydantic's own message quotes the input values, and a chained
            # traceback ends up in logs, stored attempt errors and traces.
            raise PayloadValidationError(self.type_name, self.what, _describe(exc)) from None
        except RecursionError:
            raise PayloadTooDeepError(self.type_name, self.what, MAX_PAYLOAD_DEPTH) from None
        return validated

    def encode(self, value: Any, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
        """Validate ``value`` and return its JSON text, ready for a ``jsonb`` parameter."""
        validated = self.validate(value)
        try:
            data = self._serializer.to_json(validated)
        except (pydantic_core.PydanticSerializationError, TypeError, ValueError) as exc:
            if "serialization depth" in str(exc):
                raise PayloadTooDeepError(self.type_name, self.what, MAX_PAYLOAD_DEPTH) from None
            path, reason = _find_unstorable(validated, "$")
            raise PayloadNotSerializableError(
                self.type_name, self.what, path, reason or str(exc)
            ) from exc
        # The fast path is one serialisation in Rust. Only when the output could hide a
        # problem — pydantic writes NaN/Infinity as null (or as bare NaN for plain
        # dicts), and a NUL character as \u0000, which jsonb rejects — is the value
        # walked in Python to find (and name) the culprit. ``None`` itself (every
        # handler that returns nothing) has nothing to hide, and no walk to pay for.
        if validated is not None and (
            b"null" in data or b"NaN" in data or b"Infinity" in data or b"\\u0000" in data
        ):
            path, reason = _find_unstorable(validated, "$")
            if reason:
                raise PayloadNotSerializableError(self.type_name, self.what, path, reason)
        if len(data) > max_bytes:
            raise PayloadTooLargeError(self.type_name, self.what, len(data), max_bytes)
        return data.decode()

    def decode(self, data: Any) -> T:
        """Turn stored JSON (already parsed) back into the model type."""
        if isinstance(data, UndecodablePayload):
            raise PayloadUndecodableError(self.type_name, f"stored {self.what}", data.reason)
        try:
            decoded: T = self._validator.validate_python(data)
        except pydantic.ValidationError as exc:
            raise PayloadValidationError(
                self.type_name, f"stored {self.what}", _describe(exc)
            ) from None
        except RecursionError:
            raise PayloadTooDeepError(
                self.type_name, f"stored {self.what}", MAX_PAYLOAD_DEPTH
            ) from None
        return decoded


def _describe(exc: pydantic.ValidationError) -> str:
    """Where and why validation failed, never the offending value (it may be secret)."""
    parts = []
    for err in exc.errors()[:5]:
        loc = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - len(parts)
    if more > 0:
        parts.append(f"(+{more} more)")
    return "; ".join(parts)


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _find_unstorable(value: Any, path: str, depth: int = 0) -> tuple[str, str | None]:
    """Locate the first value that cannot be stored faithfully as jsonb: an object
    pydantic cannot serialise, a NaN or infinite float, a NUL character. Walks at most
    ``MAX_PAYLOAD_DEPTH`` levels (a deeper value is refused before this walk)."""
    if depth > MAX_PAYLOAD_DEPTH:
        return path, f"nested more than {MAX_PAYLOAD_DEPTH} levels deep"
    depth += 1
    if isinstance(value, float) and not math.isfinite(value):
        return path, f"{value} is not a valid JSON number"
    if isinstance(value, str) and "\x00" in value:
        return path, "contains a NUL character (\\u0000), which jsonb rejects"
    if isinstance(value, str) and not _utf8(value):
        return path, "contains a lone surrogate, which no text can store"
    if isinstance(value, _SCALARS):
        return path, None
    if isinstance(value, pydantic.BaseModel):
        for name in type(value).model_fields:
            found = _find_unstorable(getattr(value, name), f"{path}.{name}", depth)
            if found[1]:
                return found
        return path, None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            found = _find_unstorable(getattr(value, f.name), f"{path}.{f.name}", depth)
            if found[1]:
                return found
        return path, None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str | int | float | bool):
                return path, f"a key of type {type(key).__qualname__} is not a string"
            if isinstance(key, str) and "\x00" in key:
                return path, "a key contains a NUL character (\\u0000)"
            if isinstance(key, str) and not _utf8(key):
                return path, "a key contains a lone surrogate"
            found = _find_unstorable(item, f"{path}.{key}", depth)
            if found[1]:
                return found
        return path, None
    if isinstance(value, list | tuple | set | frozenset):
        for i, item in enumerate(value):
            found = _find_unstorable(item, f"{path}[{i}]", depth)
            if found[1]:
                return found
        return path, None
    return path, f"{type(value).__qualname__} is not JSON-serialisable"
