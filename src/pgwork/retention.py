"""How long a job type's ended chains are kept: a policy per way a chain can end.

A job type declares ``retention=`` (``JobTypeRegistry.job_type``); the workers'
maintenance deletes its chains that long after they ended. A type that declares
nothing gets ``DEFAULT_RETENTION``: completed chains for a day, failed and cancelled
ones for a week. A completed chain is rarely read after its caller has its outcome,
and a queue that ends hundreds of chains a second must not grow without bound; a
failed or cancelled one is what an operator looks into (and retries), possibly
after a weekend. ``Retention.forever()`` keeps a type's chains until they are deleted
(``Client.delete_chains``).

Some chains are kept past their period, whatever it is (docs/design/retention.md):
one another chain's job still waits on, one whose dedup key's window has not ended
(a ``DedupSpec`` with ``scope="window"``; ``scope="ever"`` keeps it for ever), and one
a caller awaits (``Client.await_chain``), for ``AWAITED_HOLD`` after it ended.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

from pgwork._limits import check_delay
from pgwork.errors import ConfigurationError

__all__ = ["AWAITED_HOLD", "DEFAULT_RETENTION", "Retention"]

# How long after its end a chain someone awaits is kept, however short its type's
# retention: an awaiter that missed the end's notice reads the outcome on its next
# poll (``await_chain``'s ``poll_interval``, a second by default), well within it.
AWAITED_HOLD = timedelta(minutes=5)

# The ways a chain ends, as ``ChainStatus`` values spell them.
_ENDINGS = ("completed", "failed", "cancelled")


@dataclass(frozen=True, slots=True)
class Retention:
    """How long after it ended a chain of the type is kept, per way it ended; ``None``
    keeps such chains until deleted.

    ``Retention()`` is the default; ``Retention(completed=timedelta(hours=1))`` changes
    only the completed chains' period; a plain ``timedelta`` given as a type's
    ``retention`` applies to all three (``Retention.uniform``).
    """

    completed: timedelta | None = timedelta(days=1)
    failed: timedelta | None = timedelta(days=7)
    cancelled: timedelta | None = timedelta(days=7)

    def __post_init__(self) -> None:
        for ending in _ENDINGS:
            period = getattr(self, ending)
            if period is None:
                continue
            # The period is taken from the database clock's now.
            check_delay(f"retention's {ending}", period)
            if period <= timedelta(0):
                raise ConfigurationError(
                    f"retention's {ending} period must be longer than zero, got {period}; "
                    "use None to keep such chains"
                )

    @classmethod
    def forever(cls) -> Retention:
        """Keep every ended chain of the type until ``Client.delete_chains``."""
        return cls(completed=None, failed=None, cancelled=None)

    @classmethod
    def uniform(cls, period: timedelta) -> Retention:
        """The same period whichever way a chain ended."""
        return cls(completed=period, failed=period, cancelled=period)

    @property
    def keeps_everything(self) -> bool:
        """Whether no chain of the type is ever deleted by retention."""
        return all(getattr(self, ending) is None for ending in _ENDINGS)

    def periods(self) -> Iterator[tuple[str, timedelta]]:
        """Each way of ending (a ``ChainStatus`` value) that has a period, with it."""
        for ending in _ENDINGS:
            period = getattr(self, ending)
            if period is not None:
                yield ending, period


DEFAULT_RETENTION = Retention()


def as_retention(value: Retention | timedelta | None, *, where: str) -> Retention:
    """A type's ``retention`` argument as a policy: a ``timedelta`` for every ending,
    ``None`` (like ``Retention.forever()``) to keep everything."""
    if value is None:
        return Retention.forever()
    if isinstance(value, Retention):
        return value
    if isinstance(value, timedelta):
        check_delay("retention", value, where=where)
        if value <= timedelta(0):
            raise ConfigurationError(f"retention of {where} must be positive, got {value}")
        return Retention.uniform(value)
    raise ConfigurationError(
        f"retention of {where} must be a Retention, a timedelta or None, got {value!r}"
    )
