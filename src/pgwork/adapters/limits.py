"""Records of flow limits changed at run time: overrides, pauses, and what runs against
them.

A job type declares its limits in code (``registry.job_type(concurrency=...)``); an
operator may override them, or pause the type or one of its keys, while workers run.
The store keeps each change as a row of its own, one per type (``limit_key`` '') or per
key of a type, in which an unset limit keeps what the code declares
(``LimitControl`` in ``adapters.state``). The records here are the store's side of
that (``LimitChange``, ``TypeUsage``, ``KeyUsage``, ``LimitPruning``) and the client's
answer to ``Client.limits()`` (``LimitStatus``, ``KeyLimitStatus``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import TypeVar

from pgwork._flow_control import Rate

__all__ = [
    "KEEP",
    "Keep",
    "KeyLimitStatus",
    "KeyUsage",
    "LimitChange",
    "LimitPruning",
    "LimitStatus",
    "Limits",
    "TypeUsage",
]


class Keep(Enum):
    """The type of ``KEEP``: an argument left as it is stored."""

    KEEP = "keep"

    def __repr__(self) -> str:
        return "KEEP"


KEEP = Keep.KEEP
"""Leave this limit (or pause) as it is stored: the default of every argument of
``Client.set_limits``, where ``None`` means "back to the code's declaration"."""


@dataclass(frozen=True, slots=True)
class Limits:
    """The four flow limits of a job type (None: no such limit, or no override of it).

    On a key's row only ``key_concurrency`` and ``key_rate`` can be set: that key's own
    limits, in place of the type's per-key default."""

    concurrency: int | None = None
    key_concurrency: int | None = None
    rate: Rate | None = None
    key_rate: Rate | None = None

    def over(self, declared: Limits) -> Limits:
        """These overrides applied over ``declared``: each limit set here wins."""
        return Limits(
            concurrency=_first(self.concurrency, declared.concurrency),
            key_concurrency=_first(self.key_concurrency, declared.key_concurrency),
            rate=_first(self.rate, declared.rate),
            key_rate=_first(self.key_rate, declared.key_rate),
        )

    @property
    def any(self) -> bool:
        """Whether any limit is set."""
        return self.concurrency is not None or self.rate is not None or self.keyed

    @property
    def keyed(self) -> bool:
        """Whether a limit counts per key (``key_concurrency`` or ``key_rate``)."""
        return self.key_concurrency is not None or self.key_rate is not None


T = TypeVar("T")


def _first(given: T | None, otherwise: T | None) -> T | None:
    return given if given is not None else otherwise


@dataclass(frozen=True, slots=True)
class LimitChange:
    """What one write to a type's (or a key's) row changes; ``KEEP`` leaves a column
    as stored, ``None`` clears it (back to the code's declaration, or no pause).

    ``paused_until``: an aware datetime, or a ``timedelta`` from now on the store's
    clock. ``extend_pause``: keep the later of the stored pause and this one, so that
    two attempts pausing a key at once leave the longer pause (``Attempt.throttle``).
    The operator fairness cursor the acquire keeps in the same row is never touched.
    """

    concurrency: int | Keep | None = KEEP
    key_concurrency: int | Keep | None = KEEP
    rate: Rate | Keep | None = KEEP
    key_rate: Rate | Keep | None = KEEP
    paused_until: datetime | timedelta | Keep | None = KEEP
    extend_pause: bool = False


@dataclass(frozen=True, slots=True)
class LimitPruning:
    """What one ``Maintenance.prune_limits`` deleted: ``key_rows``, keys' rows that no
    longer hold anything (no override, no pause to come); ``starts``, recorded attempt
    starts older than any rate's window."""

    key_rows: int
    starts: int


@dataclass(frozen=True, slots=True)
class KeyUsage:
    """One limit key of a type as the store sees it: the jobs of the key running and
    pending now, and the key's own row (its overrides and pause), if any.

    ``limit_key`` None is the group of the type's jobs enqueued without a key.
    ``started``: the attempts of the key started in the window of its effective
    ``key_rate`` (its own override, else the type's per-key one), ending now; None
    when the key has no rate."""

    limit_key: str | None
    running: int
    pending: int
    override: Limits
    paused_until: datetime | None
    started: int | None = None


@dataclass(frozen=True, slots=True)
class TypeUsage:
    """A limited job type as the store sees it: its row's overrides and pause, the jobs
    of the type running and pending now (limited jobs only: those enqueued with a
    limit group), and some of its keys (``LimitControl.limit_usage``). ``started``:
    the attempts of the type (of every key) started in the window of its effective
    ``rate``, ending ``now``; None when the type has no rate."""

    type_name: str
    override: Limits
    paused_until: datetime | None
    running: int
    pending: int
    keys: tuple[KeyUsage, ...]
    now: datetime
    started: int | None = None


@dataclass(frozen=True, slots=True)
class KeyLimitStatus:
    """One key of a keyed type (``Client.limits``): how many of its jobs run and wait,
    its effective limits (its own override, else the type's per-key limit), its own
    overrides and its pause. ``limit_key`` None: the type's jobs enqueued without a
    key, which share the type's per-key limits and cannot be overridden or paused
    apart from the type. ``started``: its attempts started in the window of its
    effective ``key_rate``, ending now (None without a key rate)."""

    limit_key: str | None
    running: int
    pending: int
    key_concurrency: int | None
    override: Limits
    paused_until: datetime | None
    key_rate: Rate | None = None
    started: int | None = None

    @property
    def paused(self) -> bool:
        return self.paused_until is not None

    @property
    def use(self) -> float | None:
        """How near the key is to the nearer of its limits (1.0: at one): the larger of
        running over its concurrency limit and started over its rate's count; None
        without either."""
        uses = []
        if self.key_concurrency is not None:
            uses.append(self.running / self.key_concurrency)
        if self.key_rate is not None and self.started is not None:
            uses.append(self.started / self.key_rate.n)
        return max(uses, default=None)


@dataclass(frozen=True, slots=True)
class LimitStatus:
    """A limited job type at run time (``Client.limits``).

    ``declared``: the limits the code declares, from the client's registry or, for a
    type it does not know, from the newest registered worker that runs it (None when
    neither declares it: only its overrides are known). ``override``: what an
    operator set (None fields keep the declaration). ``effective``: the override
    over the declaration, what the workers' acquire enforces. ``running`` and
    ``pending``: the type's limited jobs now. ``started``: the attempts of the type
    started in the window of its effective ``rate``, ending ``now`` (None without a
    rate). ``paused_until``: no attempt of the type starts before then (None: not
    paused; a pause that has passed reads None). ``keys``: for a keyed type, the keys
    closest to their limits first (``KeyLimitStatus.use``: running over their
    concurrency limit, or started over their rate), then the keys paused or
    overridden, at most the number asked for of each."""

    type_name: str
    declared: Limits | None
    override: Limits
    effective: Limits
    running: int
    pending: int
    paused_until: datetime | None
    keys: tuple[KeyLimitStatus, ...]
    now: datetime
    started: int | None = None

    @property
    def paused(self) -> bool:
        return self.paused_until is not None

    @property
    def keyed(self) -> bool:
        return self.effective.keyed
