"""Job ids: UUIDv7, generated here so a chain's id is known before its row exists.

Time-ordered ids keep the primary-key index append-mostly (like a sequence) while
letting the client build a whole chain batch, root ids included, in one statement.
"""

from __future__ import annotations

import os
import random
import time
import uuid

__all__ = ["new_id"]


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
