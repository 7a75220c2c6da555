"""Array parameters of the worker's turn statement, dumped by pgwork itself.

psycopg dumps a Python list with its generic list dumper, which inspects the elements
on every call. A worker's turn (``complete_and_acquire``) sends seven arrays, and their
dumping came to about a tenth of a drained job's CPU (``python -m bench.cpu --only
drain``). Here each array is written straight in PostgreSQL's binary array format,
several times faster, into a ``bytes`` subclass
whose dumper hands it over as it is, and the turn's constant arrays (type names, lease
seconds, queues) are built once per worker and reused.

Only for psycopg connections pgwork's pool opened (the dumpers are registered in
psycopg's global adapters map, for these private types only); text elements are
encoded in the connection's own encoding, as psycopg's dumper would.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

from pgwork.adapters.state import Completion

__all__ = ["completion_arrays", "turn_constants"]

# ndim, has-nulls flag, element oid, then (length, lower bound) of the one dimension.
_HEAD = struct.Struct("!iiIii")
# An empty array has no dimension at all.
_EMPTY = struct.Struct("!iiI")
_FLOAT8 = struct.Struct("!id")
_UUID_LEN = b"\x00\x00\x00\x10"
_NULL = b"\xff\xff\xff\xff"  # an element of length -1
_TRUE, _FALSE = b"\x00\x00\x00\x01\x01", b"\x00\x00\x00\x01\x00"
_INT4 = struct.Struct("!i")
_INT4_VALUE = struct.Struct("!ii")  # an element's length, then the value

_UUID, _TEXT, _BOOL, _FLOAT, _INT = 2950, 25, 16, 701, 23


class _Array(bytes):
    """A one-dimensional array already in PostgreSQL's binary format."""

    __slots__ = ()


class UuidArray(_Array):
    __slots__ = ()


class TextArray(_Array):
    __slots__ = ()


class BoolArray(_Array):
    __slots__ = ()


class Float8Array(_Array):
    __slots__ = ()


class Int4Array(_Array):
    __slots__ = ()


class _Passed(Dumper):
    format = Format.BINARY

    def dump(self, obj: Any) -> bytes:
        return obj  # type: ignore[no-any-return]


def _register(cls: type[_Array], array_oid: int) -> None:
    dumper = type(f"{cls.__name__}Dumper", (_Passed,), {"oid": array_oid})
    psycopg.adapters.register_dumper(cls, dumper)


_register(UuidArray, 2951)
_register(TextArray, 1009)
_register(BoolArray, 1000)
_register(Float8Array, 1022)
_register(Int4Array, 1007)


def _head(oid: int, length: int) -> bytes:
    return _HEAD.pack(1, 0, oid, length, 1) if length else _EMPTY.pack(0, 0, oid)


def uuids(values: Sequence[UUID | None]) -> UuidArray:
    """A ``uuid[]``; ``None`` is a NULL element (a completion from outside any lease
    has no lease token)."""
    try:
        # Not ``UUID.bytes`` (a property over ``int``) nor ``None in values`` (which
        # compares every uuid through ``UUID.__eq__``): both Python calls per element,
        # two arrays of them per job a worker completes. A NULL element has no ``int``.
        elements = [_UUID_LEN + v.int.to_bytes(16, "big") for v in values]  # type: ignore[union-attr]
    except AttributeError:
        head = _HEAD.pack(1, 1, _UUID, len(values), 1)
        return UuidArray(
            head + b"".join([_NULL if v is None else _UUID_LEN + v.bytes for v in values])
        )
    return UuidArray(_head(_UUID, len(values)) + b"".join(elements))


def texts(values: Sequence[str], encoding: str) -> TextArray:
    parts = [_head(_TEXT, len(values))]
    for value in values:
        data = value.encode(encoding)
        parts.append(_INT4.pack(len(data)))
        parts.append(data)
    return TextArray(b"".join(parts))


def ints(values: Sequence[int | None]) -> Int4Array:
    """An ``int[]``; ``None`` is a NULL element (a limit not set)."""
    nulls = None in values
    head = _HEAD.pack(1, int(nulls), _INT, len(values), 1) if values else _EMPTY.pack(0, 0, _INT)
    return Int4Array(
        head + b"".join([_NULL if v is None else _INT4_VALUE.pack(4, v) for v in values])
    )


def bools(values: Sequence[bool]) -> BoolArray:
    head = _head(_BOOL, len(values))
    return BoolArray(head + b"".join([_TRUE if v else _FALSE for v in values]))


def floats(values: Sequence[float]) -> Float8Array:
    head = _head(_FLOAT, len(values))
    return Float8Array(head + b"".join([_FLOAT8.pack(8, v) for v in values]))


def optional_floats(values: Sequence[float | None]) -> Float8Array:
    """A ``float8[]``; ``None`` is a NULL element (a rate's window not set)."""
    if None not in values:
        return floats(values)  # type: ignore[arg-type]
    head = _HEAD.pack(1, 1, _FLOAT, len(values), 1)
    return Float8Array(
        head + b"".join([_NULL if v is None else _FLOAT8.pack(8, v) for v in values])
    )


def completion_arrays(completions: Sequence[Completion], encoding: str) -> dict[str, Any]:
    """The completion arrays of the turn statement (``ids``, ``tokens``, ``outputs``,
    ``ends_chain``), as ``completion_params`` gives them to psycopg's list dumper."""
    return {
        "ids": uuids([c.job_id for c in completions]),
        "tokens": uuids([c.lease_token for c in completions]),
        "outputs": texts([c.output_json for c in completions], encoding),
        "ends_chain": bools([c.continuation is None for c in completions]),
    }


@functools.lru_cache(maxsize=64)
def turn_constants(
    leases: tuple[tuple[str, timedelta], ...], queues: tuple[str, ...] | None, encoding: str
) -> dict[str, Any]:
    """A worker's acquire arrays, the same on every turn: built once (do not mutate)."""
    params: dict[str, Any] = {
        "type_names": texts([name for name, _ in leases], encoding),
        "lease_seconds": floats([d.total_seconds() for _, d in leases]),
    }
    if queues is not None:
        params["queues"] = texts(queues, encoding)
    return params
