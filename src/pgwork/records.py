"""What pgwork hands back to callers: frozen, I/O-free records.

Records are plain data so they can cross task and process boundaries, be logged, and be
compared in tests. Inputs and outputs are kept as decoded JSON here; the client and the
worker turn them into the job type's models where the type is known.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar
from uuid import UUID

__all__ = [
    "ATTEMPT_HISTORY_LIMIT",
    "HISTORY_TRACEBACK_LIMIT",
    "AbortReason",
    "AttemptError",
    "Chain",
    "ChainStatus",
    "FailedAttempt",
    "Job",
    "JobStatus",
    "Page",
    "SignalRecord",
    "UndecodablePayload",
    "WaitKind",
    "Waiting",
    "history_from_json",
]

T = TypeVar("T")

# Failed attempts a job keeps (``Job.attempt_history``), the newest: enough for every
# attempt of a job declared with up to this many, and a bound on the row whatever
# ``max_attempts`` is.
ATTEMPT_HISTORY_LIMIT = 20
# Characters of a traceback each history entry keeps: its end, where the error was
# raised. The last attempt's whole stored traceback stays in ``last_attempt_error``.
HISTORY_TRACEBACK_LIMIT = 2000


class JobStatus(enum.StrEnum):
    """Where a job is in its life.

    ``blocked`` waits for blocker chains; ``pending`` waits for a worker (or for its
    ``scheduled_at``); ``running`` is leased by a worker; the last three are final.
    """

    BLOCKED = "blocked"
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)


class ChainStatus(enum.StrEnum):
    """A chain is ``active`` until its last job completes, fails or is cancelled."""

    ACTIVE = "active"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class AbortReason(enum.StrEnum):
    """Why a running attempt was told to stop before its handler returned."""

    OWNERSHIP_LOST = "ownership_lost"
    CANCELLED = "cancelled"
    COMPLETED_ELSEWHERE = "completed_elsewhere"
    TIMEOUT = "timeout"
    WORKER_STOPPING = "worker_stopping"


@dataclass(frozen=True, slots=True)
class AttemptError:
    """The error an attempt ended with, as stored on the job (truncated)."""

    type: str
    message: str
    traceback: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "traceback": self.traceback}

    @classmethod
    def from_json(cls, data: Any) -> AttemptError | None:
        if not isinstance(data, dict):
            return None
        return cls(
            type=str(data.get("type", "")),
            message=str(data.get("message", "")),
            traceback=data.get("traceback"),
        )


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """One failed attempt of a job, as its history keeps it.

    ``at``: when the failure was written (database clock); ``worker``: the worker that
    held the attempt (``None`` if none did); ``ran_for``: how long the handler ran, when
    the worker said so; ``error``: what it failed with, its traceback cut to the last
    ``HISTORY_TRACEBACK_LIMIT`` characters. An attempt taken back by the reaper (its
    lease expired) is kept too, with the error type ``LeaseExpired``.
    """

    attempt: int
    at: datetime
    error: AttemptError
    worker: str | None = None
    ran_for: timedelta | None = None

    @classmethod
    def from_json(cls, data: Any) -> FailedAttempt | None:
        """The entry ``data`` holds, or None if it is not one (written by hand, say)."""
        if not isinstance(data, dict):
            return None
        error = AttemptError.from_json(data.get("error"))
        attempt, at, seconds = data.get("attempt"), data.get("at"), data.get("ran_for")
        if error is None or not isinstance(attempt, int) or not isinstance(at, str):
            return None
        try:
            when = datetime.fromisoformat(at)
        except ValueError:
            return None
        worker = data.get("worker")
        return cls(
            attempt=attempt,
            at=when,
            error=error,
            worker=worker if isinstance(worker, str) else None,
            ran_for=timedelta(seconds=seconds) if isinstance(seconds, int | float) else None,
        )


def history_from_json(data: Any) -> tuple[FailedAttempt, ...]:
    """The entries of a stored history, oldest first; anything else in it is skipped."""
    if not isinstance(data, list):
        return ()
    entries = (FailedAttempt.from_json(item) for item in data)
    return tuple(entry for entry in entries if entry is not None)


@dataclass(frozen=True, slots=True)
class UndecodablePayload:
    """Stands in for a stored payload its adapter could not parse (JSON written outside
    pgwork, nested deeper than Python reads). Decoding it raises
    ``PayloadUndecodableError``, so only its own job fails — at once, since a retry
    reads the same bytes — not every job fetched with it."""

    reason: str


@dataclass(frozen=True, slots=True)
class Job(Generic[T]):
    """One job row. ``input`` is the decoded input (a model instance when typed)."""

    id: UUID
    type_name: str
    chain_id: UUID
    chain_type_name: str
    chain_index: int
    input: T
    output: Any
    status: JobStatus
    queue: str
    priority: int
    created_at: datetime
    scheduled_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    attempt: int
    max_attempts: int
    last_attempt_error: AttemptError | None
    last_attempt_at: datetime | None
    leased_by: str | None
    leased_until: datetime | None
    dedup_key: str | None = None
    # The logging context given at enqueue (``start_chain(context=...)``), inherited by
    # the chain's continuations; bound to every log line of its attempts.
    context: dict[str, str] | None = None
    # The job's failed attempts, oldest first: the newest ``ATTEMPT_HISTORY_LIMIT`` of
    # them, kept when a later attempt completes. A job read by a worker's acquire (a
    # handler's ``attempt.job``) comes without them: read the job to see them.
    attempt_history: tuple[FailedAttempt, ...] = ()
    # The key its type's flow limits count it by (``start_chain(limit_key=...)``),
    # kept by the chain's continuations unless one gives its own; ``None``: no key.
    limit_key: str | None = None
    # A debounced chain's first job (``start_chain(dedup=Debounce(...))``): the latest
    # its start may be pushed to, its first enqueue plus ``max_wait``. ``None`` for any
    # other job. Kept once the job has started.
    debounce_deadline: datetime | None = None

    @property
    def debouncing(self) -> bool:
        """Whether another enqueue of its key may still merge into this job: a debounced
        chain's first job that is pending and has never started."""
        return (
            self.debounce_deadline is not None
            and self.status is JobStatus.PENDING
            and self.started_at is None
        )

    @property
    def is_chain_root(self) -> bool:
        return self.id == self.chain_id


@dataclass(frozen=True, slots=True)
class Chain:
    """A chain: its root job plus where it stands now.

    ``output`` is the output of the job that ended the chain (``None`` until then).
    ``current_job`` is the chain's newest job.
    """

    id: UUID
    type_name: str
    status: ChainStatus
    input: Any
    output: Any
    created_at: datetime
    completed_at: datetime | None
    current_job: Job[Any]
    dedup_key: str | None = None


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a keyset-paginated listing; pass ``next_cursor`` to get the next."""

    items: tuple[T, ...]
    next_cursor: str | None = field(default=None)


class WaitKind(enum.StrEnum):
    """What a waiting step waits for (``Waiting.kind``).

    ``signal``: a named signal, or its timeout (``Continue(..., wait_for=...)``);
    ``sleep``: a time (``Continue(..., after=...)``, a chain started later, a snoozed
    attempt); ``debounce``: a debounced chain's first job, which later enqueues of its
    key may still move, until its next start or its deadline; ``blockers``: other
    chains to end (``start_chain(blockers=...)``). A retry's backoff is not a wait.
    """

    SIGNAL = "signal"
    SLEEP = "sleep"
    DEBOUNCE = "debounce"
    BLOCKERS = "blockers"


@dataclass(frozen=True, slots=True)
class Waiting:
    """A step that waits, and what for: read from its row (``Client.waiting``,
    ``Client.list_waiting``).

    ``since``: when the step was written; ``until``: when it starts if nothing else
    happens first (a signal's timeout, a sleep's end, a debounce's next start),
    ``None`` for no time (a signal waited for without a timeout, blockers).
    ``signal``: the name waited for; ``deadline``: a debounce's latest start; ``done``
    of ``total``: the blocker chains that have ended, of all it waits for, as the step
    counts them for its release (an end is counted once settled, a moment after it
    commits). ``as_of``: the database's clock when this was read, which ``describe``
    measures from.
    """

    kind: WaitKind
    chain_id: UUID
    chain_type_name: str
    job_id: UUID
    type_name: str
    chain_index: int
    queue: str
    since: datetime
    until: datetime | None
    as_of: datetime
    signal: str | None = None
    deadline: datetime | None = None
    done: int | None = None
    total: int | None = None

    def describe(self) -> str:
        """What it waits for, in words: ``signal 'payment:7' (timeout in 2d 00h)``."""
        if self.kind is WaitKind.SIGNAL:
            timeout = f"timeout {self._in(self.until)}" if self.until else "no timeout"
            return f"signal {self.signal!r} ({timeout})"
        if self.kind is WaitKind.DEBOUNCE:
            deadline = f", deadline {self._in(self.deadline)}" if self.deadline else ""
            return f"more enqueues of its key (debounced: starts {self._in(self.until)}{deadline})"
        if self.kind is WaitKind.BLOCKERS:
            return f"blocker chains ({self.done or 0} of {self.total or 0} ended)"
        until = self.until.isoformat() if self.until else "-"
        return f"a time: {until} ({self._in(self.until)})"

    def _in(self, when: datetime | None) -> str:
        if when is None:
            return "-"
        return f"in {_span(when - self.as_of)}" if when > self.as_of else "now"


@dataclass(frozen=True, slots=True)
class SignalRecord:
    """A signal as stored (``Client.list_signals``): ``payload`` is the stored JSON,
    decoded by no model (a listing knows no signal type); ``consumed_by``: the step a
    match handed it to, ``None`` while it is pending. ``as_of``: the database's clock
    when this was read."""

    id: UUID
    name: str
    payload: Any
    sent_at: datetime
    consumed_by: UUID | None
    consumed_at: datetime | None
    as_of: datetime

    @property
    def pending(self) -> bool:
        return self.consumed_by is None

    @property
    def age(self) -> timedelta:
        """How long ago it was sent, on the database's clock."""
        return self.as_of - self.sent_at


def _span(value: timedelta) -> str:
    """A short duration: 42s, 3m 12s, 2h 05m, 4d 03h (what ``describe`` prints)."""
    total = max(int(value.total_seconds()), 0)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {seconds:02d}s"
    return f"{seconds}s"
