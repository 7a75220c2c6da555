"""Job ids: UUIDv7, generated here so a chain's id is known before its row exists.

Time-ordered ids keep the primary-key index append-mostly (like a sequence) while
letting the client build a whole chain batch, root ids included, in one statement.
"""

from __future__ import annotations

import os
import time
import uuid

__all__ = ["new_id"]


def new_id() -> uuid.UUID:
    """Return a UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then random bits."""
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (millis & 0xFFFF_FFFF_FFFF) << 80
    value |= 0x7 << 76  # version
    value |= ((rand >> 64) & 0x0FFF) << 64  # rand_a (12 bits)
    value |= 0b10 << 62  # variant
    value |= rand & 0x3FFF_FFFF_FFFF_FFFF  # rand_b (62 bits)
    return uuid.UUID(int=value)
