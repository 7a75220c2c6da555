"""Every error pgwork raises on purpose, as classes callers can catch.

The tree::

    PgworkError
    ├── ConfigurationError            a setting that cannot work (bad schema name, bad option)
    │   ├── InvalidSchemaNameError
    │   ├── InvalidCronError          a cron expression that does not parse
    │   ├── InvalidDedupWindowError   a dedup window that is not positive
    │   ├── InvalidOptionError        an enqueue / declaration option out of its column's range
    │   ├── InvalidCursorError        a listing cursor that is not one pgwork handed out
    │   ├── SyncHandlerError          a middleware that is not async, a handler that cannot run
    │   │   └── AtomicSyncHandlerError  a sync atomic handler the worker cannot lend its
    │   │                                   transaction to (grouped, or a store that cannot)
    │   ├── ProcessHandlerError       a process handler that cannot be sent to another process
    │   ├── LimitNotDeclaredError     a run-time limit or pause for a type that declares none
    │   └── CapabilityMissingError    a feature the state adapter's store does not offer
    ├── DatabaseError                 the database could not be used as asked
    │   ├── DatabaseUnreachableError  wrong DSN, server down, authentication refused
    │   ├── DatabaseTimeoutError      an open connection gave no answer in time
    │   ├── SchemaMissingError        `pgwork migrate` was never run against this database
    │   ├── SchemaOutdatedError       the schema is older (or newer) than this pgwork
    │   ├── NotificationsUnavailableError  LISTEN gets nothing (e.g. through a transaction pooler)
    │   ├── UnsupportedServerVersionError  PostgreSQL older than pgwork supports
    │   ├── UnsupportedConnectionError  a `tx` that is not a psycopg / SQLAlchemy async connection
    │   ├── IsolationLevelError       a dedup key enqueued in a transaction above READ COMMITTED
    │   └── UnencodableTextError      a string the database's encoding cannot store
    ├── JobTypeError                  the registry was asked for something it does not allow
    │   ├── UnknownJobTypeError
    │   ├── DuplicateJobTypeError
    │   ├── NotAnEntryTypeError       start_chain with a type that may not start a chain
    │   ├── ContinuationNotAllowedError
    │   ├── UnknownSignalTypeError    a signal type this registry did not declare
    │   ├── DuplicateSignalTypeError
    │   ├── WaitNotDeclaredError      a signal its job type does not declare in waits_for
    │   └── ChildWaitNotAllowedError  a step that waits for a signal given children to wait for
    ├── PayloadError                  input or output that cannot be stored
    │   ├── PayloadValidationError    fails its model
    │   ├── PayloadNotSerializableError  not JSON (names the path)
    │   ├── PayloadTooDeepError       nested deeper than JSON can be encoded and read back
    │   ├── PayloadUndecodableError   a stored payload that cannot be parsed at all
    │   ├── PayloadTooLargeError
    │   └── OutcomeNotStorableError   a handler's outcome the database cannot store
                                      (stored on the job, never raised)
    ├── JobError                      an operation on a job that cannot be done
    │   ├── JobNotFoundError
    │   ├── ChainNotFoundError
    │   │   └── ChainDeletedError     await_chain on a chain deleted while it waited
    │   ├── ChildNotStartedHereError  Children(...) of chains the attempt did not start
    │   ├── ChainHasDependantsError   delete_chains while other chains still wait on them
    │   ├── LeaseLostError            complete/reschedule after the worker lost the job
    │   ├── AttemptAlreadyFinishedError  complete/reschedule called twice in one attempt
    │   ├── AttemptCancelledError     a sync handler's call after the worker asked it to stop
    │   ├── JobAlreadyFinishedError   completing/cancelling a job that already ended
    │   ├── ChainAlreadyFinishedError cancelling a chain that already ended
    │   ├── JobNotRetryableError      retry() of a job that has not failed
    │   └── ChainFailedError          await_chain on a chain that failed or was cancelled
    ├── AwaitTimeoutError             await_chain gave up waiting (also a TimeoutError)
    └── WorkerError
        ├── WorkerStateError          start twice, start after stop, ...
        ├── HandlerAbandonedError     a handler ignored cancellation and was abandoned
        │                             (a TimeoutError; stored on the job, never raised)
        └── HandlerProcessDiedError   a process handler's process ended without an answer
                                      (stored on the job, never raised)

Messages say what went wrong and what to do next. The module imports nothing from
pgwork so any layer can raise these. Each one pickles (its fields kept, its
``__init__`` not called again), so one raised in a process handler's process reaches
the worker as what it is.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING
from uuid import UUID

if TYPE_CHECKING:
    # Annotations only: the leaves import nothing of pgwork at run time.
    from pgwork.records import Waiting

__all__ = [
    "AtomicSyncHandlerError",
    "AttemptAlreadyFinishedError",
    "AttemptCancelledError",
    "AwaitTimeoutError",
    "CapabilityMissingError",
    "ChainAlreadyFinishedError",
    "ChainDeletedError",
    "ChainFailedError",
    "ChainHasDependantsError",
    "ChainNotFoundError",
    "ChildNotStartedHereError",
    "ChildWaitNotAllowedError",
    "ConfigurationError",
    "ContinuationNotAllowedError",
    "DatabaseError",
    "DatabaseTimeoutError",
    "DatabaseUnreachableError",
    "DuplicateJobTypeError",
    "DuplicateSignalTypeError",
    "HandlerAbandonedError",
    "HandlerProcessDiedError",
    "InvalidCronError",
    "InvalidCursorError",
    "InvalidDedupWindowError",
    "InvalidOptionError",
    "InvalidSchemaNameError",
    "IsolationLevelError",
    "JobAlreadyFinishedError",
    "JobError",
    "JobNotFoundError",
    "JobNotRetryableError",
    "JobTypeError",
    "LeaseLostError",
    "LimitNotDeclaredError",
    "NotAnEntryTypeError",
    "NotificationsUnavailableError",
    "OutcomeNotStorableError",
    "PayloadError",
    "PayloadNotSerializableError",
    "PayloadTooDeepError",
    "PayloadTooLargeError",
    "PayloadUndecodableError",
    "PayloadValidationError",
    "PgworkError",
    "ProcessHandlerError",
    "SchemaMissingError",
    "SchemaOutdatedError",
    "SyncHandlerError",
    "UnencodableTextError",
    "UnknownJobTypeError",
    "UnknownSignalTypeError",
    "UnsupportedConnectionError",
    "UnsupportedServerVersionError",
    "WaitNotDeclaredError",
    "WorkerError",
    "WorkerStateError",
]

MIGRATE_HINT = "Run `pgwork migrate --dsn <your DSN>` (or `alembic upgrade head` in a checkout)."


def _names(names: Iterable[str]) -> str:
    listed = sorted(names)
    return ", ".join(repr(n) for n in listed) if listed else "(none registered)"


class PgworkError(Exception):
    """Root of every error pgwork raises deliberately."""

    def __reduce__(self) -> tuple[object, ...]:
        # ``Exception`` pickles as ``cls(*args)``: the subclasses' ``__init__`` take
        # their fields, not the message, so they are rebuilt without calling it.
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(
    cls: type[PgworkError], args: tuple[object, ...], state: dict[str, object]
) -> PgworkError:
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


# --- configuration -------------------------------------------------------------------


class ConfigurationError(PgworkError, ValueError):
    """A setting or argument that cannot work; fix the call, not the data."""


class InvalidSchemaNameError(ConfigurationError):
    def __init__(self, schema: str) -> None:
        self.schema = schema
        super().__init__(
            f"invalid pgwork schema name {schema!r}: use 1-48 characters, a lowercase letter "
            "or underscore first, then lowercase letters, digits or underscores"
        )


class InvalidCronError(ConfigurationError):
    def __init__(self, name: str, expression: str, reason: str) -> None:
        self.name = name
        self.expression = expression
        super().__init__(
            f"schedule {name!r}: invalid cron expression {expression!r} ({reason}); use five "
            "fields: minute hour day-of-month month day-of-week, e.g. '*/5 * * * *'"
        )


class InvalidDedupWindowError(ConfigurationError):
    def __init__(self, key: str, window: object) -> None:
        self.key = key
        self.window = window
        super().__init__(
            f"dedup key {key!r}: scope 'window' needs a positive window (a timedelta), got "
            f"{window!r}"
        )


class InvalidOptionError(ConfigurationError):
    """An option that its database column cannot hold (or that would mean nothing):
    raised before any SQL runs, so the caller's transaction stays usable."""

    def __init__(self, option: str, value: object, valid: str, where: str = "") -> None:
        self.option = option
        self.value = value
        self.valid = valid
        try:
            shown = repr(value)
        except ValueError:  # an integer of more digits than Python prints
            shown = f"<{type(value).__name__} too long to show>"
        if len(shown) > 80:
            shown = shown[:77] + "..."
        of = f" of {where}" if where else ""
        super().__init__(f"{option}{of} must be {valid}; got {shown}")


class SyncHandlerError(ConfigurationError, TypeError):
    """A middleware that is not an ``async def`` (or an object whose ``__call__`` is
    one), or a handler the worker cannot run (not callable, an async generator):
    refused when the worker is built, before any job is taken. Also the error of an
    attempt whose plain ``def`` handler returned an awaitable: the worker runs a sync
    handler on a thread and never awaits what it returns."""

    def __init__(
        self, type_name: str, handler: object, role: str = "handler", reason: str = ""
    ) -> None:
        self.type_name = type_name
        self.handler = handler
        shown = getattr(handler, "__qualname__", None) or type(handler).__qualname__
        of = f" of job type {type_name!r}" if type_name else ""
        super().__init__(
            f"the {role} {shown!r}{of} "
            + (
                reason
                or f"is not an async function: a {role} must be declared with `async def` "
                "(a plain `def` handler runs on the worker's threads, a middleware cannot)"
            )
        )


class AtomicSyncHandlerError(SyncHandlerError):
    """A plain ``def`` handler for an atomic job type that the worker cannot lend the
    job's transaction to: the worker groups atomic attempts (``atomic_group`` > 1: the
    members of a group take turns on one connection, which a handler on a thread of
    its own cannot share), or its store cannot lend a transaction to a thread
    (``store_type``, a store without the ``TransactionLending`` capability; None when
    grouping is the reason). Refused when the worker is built, before any job is
    taken."""

    def __init__(
        self, type_name: str, handler: object, atomic_group: int, store_type: str | None = None
    ) -> None:
        self.atomic_group = atomic_group
        self.store_type = store_type
        if store_type is not None:
            reason = (
                "is a sync (plain `def`) handler of an atomic job type (mode='atomic'), "
                f"and the state adapter {store_type} cannot lend an atomic attempt's "
                "transaction to a handler's thread (it does not offer TransactionLending). "
                "Declare the handler with `async def`, or use a store that lends its "
                "transactions (the PostgreSQL adapter does)"
            )
        else:
            reason = (
                "is a sync (plain `def`) handler of an atomic job type (mode='atomic'), "
                f"and this worker groups atomic attempts (atomic_group={atomic_group}), "
                "which sync handlers do not support yet. Run this type on a worker "
                "with atomic_group=1 (the default), or declare the handler with "
                "`async def`"
            )
        super().__init__(type_name, handler, reason=reason)


class ProcessHandlerError(ConfigurationError, TypeError):
    """A handler given in ``process_handlers`` that cannot run in another process: not
    a plain function, not importable there by reference (a lambda, a nested function),
    a model the process cannot import, an atomic type. Refused when the worker is
    built, before any job is taken. Also the error of an attempt whose handler could
    not be loaded in the process after all (its module not importable there)."""

    def __init__(self, type_name: str, handler: object, reason: str) -> None:
        self.type_name = type_name
        self.handler = handler
        shown = getattr(handler, "__qualname__", None) or type(handler).__qualname__
        super().__init__(f"the process handler {shown!r} of job type {type_name!r} {reason}")


class LimitNotDeclaredError(ConfigurationError):
    """An override or a pause of a flow limit that the job type does not declare, or
    for a type whose limits are not known here: refused before any statement, since
    the workers' acquire would never read it.

    ``reason``: ``"unknown"`` (neither the client's registry nor any registered worker
    declares limits for the type), ``"unlimited"`` (the type declares no limit at
    all), ``"unkeyed"`` (a key's limit or pause on a type whose limits do not count
    per key) or ``"unrated"`` (a rate on a type that declares none: its workers'
    acquire records no starts to count it by)."""

    def __init__(self, type_name: str, reason: str, known_types: Iterable[str] = ()) -> None:
        self.type_name = type_name
        self.reason = reason
        self.known_types = tuple(sorted(known_types))
        if reason == "unknown":
            message = (
                f"no flow limits are known for job type {type_name!r}: neither this "
                "client's registry nor any registered worker declares it (limited types "
                f"known: {_names(self.known_types)}). Check the name, or start a worker "
                "that runs the type so that its declaration is recorded"
            )
        elif reason == "unrated":
            message = (
                f"job type {type_name!r} declares no rate (rate or key_rate), so its "
                "workers' acquire records no starts and would count no rate set at run "
                "time. Declare one in registry.job_type(...) (a generous one, lowered "
                "when needed), or change its concurrency instead"
            )
        elif reason == "unkeyed":
            message = (
                f"job type {type_name!r} declares no per-key limit (key_concurrency or "
                "key_rate): its jobs count as one group, so a key's limit or pause would "
                "change nothing. Change or pause the type as a whole (no key), or declare "
                "a per-key limit"
            )
        else:
            message = (
                f"job type {type_name!r} declares no flow limit (concurrency, "
                "key_concurrency, rate or key_rate), so its workers' acquire reads no "
                "override or pause of it. Declare one in registry.job_type(...), or "
                "pause its queue (pause_queue)"
            )
        super().__init__(message)


class CapabilityMissingError(ConfigurationError):
    """A feature that needs a capability of the storage contract (atomic job types,
    blockers, the operator's views, ...) asked of a store that offers only the core, or
    not that capability: refused before any statement, saying what the store lacks."""

    def __init__(self, capability: str, feature: str, store_type: str) -> None:
        self.capability = capability
        self.feature = feature
        self.store_type = store_type
        super().__init__(
            f"{feature} needs the storage capability {capability}, and the state adapter "
            f"{store_type} does not offer it: use a store that does (the "
            "PostgreSQL adapter offers every capability), or do without "
            "(docs/design/storage-contract.md)"
        )


class InvalidCursorError(ConfigurationError):
    def __init__(self, cursor: str, reason: str) -> None:
        self.cursor = cursor
        self.reason = reason
        super().__init__(
            f"invalid cursor {cursor!r}: {reason}. Pass, unchanged, the next cursor that a "
            "page of the same listing gave (its next_cursor, or the printed --cursor); "
            "leave it out for the first page."
        )


# --- database ------------------------------------------------------------------------


class DatabaseError(PgworkError):
    """The database could not be used as asked."""


class DatabaseUnreachableError(DatabaseError):
    def __init__(self, target: str, reason: str) -> None:
        self.target = target
        self.reason = reason
        super().__init__(
            f"cannot connect to PostgreSQL at {target}: {reason}. Check the DSN "
            "(--dsn or PGWORK_DSN), that the server is running, and the credentials."
        )


class DatabaseTimeoutError(DatabaseError, TimeoutError):
    """PostgreSQL gave no answer in time on a connection that looked open.

    Raised by the state adapter's own operations (those not run in a caller's
    transaction) once ``operation_timeout`` has passed, and by the notify adapter's
    publishing. A network path that drops a connection without closing it (a NAT or a
    load balancer that lost its state) leaves a client waiting for ever: the bound
    turns that into an error and a new connection on the next try. The connection
    that gave no answer is closed; the operation may or may not have taken effect on
    the server, as with any lost connection, and pgwork's worker operations are
    written to be retried.
    """

    def __init__(self, what: str, seconds: float) -> None:
        self.what = what
        self.seconds = seconds
        super().__init__(
            f"PostgreSQL gave no answer to {what} within {seconds:g}s; the connection "
            "was closed and the next operation uses a new one. A network path that "
            "silently drops connections, or a server that stopped responding, does "
            "this. If the operation is legitimately that slow, raise operation_timeout "
            "(PostgresStateAdapter.connect) or pass None to wait for ever."
        )


class SchemaMissingError(DatabaseError):
    def __init__(self, schema: str) -> None:
        self.schema = schema
        super().__init__(
            f"the pgwork schema {schema!r} does not exist in this database. {MIGRATE_HINT}"
        )


class SchemaOutdatedError(DatabaseError):
    def __init__(self, schema: str, current: str | None, expected: str) -> None:
        self.schema = schema
        self.current = current
        self.expected = expected
        super().__init__(
            f"the pgwork schema {schema!r} is at revision {current or '(none)'} but this "
            f"pgwork needs {expected}. {MIGRATE_HINT}"
        )


class NotificationsUnavailableError(DatabaseError):
    """The listener's own test notification did not come back: LISTEN cannot work here.

    Raised when a ``PostgresNotifyAdapter`` starts listening, rather than letting workers
    wait for wake-ups that cannot come. The usual cause is a DSN that goes through a
    pooler in transaction mode (PgBouncer, most hosted poolers): LISTEN binds to one
    server session, which the pooler hands to other clients after each transaction.
    """

    def __init__(self, target: str, waited: float) -> None:
        self.target = target
        self.waited = waited
        super().__init__(
            f"LISTEN on {target} received none of its own test notification within "
            f"{waited:g}s, so workers would never be woken by notifications. The usual "
            "cause is a pooler in transaction mode (PgBouncer, a hosted pooler) between "
            "pgwork and PostgreSQL: give PostgresNotifyAdapter (pgwork worker "
            "--notify-dsn) a direct connection to the server, or pass "
            "when_unavailable='poll' to fall back to polling (see docs/deploying.md)."
        )


class UnsupportedServerVersionError(DatabaseError):
    def __init__(self, server_version: int, minimum: int) -> None:
        self.server_version = server_version
        self.minimum = minimum
        shown = f"{server_version // 10000}.{server_version % 10000}"
        super().__init__(
            f"PostgreSQL {shown} is not supported: pgwork needs PostgreSQL "
            f"{minimum // 10000} or newer (it relies on gen_random_uuid(), built in since 13). "
            "Upgrade the server, or point the DSN at a newer one."
        )


class UnsupportedConnectionError(DatabaseError, TypeError):
    def __init__(self, got: object, detail: str = "") -> None:
        self.got_type = type(got).__name__
        if got is None and not detail:
            # What Django's connection.connection is until the connection is opened.
            detail = (
                "no connection: Django's connection.connection is None until it connects; "
                "enqueue inside transaction.atomic(), or call connection.ensure_connection() "
                "first"
            )
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"cannot use {type(got).__module__}.{type(got).__qualname__} as the caller's "
            f"transaction{extra}. Accepted: a psycopg AsyncConnection; an asyncpg "
            "Connection inside `async with conn.transaction()`; a SQLAlchemy AsyncConnection "
            "or AsyncSession on postgresql+psycopg:// or postgresql+asyncpg://. The *_sync "
            "calls take a psycopg Connection (Django: django.db.connection.connection) or a "
            "SQLAlchemy Connection / Session on postgresql+psycopg://"
        )


class IsolationLevelError(DatabaseError):
    """An enqueue with a dedup key in a caller's transaction whose isolation level is
    above READ COMMITTED; raised before anything is written, the transaction usable.

    Deduplication serialises enqueues of one key on a lock held until commit, then
    looks for a chain with the key. Under REPEATABLE READ or SERIALIZABLE that look
    uses the transaction's snapshot, taken before the lock was granted, so it cannot
    see a chain the lock's previous holder committed: both would start one.
    """

    def __init__(self, isolation_level: str, required: str = "read committed") -> None:
        self.isolation_level = isolation_level
        self.required = required
        super().__init__(
            f"a dedup key needs the caller's transaction at {required.upper()} "
            f"isolation, but it runs at {isolation_level.upper()}: its snapshot, taken "
            "before the key's lock, cannot see a chain another transaction committed "
            "meanwhile, so both would start one. Nothing was written. Enqueue it in a "
            "READ COMMITTED transaction (psycopg: conn.isolation_level = "
            "IsolationLevel.READ_COMMITTED before it begins; SQL: BEGIN ISOLATION LEVEL "
            "READ COMMITTED), or without a dedup key."
        )


class UnencodableTextError(DatabaseError, ValueError):
    """A string of an enqueue (at ``path`` of its input, or an option) that the
    database's encoding cannot store; raised before anything is written."""

    def __init__(self, field: str, encoding: str, character: str) -> None:
        self.field = field
        self.encoding = encoding
        self.character = character
        super().__init__(
            f"{field} contains {character!r} (U+{ord(character):04X}), which the "
            f"database's {encoding} encoding cannot store; nothing was written. Replace "
            "or escape the character, or use a UTF8 database."
        )


# --- job types -----------------------------------------------------------------------


class JobTypeError(PgworkError):
    """The registry does not allow what was asked."""


class UnknownJobTypeError(JobTypeError, KeyError):
    def __init__(self, type_name: str, known_types: Iterable[str]) -> None:
        self.type_name = type_name
        self.known_types = tuple(sorted(known_types))
        super().__init__(
            f"unknown job type {type_name!r}; registered types: {_names(self.known_types)}. "
            "Declare it with registry.job_type(...) before using it."
        )

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class DuplicateJobTypeError(JobTypeError):
    def __init__(self, type_name: str, known_types: Iterable[str]) -> None:
        self.type_name = type_name
        self.known_types = tuple(sorted(known_types))
        super().__init__(
            f"job type {type_name!r} is already registered (registered types: "
            f"{_names(self.known_types)}); pick another name or reuse the existing JobType"
        )


class NotAnEntryTypeError(JobTypeError):
    def __init__(self, type_name: str, entry_types: Iterable[str]) -> None:
        self.type_name = type_name
        self.known_types = tuple(sorted(entry_types))
        super().__init__(
            f"job type {type_name!r} cannot start a chain (declared with entry=False); "
            f"types that can: {_names(self.known_types)}"
        )


class ContinuationNotAllowedError(JobTypeError):
    def __init__(
        self, from_type: str, to_type: str, allowed: Iterable[str], job_id: UUID | None = None
    ) -> None:
        self.from_type = from_type
        self.type_name = to_type
        self.job_id = job_id
        self.known_types = tuple(sorted(allowed))
        where = f" (job {job_id})" if job_id else ""
        super().__init__(
            f"job type {from_type!r}{where} may not continue with {to_type!r}; allowed: "
            f"{_names(self.known_types)}. Add it to continue_with=[...] in the declaration."
        )


class UnknownSignalTypeError(JobTypeError, KeyError):
    def __init__(self, signal_name: str, known_signals: Iterable[str]) -> None:
        self.signal_name = signal_name
        self.known_signals = tuple(sorted(known_signals))
        super().__init__(
            f"unknown signal type {signal_name!r}; declared signal types: "
            f"{_names(self.known_signals)}. Declare it with registry.signal(...) on the "
            "registry the client and the worker use."
        )

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class DuplicateSignalTypeError(JobTypeError):
    def __init__(self, signal_name: str, known_signals: Iterable[str]) -> None:
        self.signal_name = signal_name
        self.known_signals = tuple(sorted(known_signals))
        super().__init__(
            f"signal type {signal_name!r} is already declared (declared signal types: "
            f"{_names(self.known_signals)}); pick another name or reuse the existing SignalType"
        )


class WaitNotDeclaredError(JobTypeError):
    """A step continued with ``wait_for=`` a signal its job type does not declare in
    ``waits_for``, or a handler reading (``attempt.received``) a signal its job type
    does not wait for: the step could never be told apart from one that timed out."""

    def __init__(
        self,
        type_name: str,
        signal_name: str,
        waits_for: str | None,
        job_id: UUID | None = None,
    ) -> None:
        self.type_name = type_name
        self.signal_name = signal_name
        self.waits_for = waits_for
        self.job_id = job_id
        where = f" (job {job_id})" if job_id else ""
        declared = f"it waits for {waits_for!r}" if waits_for else "it declares no waits_for"
        super().__init__(
            f"job type {type_name!r}{where} does not wait for signal type {signal_name!r}: "
            f"{declared}. Declare it with registry.job_type(..., waits_for=<signal type>)."
        )


class ChildWaitNotAllowedError(JobTypeError):
    """A hand-on to a step that waits for child chains (``wait_for=Children(...)``)
    whose job type declares ``waits_for=`` a signal: such a step starts on its signal,
    and its handler would read ``TimedOut`` for ever."""

    def __init__(self, type_name: str, waits_for: str, job_id: UUID | None = None) -> None:
        self.type_name = type_name
        self.waits_for = waits_for
        self.job_id = job_id
        where = f" (job {job_id})" if job_id else ""
        super().__init__(
            f"job type {type_name!r}{where} waits for signal type {waits_for!r}: its steps "
            "start on that signal and cannot wait for child chains. Hand on to a type "
            "declared without waits_for=."
        )


# --- payloads ------------------------------------------------------------------------


class PayloadError(PgworkError, ValueError):
    """Input or output that cannot be stored as a job payload."""


class PayloadValidationError(PayloadError):
    def __init__(self, type_name: str, what: str, detail: str) -> None:
        self.type_name = type_name
        self.what = what
        self.detail = detail
        super().__init__(f"{what} of job type {type_name!r} does not match its model: {detail}")


class PayloadNotSerializableError(PayloadError):
    def __init__(self, type_name: str, what: str, path: str, reason: str) -> None:
        self.type_name = type_name
        self.what = what
        self.path = path
        self.reason = reason
        super().__init__(f"{what} of job type {type_name!r} cannot be stored at {path}: {reason}")


class PayloadTooDeepError(PayloadError):
    def __init__(self, type_name: str, what: str, limit: int) -> None:
        self.type_name = type_name
        self.what = what
        self.limit = limit
        super().__init__(
            f"{what} of job type {type_name!r} is nested more than {limit} levels deep, "
            "deeper than a payload can be encoded and read back; flatten it (e.g. a list "
            "of nodes with parent ids instead of nested children)"
        )


class PayloadUndecodableError(PayloadError):
    def __init__(self, type_name: str, what: str, reason: str) -> None:
        self.type_name = type_name
        self.what = what
        self.reason = reason
        super().__init__(
            f"{what} of job type {type_name!r} could not be decoded ({reason}); it was "
            "not written by this pgwork's encoder. The job failed without running; fix "
            "or replace the stored value and retry it"
        )


class PayloadTooLargeError(PayloadError):
    def __init__(self, type_name: str, what: str, size: int, limit: int) -> None:
        self.type_name = type_name
        self.what = what
        self.size = size
        self.limit = limit
        super().__init__(
            f"{what} of job type {type_name!r} is {size} bytes encoded, over the {limit}-byte "
            "cap; store large data elsewhere and pass a reference, or raise max_payload_bytes"
        )


class OutcomeNotStorableError(PayloadError):
    """A handler's outcome (its output, or what it hands on) that the database cannot
    store as it is: a character the database's encoding lacks, or a value it refuses
    (``\\u0000`` in a JSON string). Recorded as the attempt's failure, the job's
    alone; never raised to a caller. ``job_id`` is None for a batch of outcomes."""

    def __init__(self, job_id: UUID | None, reason: str) -> None:
        self.job_id = job_id
        self.reason = reason
        whose = "an outcome in a batch" if job_id is None else f"the outcome of job {job_id}"
        super().__init__(
            f"{whose} cannot be stored in this database: {reason}; return what the "
            "database can hold (or store the value elsewhere and pass a reference)"
        )


# --- jobs ----------------------------------------------------------------------------


class JobError(PgworkError):
    """An operation on a job or chain that cannot be done."""


class JobNotFoundError(JobError, LookupError):
    def __init__(self, job_ids: Sequence[UUID]) -> None:
        self.job_ids = tuple(job_ids)
        shown = ", ".join(str(i) for i in self.job_ids)
        super().__init__(f"no job with id {shown}")


class ChainNotFoundError(JobError, LookupError):
    def __init__(self, chain_ids: Sequence[UUID]) -> None:
        self.chain_ids = tuple(chain_ids)
        shown = ", ".join(str(i) for i in self.chain_ids)
        super().__init__(f"no chain with id {shown}")


class ChainDeletedError(ChainNotFoundError):
    """``await_chain`` found the chain it waited for gone: it was deleted after the wait
    began (``delete_chains``, or retention after it ended), before its outcome was
    read. Retention keeps an awaited chain for a while after it ends
    (``pgwork.retention.AWAITED_HOLD``), so this means a deletion on request, or a
    wait that did not read the chain for longer than that."""

    def __init__(self, chain_id: UUID) -> None:
        self.chain_ids = (chain_id,)
        self.chain_id = chain_id
        JobError.__init__(
            self,
            f"chain {chain_id} was deleted while awaited, before its outcome was read: "
            "delete_chains removed it, or retention after it ended; await it with a "
            "shorter poll_interval, or give its job type a longer retention",
        )


class ChildNotStartedHereError(JobError):
    """``Children(...)`` naming chains the attempt that builds the outcome did not start
    with ``attempt.start_chain`` (another attempt's, a client's, or ``complete_job``
    from outside a worker): its step would wait for chains its completion does not
    write."""

    def __init__(self, chain_ids: Sequence[UUID], job_id: UUID | None = None) -> None:
        self.chain_ids = tuple(chain_ids)
        self.job_id = job_id
        shown = ", ".join(str(i) for i in self.chain_ids[:5])
        more = f" and {len(self.chain_ids) - 5} more" if len(self.chain_ids) > 5 else ""
        where = f"job {job_id}" if job_id else "a completion outside any worker"
        super().__init__(
            f"{where} hands on to a step waiting for chains it did not start: {shown}{more}. "
            "Wait only for the chains this attempt's attempt.start_chain(...) returned; to "
            "wait for chains started elsewhere, start the step's chain with "
            "client.start_chain(..., blockers=[...])"
        )


class ChainHasDependantsError(JobError):
    def __init__(
        self,
        chain_ids: Sequence[UUID],
        dependant_job_ids: Sequence[UUID],
        dependant_chain_ids: Sequence[UUID],
    ) -> None:
        self.chain_ids = tuple(chain_ids)
        self.dependant_job_ids = tuple(dependant_job_ids)
        self.dependant_chain_ids = tuple(dependant_chain_ids)
        chains = ", ".join(str(i) for i in self.chain_ids)
        jobs = ", ".join(str(i) for i in self.dependant_job_ids)
        super().__init__(
            f"cannot delete chain {chains}: jobs of other chains ({jobs}) wait for it or may "
            "still read its output; nothing was deleted. Delete or finish those chains first, "
            "or pass cascade=True to delete them too."
        )


class LeaseLostError(JobError):
    def __init__(self, job_id: UUID, attempt: int, action: str) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.action = action
        super().__init__(
            f"{action} of job {job_id} (attempt {attempt}) was refused: this worker no longer "
            "holds the job (its lease expired and it was reaped, or it was cancelled or "
            "completed elsewhere); nothing was written. Let the handler end: the job is no "
            "longer this attempt's to finish"
        )


class AttemptAlreadyFinishedError(JobError):
    def __init__(self, job_id: UUID, outcome: str) -> None:
        self.job_id = job_id
        self.outcome = outcome
        super().__init__(
            f"attempt on job {job_id} already ended with {outcome}; call complete() or "
            "reschedule() at most once per attempt"
        )


class AttemptCancelledError(JobError):
    """Raised by a sync handler's ``SyncAttempt`` call once the worker asked the
    attempt to stop (its timeout passed, its job was cancelled, its lease was lost, the
    worker is stopping): a thread cannot be interrupted, so the handler learns it here
    (or from ``attempt.cancelled``). ``reason`` is an ``AbortReason`` value."""

    def __init__(self, job_id: UUID, attempt: int, reason: str, action: str) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.reason = reason
        self.action = action
        super().__init__(
            f"{action} of job {job_id} (attempt {attempt}) was refused: the worker asked "
            f"this attempt to stop ({reason}); nothing more is written for it. Return "
            "from the handler"
        )


class JobAlreadyFinishedError(JobError):
    def __init__(self, job_ids: Sequence[UUID], statuses: Sequence[str]) -> None:
        self.job_ids = tuple(job_ids)
        self.statuses = tuple(statuses)
        shown = ", ".join(f"{i} ({s})" for i, s in zip(self.job_ids, self.statuses, strict=True))
        super().__init__(f"job already ended: {shown}; nothing was changed")


class ChainAlreadyFinishedError(JobError):
    def __init__(self, chain_ids: Sequence[UUID], statuses: Sequence[str]) -> None:
        self.chain_ids = tuple(chain_ids)
        self.statuses = tuple(statuses)
        shown = ", ".join(f"{i} ({s})" for i, s in zip(self.chain_ids, self.statuses, strict=True))
        super().__init__(f"chain already ended: {shown}; it cannot be cancelled")


class JobNotRetryableError(JobError):
    def __init__(self, job_ids: Sequence[UUID], statuses: Sequence[str]) -> None:
        self.job_ids = tuple(job_ids)
        self.statuses = tuple(statuses)
        shown = ", ".join(f"{i} ({s})" for i, s in zip(self.job_ids, self.statuses, strict=True))
        super().__init__(f"only failed jobs can be retried: {shown}")


class ChainFailedError(JobError):
    def __init__(self, chain_id: UUID, status: str, error: str | None) -> None:
        self.chain_id = chain_id
        self.status = status
        self.error = error
        detail = f": {error}" if error else ""
        super().__init__(f"chain {chain_id} ended {status}{detail}")


class AwaitTimeoutError(PgworkError, TimeoutError):
    """``await_chain`` gave up. ``waiting``: what the chain's current step waits for
    (a ``pgwork.records.Waiting``: a signal, a time, a debounce, blocker chains) when
    it waits for something no worker does; ``None`` when it is ready or running."""

    def __init__(
        self, chain_id: UUID, timeout: float, status: str, waiting: Waiting | None = None
    ) -> None:
        self.chain_id = chain_id
        self.timeout = timeout
        self.status = status
        self.waiting = waiting
        if waiting is not None:
            message = (
                f"chain {chain_id} did not end within {timeout}s: it is waiting for "
                f"{waiting.describe()}"
            )
        else:
            message = (
                f"chain {chain_id} did not end within {timeout}s (still {status}); is a "
                "worker running for its job types?"
            )
        super().__init__(message)


# --- worker --------------------------------------------------------------------------


class WorkerError(PgworkError):
    """The worker was used in a way its lifecycle does not allow."""


class WorkerStateError(WorkerError):
    pass


class HandlerAbandonedError(WorkerError, TimeoutError):
    """Recorded as the error of an attempt whose handler did not end after it was told
    to stop: the worker freed the slot and failed the attempt without waiting for it."""

    def __init__(
        self, job_id: UUID, type_name: str, attempt: int, cause: str, waited: float
    ) -> None:
        self.job_id = job_id
        self.type_name = type_name
        self.attempt = attempt
        self.cause = cause
        self.waited = waited
        super().__init__(
            f"handler of job {job_id} ({type_name!r}, attempt {attempt}) ignored cancellation "
            f"({cause}) and had not ended {waited:.1f}s later; the worker abandoned it and "
            "freed its slot. Let CancelledError propagate (do not swallow it or shield long "
            "awaits), or raise the type's abandon_after if cleanup needs longer"
        )


class HandlerProcessDiedError(WorkerError):
    """Recorded as the error of an attempt whose handler's process ended before it
    answered (a crash, a segfault, ``os._exit``, the out-of-memory killer): the
    attempt fails (retried as the type's policy says) and the worker starts another
    process for the next one."""

    def __init__(self, type_name: str, pid: int | None, exitcode: int | None) -> None:
        self.type_name = type_name
        self.pid = pid
        self.exitcode = exitcode
        if exitcode is not None and exitcode < 0:
            how = f"was killed by signal {_signal_name(-exitcode)}"
        elif exitcode is not None:
            how = f"exited with code {exitcode}"
        else:
            how = "closed its end of the pipe"
        super().__init__(
            f"the process running the handler of job type {type_name!r} (pid {pid}) {how} "
            "before it answered; the attempt failed and the worker starts another process "
            "for the next one. Look for what ends that process: native code that crashes, "
            "os._exit, the out-of-memory killer"
        )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
