"""Job ids: UUIDv7, generated here so a chain's id is known before its row exists.

Time-ordered ids keep the primary-key index append-mostly (like a sequence) while
letting the client build a whole chain batch, root ids included, in one statement.
"""

from __future__ import annotations

import math
import os
import random
import time
import uuid
from collections.abc import Callable
from datetime import datetime

__all__ = ["first_id_at", "new_id", "new_ids"]


# Seeded from the OS, re-seeded in every forked child so two processes never share a
# sequence; one getrandbits call is much cheaper than a urandom system call per id.
_rng = random.Random(os.urandom(32))


def _reseed() -> None:
    _rng.seed(os.urandom(32))


os.register_at_fork(after_in_child=_reseed)


_RAND_B = (1 << 62) - 1
_HEAD_BITS = (0x7 << 76) | (0b10 << 62)  # version 7, RFC 9562 variant

# The last id this process made: ids only ever grow (RFC 9562 "monotonic random"), so
# two made in the same millisecond still sort in the order they were made, and a
# listing ordered by (created_at, id) shows one transaction's chains in that order.
_last = 0


def _monotonic(value: int) -> int:
    global _last
    if value <= _last:
        if _last & _RAND_B != _RAND_B:
            value = _last + 1
        else:  # rand_b used up within the millisecond: borrow the next one
            millis = (_last >> 80) + 1
            value = (millis << 80) | _HEAD_BITS | _rng.getrandbits(61)
    _last = value
    return value


def new_id() -> uuid.UUID:
    """Return a UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then random bits; each
    greater than the last one this process made."""
    millis = time.time_ns() // 1_000_000
    rand = _rng.getrandbits(80)
    value = (millis & 0xFFFF_FFFF_FFFF) << 80
    value |= 0x7 << 76  # version
    value |= ((rand >> 64) & 0x0FFF) << 64  # rand_a (12 bits)
    value |= 0b10 << 62  # variant
    value |= rand & _RAND_B  # rand_b (62 bits)
    return _make(_monotonic(value))


def first_id_at(at: datetime) -> uuid.UUID:
    """The smallest UUIDv7 of the millisecond ``at`` falls in (timezone-aware): every id
    made at or after ``at`` by a clock that agrees with the caller's is not smaller."""
    millis = max(0, math.floor(at.timestamp() * 1000))  # year 9999 still fits 48 bits
    return uuid.UUID(int=millis << 80)


_new = object.__new__
_set = object.__setattr__
_UNKNOWN = uuid.SafeUUID.unknown


def _fast_uuid(value: int) -> uuid.UUID:
    # ``UUID(int=...)`` range-checks its argument and goes through ``__setattr__``
    # guards; our values are in range by construction. This halves the cost of an id
    # in a batch; it is checked against the public constructor at import, and the
    # public constructor is used if they disagree (a future UUID layout).
    made = _new(uuid.UUID)
    _set(made, "int", value)
    _set(made, "is_safe", _UNKNOWN)
    return made


def _public_uuid(value: int) -> uuid.UUID:
    return uuid.UUID(int=value)


def _pick_constructor() -> Callable[[int], uuid.UUID]:
    probe = 0x0189_9F2A_4B3C_7D5E_8F60_1A2B_3C4D_5E6F
    try:
        fast, public = _fast_uuid(probe), uuid.UUID(int=probe)
        same = fast == public and str(fast) == str(public) and hash(fast) == hash(public)
    except (AttributeError, TypeError):
        same = False
    return _fast_uuid if same else _public_uuid


_make = _pick_constructor()


def new_ids(count: int) -> list[uuid.UUID]:
    """Return ``count`` UUIDv7s sharing one timestamp, each with its own random bits,
    in increasing order (and greater than any id made before)."""
    millis = time.time_ns() // 1_000_000
    head = ((millis & 0xFFFF_FFFF_FFFF) << 80) | (0x7 << 76) | (0b10 << 62)
    bits = _rng.getrandbits
    values = []
    for _ in range(count):
        rand = bits(74)  # rand_a (12 bits) and rand_b (62 bits)
        values.append(head | ((rand >> 62) << 64) | (rand & _RAND_B))
    values.sort()
    make, monotonic = _make, _monotonic
    return [make(monotonic(value)) for value in values]
