"""Client API of flow limits at run time: override a job type's declared limits, pause
the type or one of its keys, resume, and read what runs against the limits.

Mixed into ``Client``. Every change is a row of the store's ``LimitControl`` (one per
type, or per key of a type) that every worker's acquire reads; an unset limit keeps
the code's declaration. Each argument is checked before any statement, and a change
is refused (``LimitNotDeclaredError``) when the type does not declare the limit it
would change: the acquire would never read it.

What a type declares is known from the client's registry, or, for a type it does not
hold (the ``pgwork`` command runs with an empty registry), from the declarations the
workers record when they register (the newest registered worker that runs the type,
stopped ones included until they are pruned). A type neither knows is refused, except
to lift an override or a pause stored earlier.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pgwork._flow_control import Rate, check_concurrency, check_rate
from pgwork._limits import check_limit_key, check_pause
from pgwork.adapters.limits import (
    KEEP,
    Keep,
    KeyLimitStatus,
    KeyUsage,
    LimitChange,
    Limits,
    LimitStatus,
    TypeUsage,
)
from pgwork.adapters.notify import Notice
from pgwork.errors import ConfigurationError, InvalidOptionError, LimitNotDeclaredError
from pgwork.job_types import JobType, JobTypeRegistry

if TYPE_CHECKING:
    from pgwork.adapters.capabilities import Capabilities
    from pgwork.adapters.notify import NotifyAdapter
    from pgwork.adapters.state import CoreStateAdapter, TransactionHandle

__all__ = ["LIMITS_KEY", "LimitsMixin", "declared_limits", "limits_metadata"]

# Where a worker records its types' declared limits in its registration's metadata.
LIMITS_KEY = "pgwork.limits"
# Keys ``Client.limits`` returns per type at most, of each kind (closest, marked).
MAX_KEYS = 1000


def declared_limits(job_type: JobType[Any, Any]) -> Limits:
    """The limits ``job_type`` declares in code."""
    return Limits(
        concurrency=job_type.concurrency,
        key_concurrency=job_type.key_concurrency,
        rate=job_type.rate,
        key_rate=job_type.key_rate,
    )


def _rate_json(rate: Rate | None) -> list[float] | None:
    return None if rate is None else [rate.n, rate.per.total_seconds()]


def limits_metadata(types: Mapping[str, JobType[Any, Any]]) -> dict[str, Any]:
    """A worker's registration metadata recording what its limited types declare, so
    that a client without them in its registry (the ``pgwork`` command, a dashboard)
    knows their declarations."""
    return {
        LIMITS_KEY: {
            name: {
                "concurrency": t.concurrency,
                "key_concurrency": t.key_concurrency,
                "rate": _rate_json(t.rate),
                "key_rate": _rate_json(t.key_rate),
            }
            for name, t in sorted(types.items())
            if t.limited
        }
    }


def _recorded(value: Any) -> Limits | None:
    """A declaration as a worker recorded it; None for anything else."""
    if not isinstance(value, Mapping):
        return None
    try:
        return Limits(
            concurrency=check_concurrency("concurrency", value.get("concurrency")),
            key_concurrency=check_concurrency("key_concurrency", value.get("key_concurrency")),
            rate=_recorded_rate(value.get("rate")),
            key_rate=_recorded_rate(value.get("key_rate")),
        )
    except (ConfigurationError, TypeError, ValueError):
        return None


def _recorded_rate(value: Any) -> Rate | None:
    if value is None:
        return None
    n, per_s = value
    return Rate(n, per=timedelta(seconds=per_s))


def _type_name(job_type: JobType[Any, Any] | str) -> str:
    if isinstance(job_type, JobType):
        return job_type.name
    if not isinstance(job_type, str) or not job_type:
        raise InvalidOptionError("job_type", job_type, "a JobType or a job type's name")
    return job_type


class LimitsMixin:
    """``set_limits``, ``pause_limits``, ``resume_limits`` and ``limits`` of ``Client``."""

    if TYPE_CHECKING:
        state: CoreStateAdapter
        capabilities: Capabilities
        notify: NotifyAdapter
        registry: JobTypeRegistry

        async def _read_handle(self, tx: object | None) -> TransactionHandle | None: ...

    async def set_limits(
        self,
        job_type: JobType[Any, Any] | str,
        *,
        key: str | None = None,
        concurrency: int | Keep | None = KEEP,
        key_concurrency: int | Keep | None = KEEP,
        rate: Rate | Keep | None = KEEP,
        key_rate: Rate | Keep | None = KEEP,
        tx: object | None = None,
    ) -> None:
        """Override the limits ``job_type`` declares, for every worker, until changed
        again. Each limit left out keeps its current override; ``None`` returns it to
        the code's declaration; a value (as the declaration accepts it) overrides it.

        Without ``key`` this changes the type's limits: ``concurrency``, ``rate``, and
        the per-key defaults ``key_concurrency`` and ``key_rate``. With ``key`` it
        changes that key's own limits, which take the place of the per-key defaults
        for it alone: only ``key_concurrency`` and ``key_rate`` then (a key has no
        type-wide limit). The type must declare some limit, a per-key one for a key's
        limits, and a rate (``rate`` or ``key_rate``) for a rate
        (``LimitNotDeclaredError``); a type unknown to the client and the workers is
        refused, except to reset (every limit given is None).

        Runs in ``tx`` when given (kept only if it commits), else commits on its own.
        The type's queues are then announced ready, so jobs a raised limit lets run
        start within a notification, not a poll.
        """
        name = _type_name(job_type)
        where = "set_limits"
        limit_key = check_limit_key(key, where=where) if key is not None else ""
        change = LimitChange(
            concurrency=_limit("concurrency", concurrency, where),
            key_concurrency=_limit("key_concurrency", key_concurrency, where),
            rate=_rate("rate", rate, where),
            key_rate=_rate("key_rate", key_rate, where),
        )
        given = {
            option: value
            for option, value in (
                ("concurrency", change.concurrency),
                ("key_concurrency", change.key_concurrency),
                ("rate", change.rate),
                ("key_rate", change.key_rate),
            )
            if value is not KEEP
        }
        if not given:
            raise ConfigurationError(
                "set_limits was given no limit to change: pass concurrency=, "
                "key_concurrency=, rate= or key_rate= (None returns one to its declaration)"
            )
        if key is not None:
            for option in ("concurrency", "rate"):
                if option in given:
                    raise InvalidOptionError(
                        option,
                        given[option],
                        f"left out with key= (a key's own limit is key_{option}=)",
                        where,
                    )
        resets_only = all(value is None for value in given.values())
        keyed = key is not None or any(
            given.get(option) is not None for option in ("key_concurrency", "key_rate")
        )
        rated = any(given.get(option) is not None for option in ("rate", "key_rate"))
        if not resets_only:
            await self._check_declared(name, keyed=keyed, rated=rated)
        store = self.capabilities.require_limit_control("Client.set_limits")
        handle = await self.state.adopt(tx) if tx is not None else None
        queues = await store.change_limits(
            handle, type_name=name, limit_key=limit_key, change=change
        )
        await self._announce(handle, name, queues)

    async def pause_limits(
        self,
        job_type: JobType[Any, Any] | str,
        *,
        key: str | None = None,
        until: datetime | None = None,
        after: timedelta | None = None,
        tx: object | None = None,
    ) -> None:
        """Start no attempt of ``job_type`` (or, with ``key``, of that key of it) before
        ``until`` (an aware datetime) or for ``after`` (a timedelta, from now on the
        database's clock): running attempts go on. A later pause replaces an earlier
        one. The type must declare a limit, and a per-key one to pause a key
        (``LimitNotDeclaredError``). Runs in ``tx`` when given, else commits on its own.
        """
        name = _type_name(job_type)
        where = "pause_limits"
        limit_key = check_limit_key(key, where=where) if key is not None else ""
        pause = check_pause(until, after, where=where)
        await self._check_declared(name, keyed=key is not None)
        store = self.capabilities.require_limit_control("Client.pause_limits")
        handle = await self.state.adopt(tx) if tx is not None else None
        await store.change_limits(
            handle, type_name=name, limit_key=limit_key, change=LimitChange(paused_until=pause)
        )

    async def resume_limits(
        self,
        job_type: JobType[Any, Any] | str,
        *,
        key: str | None = None,
        tx: object | None = None,
    ) -> None:
        """End a pause of ``job_type`` (or of its ``key``) now, and announce the type's
        queues ready so its waiting jobs start at once. Any type name is accepted, so a
        pause stored for a type no worker runs any more can still be lifted."""
        name = _type_name(job_type)
        limit_key = check_limit_key(key, where="resume_limits") if key is not None else ""
        store = self.capabilities.require_limit_control("Client.resume_limits")
        handle = await self.state.adopt(tx) if tx is not None else None
        queues = await store.change_limits(
            handle, type_name=name, limit_key=limit_key, change=LimitChange(paused_until=None)
        )
        await self._announce(handle, name, queues)

    async def limits(
        self,
        *,
        job_type: JobType[Any, Any] | str | None = None,
        keys: int = 10,
        tx: object | None = None,
    ) -> list[LimitStatus]:
        """Each limited job type (or only ``job_type``), by name: its declared limits,
        the overrides, the effective limits, the jobs running and waiting now, the
        attempts started in its rate's current window, its pause; and for a keyed type
        up to ``keys`` keys closest to their limits (running over their concurrency
        limit, or started over their rate) plus up to ``keys`` paused or overridden
        ones (``LimitStatus``). Types are those the
        client's registry or a registered worker declares limited, and those with a
        stored override or pause."""
        if not isinstance(keys, int) or isinstance(keys, bool) or not 1 <= keys <= MAX_KEYS:
            raise InvalidOptionError("keys", keys, f"an integer from 1 to {MAX_KEYS}", "limits")
        wanted = _type_name(job_type) if job_type is not None else None
        store = self.capabilities.require_limit_control("Client.limits")
        declared = await self._declarations()
        names = [wanted] if wanted is not None else sorted(n for n, d in declared.items() if d.any)
        usage = await store.limit_usage(
            await self._read_handle(tx),
            type_names=names,
            key_concurrency={
                n: d.key_concurrency for n, d in declared.items() if d.key_concurrency
            },
            rate={n: d.rate for n, d in declared.items() if d.rate},
            key_rate={n: d.key_rate for n, d in declared.items() if d.key_rate},
            keys=keys,
        )
        found = [_status(u, declared.get(u.type_name)) for u in usage]
        if wanted is not None:
            return [s for s in found if s.type_name == wanted]
        # A row the acquire keeps for a type no one declares any more, with nothing set.
        return [
            s
            for s in found
            if (s.declared is not None and s.declared.any) or s.override.any or s.paused
        ]

    # --- what the types declare --------------------------------------------------------

    async def _declarations(self) -> dict[str, Limits]:
        """Each type's declaration (``Limits()`` for a type that declares none): the
        registry's, else the newest registered worker's that records its types'."""
        found: dict[str, Limits] = {}
        workers = await self.state.list_workers(alive_within_s=0.0)
        for worker in sorted(workers, key=lambda w: w.started_at):
            recorded = worker.metadata.get(LIMITS_KEY) if worker.metadata else None
            if isinstance(recorded, Mapping):
                # A worker that records declarations runs its other types unlimited.
                for name in worker.job_types:
                    found[name] = Limits()
                for name, value in recorded.items():
                    limits = _recorded(value)
                    if isinstance(name, str) and limits is not None:
                        found[name] = limits
        for job_type in self.registry:
            found[job_type.name] = declared_limits(job_type)
        return found

    async def _check_declared(self, name: str, *, keyed: bool, rated: bool = False) -> None:
        if name in self.registry:
            declared: Limits | None = declared_limits(self.registry.get(name))
            known: list[str] = []
        else:
            everything = await self._declarations()
            declared = everything.get(name)
            known = sorted(everything)
        if declared is None:
            raise LimitNotDeclaredError(name, "unknown", known)
        if not declared.any:
            raise LimitNotDeclaredError(name, "unlimited")
        if keyed and not declared.keyed:
            raise LimitNotDeclaredError(name, "unkeyed")
        # A worker picks its acquire by what the types declare: one without a rate
        # records no starts, so a rate set over it would never bind.
        if rated and declared.rate is None and declared.key_rate is None:
            raise LimitNotDeclaredError(name, "unrated")

    async def _announce(
        self, handle: TransactionHandle | None, name: str, queues: list[str]
    ) -> None:
        """Wake workers of the type's queues: those the workers running it take jobs
        from, and the queue its declaration names."""
        wanted = set(queues)
        if name in self.registry:
            wanted.add(self.registry.get(name).queue)
        await self.notify.publish(
            handle, notices=[Notice(kind="ready", queue=q) for q in sorted(wanted)]
        )


def _limit(option: str, value: Any, where: str) -> int | Keep | None:
    return KEEP if value is KEEP else check_concurrency(option, value, where=where)


def _rate(option: str, value: Any, where: str) -> Rate | Keep | None:
    return KEEP if value is KEEP else check_rate(option, value, where=where)


def _status(usage: TypeUsage, declared: Limits | None) -> LimitStatus:
    effective = usage.override.over(declared or Limits())
    keys: list[KeyLimitStatus] = []
    if effective.keyed:
        keys = [_key_status(k, effective) for k in usage.keys]
        keys.sort(key=lambda k: (-(k.use if k.use is not None else -1.0), -k.running))
    return LimitStatus(
        type_name=usage.type_name,
        declared=declared,
        override=usage.override,
        effective=effective,
        running=usage.running,
        pending=usage.pending,
        paused_until=usage.paused_until,
        keys=tuple(keys),
        now=usage.now,
        started=usage.started,
    )


def _key_status(usage: KeyUsage, effective: Limits) -> KeyLimitStatus:
    # Its own limits where it has some, else the type's per-key ones.
    own = usage.override.over(effective)
    return KeyLimitStatus(
        limit_key=usage.limit_key,
        running=usage.running,
        pending=usage.pending,
        key_concurrency=own.key_concurrency,
        override=usage.override,
        paused_until=usage.paused_until,
        key_rate=own.key_rate,
        started=usage.started,
    )
