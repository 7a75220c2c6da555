"""Signals: named events a waiting step of a chain starts on (docs/chains.md).

A ``SignalType[P]`` (``registry.signal(name, payload=Model)``) carries its payload
model ``P``, so ``client.signal(tx, payment, key, PaymentConfirmed(...))`` and the
waiting step's ``await attempt.received(payment)`` are checked by mypy end to end.
``SignalType`` is invariant in ``P``: another model is a type error, not an upcast.

A signal's *name* is ``"{type}:{key}"`` (the type's name alone without a key): the one
string the sender and the waiting step meet on. A type's name holds no ``':'``, so two
types never share a name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar
from uuid import UUID

from pgwork._limits import check_delay, storable_text
from pgwork.errors import ConfigurationError, InvalidOptionError
from pgwork.payload import Codec

__all__ = [
    "MAX_SIGNAL_KEY_LENGTH",
    "SignalKey",
    "SignalType",
    "SignalWait",
    "Signalled",
    "TimedOut",
    "check_signal_type_name",
]

P = TypeVar("P")

# A key names one thing (an order, a user): bounded like a limit key, so that a name
# always fits the index that matches it.
MAX_SIGNAL_KEY_LENGTH = 200

SignalKey = str | int | UUID
"""What names one signal of a type: a string, an integer or a UUID (as text)."""

# An integer of more bits has more than MAX_SIGNAL_KEY_LENGTH digits.
_KEY_BITS = 700

# Job type names, less ':' (the separator of a signal's name).
_TYPE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,199}$")


def check_signal_type_name(name: Any) -> str:
    """A signal type's name: up to 200 letters, digits, '_', '.' or '-', starting with
    a letter or '_'. No ':': it separates the type from the key in a signal's name."""
    if not isinstance(name, str) or not _TYPE_NAME.match(name):
        raise ConfigurationError(
            f"invalid signal type name {name!r}: use up to 200 letters, digits, '_', '.' "
            "or '-', starting with a letter or '_' (no ':', which separates a signal's "
            "type from its key)"
        )
    return name


@dataclass(frozen=True, eq=False, slots=True)
class SignalType(Generic[P]):
    """One declared kind of signal, with the model of its payload. Create with
    ``JobTypeRegistry.signal``; compared and hashed by identity."""

    name: str
    payload_model: Any
    payload_codec: Codec[P] = field(repr=False)

    def signal_name(self, key: SignalKey | None = None) -> str:
        """The name a signal of this type with ``key`` is sent to and waited for:
        ``"{type}:{key}"``, or the type's name alone without a key. ``InvalidOptionError``
        for a key that is not a non-empty string, integer or UUID of at most
        ``MAX_SIGNAL_KEY_LENGTH`` characters."""
        if key is None:
            return self.name
        text = _key_text(key)
        if not text or len(text) > MAX_SIGNAL_KEY_LENGTH or not storable_text(text):
            raise InvalidOptionError(
                "key",
                key,
                f"a non-empty string, an integer or a UUID of at most {MAX_SIGNAL_KEY_LENGTH} "
                "characters, without NUL characters or lone surrogates (or None for no key)",
                f"signal type {self.name!r}",
            )
        return f"{self.name}:{text}"

    def named(
        self, key: SignalKey | None = None, *, timeout: timedelta | None = None
    ) -> SignalWait[P]:
        """What ``Continue(..., wait_for=...)`` takes: wait for the signal of this type
        with ``key``, or for ``timeout`` (a positive timedelta; None waits for ever),
        whichever comes first. Checked here, where the wait is built."""
        name = self.signal_name(key)
        if timeout is not None:
            check_delay("timeout", timeout, where=f"the wait for signal {name!r}")
            if timeout <= timedelta(0):
                raise InvalidOptionError(
                    "timeout",
                    timeout,
                    "a positive timedelta (or None to wait without one)",
                    f"the wait for signal {name!r}",
                )
        return SignalWait(self, name, timeout)

    def __repr__(self) -> str:
        return f"SignalType({self.name!r})"


def _key_text(key: Any) -> str:
    if isinstance(key, bool) or not isinstance(key, str | int | UUID):
        return ""
    if isinstance(key, int) and key.bit_length() > _KEY_BITS:
        # Refused: too long as text (and past a few thousand digits ``str`` raises).
        return ""
    return key if isinstance(key, str) else str(key)


@dataclass(frozen=True, slots=True)
class SignalWait(Generic[P]):
    """A step's wait for one signal (``SignalType.named``): ``name`` is the signal's
    name, ``timeout`` how long the step waits for it before it starts without one."""

    signal_type: SignalType[P]
    name: str
    timeout: timedelta | None


@dataclass(frozen=True, slots=True)
class Signalled(Generic[P]):
    """What ``attempt.received`` returns for a step that a signal started: the signal's
    ``payload`` (decoded with its type's model), its ``name`` and when it was sent
    (``sent_at``, the database clock at the sender's transaction)."""

    payload: P
    name: str
    sent_at: datetime
    timed_out: bool = False


@dataclass(frozen=True, slots=True)
class TimedOut:
    """What ``attempt.received`` returns for a step that started without a signal:
    its timeout passed first (or something else started it: an operator's trigger, a
    ``Continue`` without ``wait_for``)."""

    timed_out: bool = True
