"""Job ids: UUIDv7, generated here so a chain's id is known before its row exists.

Time-ordered ids keep the primary-key index append-mostly (like a sequence) while
letting the client build a whole chain batch, root ids included, in one statement.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Callable

__all__ = ["new_id", "new_ids"]


# Seeded from the OS, re-seeded in every forked child so two processes never share a
# sequence; one getrandbits call is much cheaper than a urandom system call per id.
_rng = random.Random(os.urandom(32))


def _reseed() -> None:
    _rng.seed(os.urandom(32))


os.register_at_fork(after_in_child=_reseed)


def new_id() -> uuid.UUID:
    """Return a UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then random bits."""
    millis = time.time_ns() // 1_000_000
    rand = _rng.getrandbits(80)
    value = (millis & 0xFFFF_FFFF_FFFF) << 80
    value |= 0x7 << 76  # version
    value |= ((rand >> 64) & 0x0FFF) << 64  # rand_a (12 bits)
    value |= 0b10 << 62  # variant
    value |= rand & 0x3FFF_FFFF_FFFF_FFFF  # rand_b (62 bits)
    return uuid.UUID(int=value)


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
    """Return ``count`` UUIDv7s sharing one timestamp, each with its own random bits."""
    millis = time.time_ns() // 1_000_000
    head = ((millis & 0xFFFF_FFFF_FFFF) << 80) | (0x7 << 76) | (0b10 << 62)
    bits = _rng.getrandbits
    make = _make
    ids = []
    for _ in range(count):
        rand = bits(74)  # rand_a (12 bits) and rand_b (62 bits)
        ids.append(make(head | ((rand >> 62) << 64) | (rand & 0x3FFF_FFFF_FFFF_FFFF)))
    return ids
