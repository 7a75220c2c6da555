"""Job type declarations and the registry that holds them.

A ``JobType[I, O]`` carries its input model ``I`` and output model ``O`` as type
parameters, so ``client.start_chain(tx, send_email, SendEmail(...))`` and a handler
typed ``Attempt[SendEmail, Sent]`` are checked by mypy/pyright end to end. ``JobType``
is invariant in ``I``: passing another model is a type error, not a silent upcast.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, Literal, TypedDict, TypeVar, Unpack, overload

from pgwork._flow_control import Rate, check_concurrency, check_rate
from pgwork._limits import (
    check_atomic_deadline,
    check_delay,
    check_limit_key,
    check_max_attempts,
    check_priority,
    check_queue_name,
)
from pgwork.backoff import RetryPolicy
from pgwork.errors import (
    ConfigurationError,
    ContinuationNotAllowedError,
    DuplicateJobTypeError,
    DuplicateSignalTypeError,
    NotAnEntryTypeError,
    UnknownJobTypeError,
    UnknownSignalTypeError,
)
from pgwork.fan_out import Children
from pgwork.payload import Codec
from pgwork.retention import DEFAULT_RETENTION, Retention, as_retention
from pgwork.signals import SignalType, SignalWait, check_signal_type_name

__all__ = [
    "BlockerFailurePolicy",
    "Continuation",
    "Continue",
    "JobType",
    "JobTypeOptions",
    "JobTypeRegistry",
    "ProcessingMode",
    "WaitingJobType",
]

I = TypeVar("I")  # noqa: E741 - the conventional name for "input"
O = TypeVar("O")  # noqa: E741
I2 = TypeVar("I2")
P = TypeVar("P")

ProcessingMode = Literal["staged", "atomic"]
# What happens to a job blocked on a chain that fails or is cancelled.
BlockerFailurePolicy = Literal["fail", "cancel", "unblock"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:\-]{0,199}$")


@dataclass(frozen=True, eq=False, slots=True)
class JobType(Generic[I, O]):
    """One declared job type. Create with ``JobTypeRegistry.job_type``.

    Compared and hashed by identity, so it can key the worker's ``processors`` mapping.
    The flow limits (``concurrency``, ``key_concurrency``, ``rate``, ``key_rate``) are
    ``None`` when not declared; see ``JobTypeRegistry.job_type``.
    """

    name: str
    input_model: Any
    output_model: Any
    entry: bool
    continue_with: frozenset[str]
    lease: timedelta
    retry: RetryPolicy
    max_attempts: int
    queue: str
    priority: int
    timeout: timedelta | None
    mode: ProcessingMode
    abandon_after: timedelta | None
    retention: Retention
    blocker_failure: BlockerFailurePolicy
    input_codec: Codec[I] = field(repr=False)
    output_codec: Codec[O] = field(repr=False)
    concurrency: int | None = None
    key_concurrency: int | None = None
    rate: Rate | None = None
    key_rate: Rate | None = None
    # The signal type its steps wait for (``Continue(..., wait_for=...)``), or None.
    waits_for: SignalType[Any] | None = None

    @property
    def limited(self) -> bool:
        """Whether any flow limit is declared: the acquire has something to count."""
        return (
            self.concurrency is not None
            or self.key_concurrency is not None
            or self.rate is not None
            or self.key_rate is not None
        )

    @property
    def keyed(self) -> bool:
        """Whether a limit is counted per limit key (``key_concurrency`` or
        ``key_rate``). Jobs of such a type enqueued without a key share one key of
        their own: the missing key counts as one key."""
        return self.key_concurrency is not None or self.key_rate is not None

    def limit_group(self, limit_key: str | None) -> str | None:
        """The group this type's limits count a job with ``limit_key`` in: the key for
        a keyed type, '' for a type limited as a whole (and for a keyed type's job
        without a key: those share one group); None for a type without limits, whose
        jobs the limited acquire never counts."""
        if not self.limited:
            return None
        if self.keyed and limit_key is not None:
            return limit_key
        return ""

    def __repr__(self) -> str:
        return f"JobType({self.name!r})"


class JobTypeOptions(TypedDict, total=False):
    """The options of ``JobTypeRegistry.job_type`` besides the name, the models and
    ``waits_for``, each described there: one list for the overloads that type a
    declaration by its models and signal."""

    entry: bool
    continue_with: Iterable[str | JobType[Any, Any]]
    lease: timedelta
    retry: RetryPolicy | None
    max_attempts: int
    queue: str
    priority: int
    timeout: timedelta | None
    mode: ProcessingMode
    abandon_after: timedelta | None
    retention: Retention | timedelta | None
    blocker_failure: BlockerFailurePolicy
    concurrency: int | None
    key_concurrency: int | None
    rate: Rate | None
    key_rate: Rate | None


class WaitingJobType(JobType[I, O], Generic[I, O, P]):
    """A ``JobType`` declared with ``waits_for=`` a ``SignalType[P]``: the same at run
    time, it carries the signal's payload model ``P`` for mypy, so that
    ``Continue(step, input, wait_for=other_signal.named(...))`` is a type error."""

    __slots__ = ()


class Continuation:
    """What ``attempt.complete(continue_with=...)`` accepts: build it with ``Continue``.

    A plain (non-generic) base on purpose: typed as ``Continue[Any]`` the parameter would
    let mypy solve ``Continue(next_type, input)`` against ``Any`` and accept any input.
    """

    __slots__ = ("input", "job_type", "limit_key", "schedule_after", "wait")

    job_type: JobType[Any, Any]
    input: Any
    schedule_after: timedelta | None
    limit_key: str | None
    # What the next job waits for before it starts (``wait_for=``): a signal, the child
    # chains the attempt started, or None.
    wait: SignalWait[Any] | Children | None


class Continue(Continuation, Generic[I2]):
    """The next job of a chain: ``Continue(next_type, NextInput(...), after=None)``.

    Passed to ``attempt.complete(continue_with=...)`` (or returned by a handler); the
    next job is inserted in the same transaction that completes the current one.
    ``limit_key``: the key the next job's flow limits are counted by; without one it
    keeps the key of the job that hands on (as it keeps the chain's ``context``).
    ``wait_for``: the next job starts only when the signal arrives, or its timeout
    passes (``signal_type.named(key, timeout=...)``); its type must declare
    ``waits_for=`` that signal type. Or the next job starts only when the child chains
    this attempt started complete (``Children(chains, need=None)``: all of them, or the
    first ``need``). Waiting, it holds no slot and costs one row.
    """

    __slots__ = ()

    job_type: JobType[I2, Any]
    input: I2

    @overload
    def __init__(
        self,
        job_type: WaitingJobType[I2, Any, P],
        input: I2,
        *,
        limit_key: str | None = ...,
        wait_for: SignalWait[P],
    ) -> None: ...

    @overload
    def __init__(
        self,
        job_type: JobType[I2, Any],
        input: I2,
        *,
        limit_key: str | None = ...,
        wait_for: Children,
    ) -> None: ...

    @overload
    def __init__(
        self,
        job_type: JobType[I2, Any],
        input: I2,
        *,
        after: timedelta | None = ...,
        limit_key: str | None = ...,
    ) -> None: ...

    def __init__(
        self,
        job_type: JobType[I2, Any],
        input: I2,
        *,
        after: timedelta | None = None,
        limit_key: str | None = None,
        wait_for: SignalWait[Any] | Children | None = None,
    ) -> None:
        self.job_type = job_type
        self.input = input
        # Checked here, in the handler that builds it: past the database clock's
        # range the continuation could never be written.
        self.schedule_after = None if after is None else check_delay("after", after)
        self.limit_key = None if limit_key is None else check_limit_key(limit_key)
        if wait_for is not None and not isinstance(wait_for, SignalWait | Children):
            raise ConfigurationError(
                "wait_for must be signal_type.named(key, timeout=...) or "
                f"Children(chains, need=...), got {wait_for!r}"
            )
        if wait_for is not None and after is not None:
            raise ConfigurationError(
                "Continue takes after= or wait_for=, not both: a waiting step starts when "
                "what it waits for arrives (or its timeout passes)"
            )
        self.wait = wait_for

    def __repr__(self) -> str:
        return f"Continue({self.job_type.name!r}, {self.input!r})"


class JobTypeRegistry:
    """All job types an application knows, by name.

    Both the client (to validate and route what is enqueued) and the worker (to decode
    what it acquires) resolve names through one registry.
    """

    def __init__(self) -> None:
        self._types: dict[str, JobType[Any, Any]] = {}
        self._signals: dict[str, SignalType[Any]] = {}

    @overload
    def job_type(
        self,
        name: str,
        *,
        input: type[I],
        output: type[O],
        waits_for: SignalType[P],
        **options: Unpack[JobTypeOptions],
    ) -> WaitingJobType[I, O, P]: ...

    @overload
    def job_type(
        self,
        name: str,
        *,
        input: type[I],
        output: None = ...,
        waits_for: SignalType[P],
        **options: Unpack[JobTypeOptions],
    ) -> WaitingJobType[I, Any, P]: ...

    @overload
    def job_type(
        self,
        name: str,
        *,
        input: type[I],
        output: type[O],
        waits_for: None = ...,
        **options: Unpack[JobTypeOptions],
    ) -> JobType[I, O]: ...

    @overload
    def job_type(
        self,
        name: str,
        *,
        input: type[I],
        output: None = ...,
        waits_for: None = ...,
        **options: Unpack[JobTypeOptions],
    ) -> JobType[I, Any]: ...

    def job_type(
        self,
        name: str,
        *,
        input: Any,
        output: Any = None,
        entry: bool = True,
        continue_with: Iterable[str | JobType[Any, Any]] = (),
        lease: timedelta = timedelta(seconds=60),
        retry: RetryPolicy | None = None,
        max_attempts: int = 5,
        queue: str = "default",
        priority: int = 0,
        timeout: timedelta | None = None,
        mode: ProcessingMode = "staged",
        abandon_after: timedelta | None = None,
        retention: Retention | timedelta | None = DEFAULT_RETENTION,
        blocker_failure: BlockerFailurePolicy = "fail",
        concurrency: int | None = None,
        key_concurrency: int | None = None,
        rate: Rate | None = None,
        key_rate: Rate | None = None,
        waits_for: SignalType[Any] | None = None,
    ) -> JobType[Any, Any]:
        """Declare a job type.

        ``entry``: may start a chain. ``continue_with``: names (or types) this type may
        hand its chain to; names may refer to types declared later, which allows loops.
        ``lease``: how long a staged attempt holds the job between renewals.
        ``timeout``: per-attempt deadline (also bounds an atomic attempt's transaction).
        ``abandon_after``: how long a handler that was cancelled (timeout, lost lease,
        worker stopping) may take to end before the worker abandons it: frees its slot,
        stops renewing its lease and fails the attempt (default: the worker's).
        ``priority``: lower runs first within a queue.
        ``retention``: how long after it ended a chain of this type is kept before the
        workers' maintenance deletes it: a ``Retention`` (a period per way of ending;
        default ``DEFAULT_RETENTION``, completed chains a day, failed and cancelled ones
        a week), a ``timedelta`` for every way, or ``Retention.forever()`` (or ``None``)
        to keep them until ``Client.delete_chains``.
        ``blocker_failure``: when a chain this job is blocked on fails or is cancelled,
        ``"fail"`` or ``"cancel"`` this job (and its chain), or ``"unblock"`` it anyway.

        Flow limits, each ``None`` (no limit) unless given, enforced by the workers'
        acquire across every worker (docs/flow-control.md):
        ``concurrency``: at most this many attempts of the type running at once.
        ``key_concurrency``: at most this many running at once per limit key (the
        ``limit_key`` given at enqueue, kept by continuations).
        ``rate``: a ``Rate``, at most ``n`` attempts started in any window ``per``.
        ``key_rate``: a ``Rate`` per limit key.
        A count is 1 to ``MAX_CONCURRENCY`` (10,000): more costs every acquire its
        counting and bounds nothing a fleet reaches. Type-wide and per-key limits
        combine: an attempt starts only when each allows it. Jobs of a keyed type
        enqueued without a key share one key of their own (the missing key counts as
        one key), and a key given to a type without a key limit is stored all the
        same (shown on the job, ready for a key limit declared later).

        ``waits_for``: a ``SignalType`` (``registry.signal``) of this registry that
        this type's steps may wait for: a chain hands on to one with
        ``Continue(step, input, wait_for=signal_type.named(key, timeout=...))``, and
        its handler reads the signal with ``attempt.received(signal_type)``.
        """
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigurationError(
                f"invalid job type name {name!r}: use up to 200 letters, digits, '_', '.', ':' "
                "or '-', starting with a letter or '_'"
            )
        if name in self._types:
            raise DuplicateJobTypeError(name, self._types)
        where = f"job type {name!r}"
        check_max_attempts(max_attempts, where=where)
        check_priority(priority, where=where)
        check_queue_name(queue, where=where)
        # Every duration ends up added to (or taken from) the database clock.
        for option, value in (
            ("lease", lease),
            ("timeout", timeout),
            ("abandon_after", abandon_after),
        ):
            if value is not None:
                check_delay(option, value, where=where)
        if lease <= timedelta(0):
            raise ConfigurationError(f"lease of {name!r} must be positive, got {lease}")
        if timeout is not None and timeout <= timedelta(0):
            raise ConfigurationError(f"timeout of {name!r} must be positive, got {timeout}")
        if abandon_after is not None and abandon_after < timedelta(0):
            raise ConfigurationError(
                f"abandon_after of {name!r} must not be negative, got {abandon_after}"
            )
        if mode not in ("staged", "atomic"):
            raise ConfigurationError(f"mode of {name!r} must be 'staged' or 'atomic', got {mode!r}")
        if mode == "atomic":
            # Its deadline: the timeout, or the lease without one.
            if timeout is not None:
                check_atomic_deadline("timeout", timeout, where=where)
            else:
                check_atomic_deadline("lease", lease, where=where)
        policy = as_retention(retention, where=where)
        if blocker_failure not in ("fail", "cancel", "unblock"):
            raise ConfigurationError(
                f"blocker_failure of {name!r} must be 'fail', 'cancel' or 'unblock', "
                f"got {blocker_failure!r}"
            )
        check_concurrency("concurrency", concurrency, where=where)
        check_concurrency("key_concurrency", key_concurrency, where=where)
        check_rate("rate", rate, where=where)
        check_rate("key_rate", key_rate, where=where)
        if waits_for is not None:
            self.resolve_signal(waits_for)
        output_model = Any if output is None else output
        # A waiting type is the same class at run time, but mypy knows its payload.
        cls: type[JobType[Any, Any]] = JobType if waits_for is None else WaitingJobType
        job_type: JobType[Any, Any] = cls(
            name=name,
            input_model=input,
            output_model=output_model,
            entry=entry,
            continue_with=frozenset(c if isinstance(c, str) else c.name for c in continue_with),
            lease=lease,
            retry=retry or RetryPolicy(),
            max_attempts=max_attempts,
            queue=queue,
            priority=priority,
            timeout=timeout,
            mode=mode,
            abandon_after=abandon_after,
            retention=policy,
            blocker_failure=blocker_failure,
            input_codec=Codec(input, type_name=name, what="input"),
            output_codec=Codec(output_model, type_name=name, what="output"),
            concurrency=concurrency,
            key_concurrency=key_concurrency,
            rate=rate,
            key_rate=key_rate,
            waits_for=waits_for,
        )
        self._types[name] = job_type
        return job_type

    def signal(self, name: str, *, payload: type[P]) -> SignalType[P]:
        """Declare a signal type: a kind of named event whose payload is a ``payload``
        (a pydantic model, or any type pydantic validates). ``name``: up to 200
        letters, digits, '_', '.' or '-', starting with a letter or '_' (no ':': a
        signal's name is ``"{type}:{key}"``). Signal types have names of their own,
        apart from job types'."""
        name = check_signal_type_name(name)
        if name in self._signals:
            raise DuplicateSignalTypeError(name, self._signals)
        signal_type: SignalType[P] = SignalType(
            name=name,
            payload_model=payload,
            payload_codec=Codec(payload, type_name=name, what="signal payload"),
        )
        self._signals[name] = signal_type
        return signal_type

    def resolve_signal(self, signal_type: SignalType[P]) -> SignalType[P]:
        """``signal_type``, which must be this registry's own (``UnknownSignalTypeError``
        otherwise)."""
        name = getattr(signal_type, "name", repr(signal_type))
        if self._signals.get(name) is not signal_type:
            raise UnknownSignalTypeError(str(name), self._signals)
        return signal_type

    def get(self, name: str) -> JobType[Any, Any]:
        """Return the type named ``name`` or raise UnknownJobTypeError listing known names."""
        try:
            return self._types[name]
        except KeyError:
            raise UnknownJobTypeError(name, self._types) from None

    def resolve(self, job_type: JobType[Any, Any] | str) -> JobType[Any, Any]:
        """Accept a JobType or a name; a JobType must be this registry's own."""
        if isinstance(job_type, str):
            return self.get(job_type)
        mine = self._types.get(job_type.name)
        if mine is not job_type:
            raise UnknownJobTypeError(job_type.name, self._types)
        return job_type

    def entry(self, job_type: JobType[Any, Any] | str) -> JobType[Any, Any]:
        """Resolve a type that is about to start a chain."""
        resolved = self.resolve(job_type)
        if not resolved.entry:
            raise NotAnEntryTypeError(resolved.name, (t.name for t in self if t.entry))
        return resolved

    def continuation(
        self, from_type: JobType[Any, Any], to: JobType[Any, Any] | str, job_id: Any = None
    ) -> JobType[Any, Any]:
        """Resolve the next type of a chain, checking ``from_type`` may continue with it."""
        target = self.resolve(to)
        if target.name not in from_type.continue_with:
            raise ContinuationNotAllowedError(
                from_type.name, target.name, from_type.continue_with, job_id
            )
        return target

    def validate(self) -> None:
        """Check every ``continue_with`` name refers to a declared type."""
        for job_type in self:
            for target in job_type.continue_with:
                if target not in self._types:
                    raise UnknownJobTypeError(target, self._types)

    @property
    def names(self) -> Sequence[str]:
        return tuple(self._types)

    def __iter__(self) -> Iterator[JobType[Any, Any]]:
        return iter(self._types.values())

    def __len__(self) -> int:
        return len(self._types)

    def __contains__(self, item: object) -> bool:
        if isinstance(item, JobType):
            return self._types.get(item.name) is item
        return item in self._types
