"""The storage contract: named job operations every state adapter provides.

The client and the worker speak only this protocol; ``pgwork.postgres`` implements it.
Arguments are keyword-only and results are frozen dataclasses, so a later field added to
either breaks no adapter. Every write made on behalf of a running attempt is *fenced* by
``(job_id, lease_token)``: an adapter must change nothing when the token no longer
matches a running job, and must report that instead of raising.

Transactions: operations that take ``tx`` run inside that transaction and never commit
it; ``tx`` is either a caller's own connection/session (see ``adopt``) or a handle from
``transaction()``. Operations without ``tx`` run and commit on their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, runtime_checkable
from uuid import UUID

from pgwork.adapters.insight import ChainLinks, RecentActivity
from pgwork.adapters.notify import NotifyAdapter
from pgwork.errors import ConfigurationError, InvalidDedupWindowError
from pgwork.records import AttemptError, Chain, ChainStatus, Job, JobStatus

__all__ = [
    "AcquiredJob",
    "BlockedJob",
    "BlockerOutput",
    "BlockerStatus",
    "CancelledChain",
    "ChainDeletion",
    "ChainDependant",
    "ChainFilter",
    "ChainRef",
    "Completion",
    "CompletionResult",
    "DedupSpec",
    "Failure",
    "InsertedJob",
    "JobFilter",
    "Lease",
    "NewJob",
    "PageKey",
    "QueueCount",
    "ReapedJob",
    "RenewResult",
    "Resolution",
    "StateAdapter",
    "TransactionHandle",
    "WorkerInfo",
    "WorkerRecord",
]


@dataclass(frozen=True, slots=True)
class DedupSpec:
    """Deduplicate a new chain against earlier chains of the same type and key.

    ``scope``: ``"incomplete"`` matches chains still active; ``"ever"`` matches any;
    ``"window"`` matches chains created within ``window`` of now.
    """

    key: str
    scope: Literal["incomplete", "ever", "window"] = "incomplete"
    window: timedelta | None = None

    def __post_init__(self) -> None:
        if self.scope not in ("incomplete", "ever", "window"):
            raise ConfigurationError(
                f"dedup scope must be 'incomplete', 'ever' or 'window', got {self.scope!r}"
            )
        if self.scope == "window" and (
            not isinstance(self.window, timedelta) or self.window <= timedelta(0)
        ):
            raise InvalidDedupWindowError(self.key, self.window)
        if not isinstance(self.key, str) or not self.key:
            raise ConfigurationError(f"dedup key must be a non-empty string, got {self.key!r}")


@dataclass(slots=True)
class NewJob:
    """A job to insert. ``input_json`` is already validated, encoded JSON text.

    Not frozen, though nothing changes one after it is built: a frozen dataclass sets
    each field through ``object.__setattr__``, which makes building one 2.5 times
    slower, and a batch builds thousands.

    ``run_at`` / ``run_after`` schedule it (the later of the two wins; both ``None``
    means now, on the database clock; a past ``run_at`` is clamped to now).
    """

    id: UUID
    type_name: str
    chain_id: UUID
    chain_type_name: str
    chain_index: int
    input_json: str
    queue: str
    priority: int
    max_attempts: int
    run_at: datetime | None = None
    run_after: timedelta | None = None
    dedup: DedupSpec | None = None
    trace_context: Mapping[str, str] | None = None
    # Chains this job waits for (chain roots only), and what their failure does to it.
    blockers: tuple[UUID, ...] = ()
    blocker_failure: Literal["fail", "cancel", "unblock"] = "fail"


@dataclass(slots=True)
class InsertedJob:
    """What ``insert_jobs`` did for one ``NewJob`` (same order as given). Not frozen
    for the same reason as ``NewJob``.

    When deduplicated, ``job_id``/``chain_id`` are the existing chain's and nothing new
    was written.
    """

    job_id: UUID
    chain_id: UUID
    status: JobStatus
    deduplicated: bool


@dataclass(frozen=True, slots=True)
class Lease:
    """The fencing identity of one attempt."""

    job_id: UUID
    lease_token: UUID


@dataclass(frozen=True, slots=True)
class AcquiredJob:
    """A job a worker now holds. ``input`` is parsed JSON, not yet decoded to a model."""

    id: UUID
    type_name: str
    chain_id: UUID
    chain_type_name: str
    chain_index: int
    input: Any
    queue: str
    priority: int
    attempt: int
    max_attempts: int
    lease_token: UUID
    leased_until: datetime
    created_at: datetime
    scheduled_at: datetime
    last_attempt_error: AttemptError | None
    # The propagation carrier stored at enqueue (``NewJob.trace_context``), for tracing.
    trace_context: Mapping[str, str] | None = None

    @property
    def lease(self) -> Lease:
        return Lease(self.id, self.lease_token)


@dataclass(frozen=True, slots=True)
class RenewResult:
    """Outcome of renewing one lease: ``renewed``, or the job's status now (if any)."""

    job_id: UUID
    lease_token: UUID
    renewed: bool
    leased_until: datetime | None
    status: JobStatus | None


@dataclass(frozen=True, slots=True)
class Completion:
    """Complete a job, optionally continuing its chain with ``continuation``.

    ``lease_token`` fences a worker's completion; ``None`` completes from outside any
    worker (it then applies to a pending or running job).
    """

    job_id: UUID
    lease_token: UUID | None
    output_json: str
    continuation: NewJob | None = None


@dataclass(frozen=True, slots=True)
class CompletionResult:
    """What one completion did. ``ready_queues``: queues where jobs became ready
    (continuation, unblocked dependants); ``chain_awaited``: the chain ended and
    someone awaits it — both for the caller to announce after commit."""

    job_id: UUID
    accepted: bool
    chain_completed: bool = False
    continuation_id: UUID | None = None
    ready_queues: tuple[str, ...] = ()
    chain_awaited: bool = False


@dataclass(frozen=True, slots=True)
class Resolution:
    """The effect of settling blocked dependants of chains that ended."""

    ready_queues: tuple[str, ...] = ()
    ended_chain_ids: tuple[UUID, ...] = ()
    awaited_chain_ids: tuple[UUID, ...] = ()

    def merge(self, other: Resolution) -> Resolution:
        return Resolution(
            ready_queues=tuple(sorted(set(self.ready_queues) | set(other.ready_queues))),
            ended_chain_ids=self.ended_chain_ids + other.ended_chain_ids,
            awaited_chain_ids=self.awaited_chain_ids + other.awaited_chain_ids,
        )


@dataclass(frozen=True, slots=True)
class BlockerOutput:
    """One blocker chain of a job: its status and (once completed) its final output."""

    chain_id: UUID
    status: ChainStatus | None
    type_name: str | None
    output: Any


@dataclass(frozen=True, slots=True)
class ChainRef:
    """An id a caller gave (a chain's or a job's), resolved to its chain."""

    id: UUID
    chain_id: UUID | None
    chain_status: ChainStatus | None
    job_status: JobStatus | None
    leased_by: str | None


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a worker registers about itself."""

    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    job_types: tuple[str, ...]
    max_slots: int
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """A worker as the registry sees it; ``alive``: heartbeat within the limit."""

    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    job_types: tuple[str, ...]
    max_slots: int
    active_slots: int
    status: str
    started_at: datetime
    heartbeat_at: datetime
    metadata: Mapping[str, Any]
    alive: bool


@dataclass(frozen=True, slots=True)
class CancelledChain:
    chain_id: UUID
    job_ids: tuple[UUID, ...]


@dataclass(frozen=True, slots=True)
class Failure:
    """End an attempt with an error: retry after ``retry_after``, or fail for good."""

    job_id: UUID
    lease_token: UUID
    error: AttemptError
    retry_after: timedelta | None


@dataclass(frozen=True, slots=True)
class ReapedJob:
    """A job taken back from a worker whose lease expired."""

    job_id: UUID
    type_name: str
    leased_by: str | None
    attempt: int
    status: JobStatus


# --- queries, deletion and retention --------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs ``list_jobs`` returns; ``None`` leaves a field unfiltered.

    ``created_after`` / ``created_before`` are exclusive bounds.
    """

    type_name: str | None = None
    queue: str | None = None
    status: JobStatus | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    chain_id: UUID | None = None


@dataclass(frozen=True, slots=True)
class ChainFilter:
    """Which chains ``list_chains`` returns; ``type_name`` is the chain's (first job's)
    type, ``dedup_key`` the key it was started with."""

    type_name: str | None = None
    status: ChainStatus | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    dedup_key: str | None = None


@dataclass(frozen=True, slots=True)
class PageKey:
    """A position in a newest-first listing: rows strictly older than this come next."""

    created_at: datetime
    id: UUID


@dataclass(frozen=True, slots=True)
class BlockerStatus:
    """One chain a blocked job waits for; ``status`` is ``None`` once it was deleted."""

    chain_id: UUID
    status: ChainStatus | None


@dataclass(frozen=True, slots=True)
class BlockedJob:
    """A job in status ``blocked`` and the chains it waits for, in declaration order."""

    job: Job[Any]
    blockers: tuple[BlockerStatus, ...]


@dataclass(frozen=True, slots=True)
class QueueCount:
    """Unfinished work of one queue, as a dashboard or ``pgwork queues`` shows it.

    ``ready``: pending and due; ``scheduled``: pending, due later; ``oldest_ready_age``:
    how long the oldest ready job has been due (database clock). Finished jobs are not
    counted: that would read the whole table.
    """

    queue: str
    paused: bool
    ready: int
    scheduled: int
    running: int
    blocked: int
    failed: int
    oldest_ready_at: datetime | None
    oldest_ready_age: timedelta | None

    @property
    def depth(self) -> int:
        """Jobs waiting in the queue (ready or scheduled)."""
        return self.ready + self.scheduled


@dataclass(frozen=True, slots=True)
class ChainDependant:
    """A job of another chain that depends on ``blocker_chain_id``."""

    blocker_chain_id: UUID
    job_id: UUID
    chain_id: UUID


@dataclass(frozen=True, slots=True)
class ChainDeletion:
    """What ``delete_chains`` did. When ``missing`` is not empty, or ``dependants`` is
    and the deletion did not cascade, nothing was deleted."""

    deleted_chains: int
    deleted_jobs: int
    missing: tuple[UUID, ...] = ()
    dependants: tuple[ChainDependant, ...] = ()


class TransactionHandle(Protocol):
    """An open transaction an adapter can run statements in (adapter-specific)."""

    async def discard(self) -> None:
        """End the transaction by dropping its connection, at once, without waiting for
        a statement in progress; the connection is never reused. For a transaction a
        handler the worker abandoned may still be using."""
        ...


@runtime_checkable
class StateAdapter(Protocol):
    """Named job operations over one store. Implementations must pass
    ``pgwork.testing.conformance`` unchanged."""

    async def verify(self) -> None:
        """Check the store is reachable and its schema is at the expected revision."""
        ...

    async def close(self) -> None: ...

    def transaction(self) -> AbstractAsyncContextManager[TransactionHandle]:
        """A new transaction of the adapter's own, committed on clean exit."""
        ...

    async def adopt(self, tx: object) -> TransactionHandle:
        """Wrap a caller's open transaction (connection or session) without a new one."""
        ...

    async def insert_jobs(
        self,
        tx: TransactionHandle,
        *,
        jobs: Iterable[NewJob],
        notify: NotifyAdapter | None = None,
    ) -> list[InsertedJob]:
        """Insert ``jobs`` in ``tx`` (deduplicating, blocking as each asks); the
        results come in ``jobs``' order.

        ``jobs`` is iterated once, and may be a generator: the client hands over its
        jobs as they are built, so that an adapter can start writing the first rows
        while later ones are still being made. Building them does not fail (the client
        checked every input beforehand); an adapter that starts writing before it has
        seen every job may leave ``tx`` failed if iterating does raise.

        ``notify``: also announce, inside ``tx`` (so on commit only), one ``ready``
        notice per queue that got a job ready to run now (not scheduled, blocked or
        deduplicated). Given here rather than published by the caller afterwards so
        that an adapter sharing a database with ``notify`` can fold the announcement
        into its insert and save a round trip; any other calls ``notify.publish(tx,
        ...)``. A failed insert announces nothing.
        """
        ...

    async def acquire(
        self,
        *,
        worker_id: str,
        leases: Mapping[str, timedelta],
        queues: Sequence[str] | None,
        limit: int,
    ) -> list[AcquiredJob]:
        """Lease up to ``limit`` ready jobs whose type is a key of ``leases`` (each for
        that type's duration), in one statement, and commit. ``queues=None``: any."""
        ...

    async def begin_atomic(
        self, tx: TransactionHandle, *, lease: Lease, deadline: timedelta
    ) -> bool:
        """Lock the job row in ``tx`` for an atomic attempt; False if no longer held."""
        ...

    def atomic_transaction(
        self, *, lease: Lease, deadline: timedelta
    ) -> AbstractAsyncContextManager[TransactionHandle | None]:
        """``transaction()`` with ``begin_atomic`` already done, in as few round trips
        as the store allows: yields the open transaction, or None (rolled back at
        once) when ``lease`` no longer holds its job. Commits on clean exit, unless
        ``complete_atomic`` ended the transaction already."""
        ...

    async def complete_and_acquire(
        self,
        *,
        completions: Sequence[Completion],
        worker_id: str,
        leases: Mapping[str, timedelta],
        queues: Sequence[str] | None,
        limit: int,
    ) -> tuple[list[CompletionResult], list[AcquiredJob]]:
        """``complete(None, completions=...)`` then ``acquire(...)``, committed together:
        both happen or, when this raises, neither. A worker's finished batch and its
        next batch of work travel in one round trip, with one commit. Completions with
        a continuation are refused (``ValueError``): they need a transaction of their
        own."""
        ...

    async def renew(
        self, *, leases: Sequence[Lease], duration: Mapping[UUID, timedelta]
    ) -> list[RenewResult]:
        """Extend each lease whose token still holds the running job by ``duration``
        (keyed by job id); one result per lease, identified by (job_id, lease_token)."""
        ...

    async def complete(
        self,
        tx: TransactionHandle | None,
        *,
        completions: Sequence[Completion],
        notify: NotifyAdapter | None = None,
    ) -> list[CompletionResult]:
        """Complete jobs (and insert their continuations) in ``tx``, or atomically on
        the adapter's own when ``tx`` is None.

        ``notify``: also announce what the results report (a ``ready`` notice per
        queue in ``ready_queues``, a ``chain_done`` notice per awaited chain that
        ended): inside ``tx``, or once the adapter's own write committed. As for
        ``insert_jobs``, given here so that an adapter sharing a database with
        ``notify`` can fold the announcement into its write. Without it the caller
        announces them."""
        ...

    async def complete_atomic(
        self, tx: TransactionHandle, *, completion: Completion
    ) -> CompletionResult:
        """Complete an atomic attempt's job in ``tx`` (from ``atomic_transaction``) and
        commit ``tx`` with it, in as few round trips as the store allows; ``tx`` is over
        either way. When the completion is refused (the lease no longer holds the job),
        ``tx`` is rolled back instead — nothing written in it commits — and the result
        is not accepted. Dependants of a chain it ends are settled after the commit, as
        ``complete(None, ...)`` does. ``completion`` has no continuation
        (``ValueError``): a continuation goes through ``complete(tx, ...)``."""
        ...

    async def fail(
        self, tx: TransactionHandle | None, *, failures: Sequence[Failure]
    ) -> list[bool]:
        """Record each error; reschedule or mark failed. True where the lease matched."""
        ...

    async def reschedule(
        self,
        tx: TransactionHandle | None,
        *,
        lease: Lease,
        run_at: datetime | None,
        run_after: timedelta | None,
        count_attempt: bool,
    ) -> bool: ...

    async def release(self, *, leases: Sequence[Lease]) -> int:
        """Hand jobs back to the queue without burning the attempt (graceful stop)."""
        ...

    async def reap(
        self,
        *,
        type_names: Sequence[str],
        exclude_worker: str,
        limit: int = 1,
        dead_workers: Sequence[str] = (),
        held: Sequence[UUID] | None = None,
    ) -> list[ReapedJob]:
        """Take back up to ``limit`` jobs whose lease expired (types in ``type_names``,
        not ``exclude_worker``'s own — or, when ``held`` lists the lease tokens it still
        holds, none of those), and every running job of ``dead_workers`` — all of them,
        expired or not, whatever ``limit``."""
        ...

    async def get_jobs(
        self, tx: TransactionHandle | None, *, job_ids: Sequence[UUID]
    ) -> list[Job[Any]]: ...

    async def get_chains(
        self, tx: TransactionHandle | None, *, chain_ids: Sequence[UUID]
    ) -> list[Chain]: ...

    async def list_chain_jobs(
        self, tx: TransactionHandle | None, *, chain_id: UUID
    ) -> list[Job[Any]]: ...

    # --- chain orchestration -------------------------------------------------------------

    async def resolve_dependants(
        self, tx: TransactionHandle | None, *, chain_ids: Sequence[UUID]
    ) -> Resolution:
        """Settle jobs blocked on ``chain_ids`` (ended chains) per their edges' policy."""
        ...

    async def sweep_blocked(self, *, limit: int = 100) -> Resolution:
        """Settle blocked jobs whose blockers all ended but that were never resolved."""
        ...

    async def blocker_outputs(
        self, tx: TransactionHandle | None, *, job_id: UUID
    ) -> list[BlockerOutput]: ...

    async def chains_of(
        self, tx: TransactionHandle | None, *, ids: Sequence[UUID]
    ) -> list[ChainRef]: ...

    async def cancel_chains(
        self, tx: TransactionHandle, *, chain_ids: Sequence[UUID]
    ) -> tuple[list[CancelledChain], Resolution]:
        """Cancel active chains (every job not yet final); returns those cancelled."""
        ...

    async def retry_failed(
        self, tx: TransactionHandle, *, job_ids: Sequence[UUID], front: bool
    ) -> list[tuple[UUID, str]]:
        """Failed jobs back to pending with fresh attempts; returns (job id, queue)."""
        ...

    async def trigger(self, tx: TransactionHandle, *, job_ids: Sequence[UUID]) -> list[str]:
        """Make scheduled jobs due now; returns the queues touched."""
        ...

    async def set_queue_paused(
        self, tx: TransactionHandle | None, *, queue: str, paused: bool
    ) -> None: ...

    async def mark_chain_awaited(self, *, chain_id: UUID) -> None: ...

    async def now(self) -> datetime:
        """The store's clock: the one clock for schedules and leases."""
        ...

    # --- queries, deletion and retention -----------------------------------------------

    async def list_jobs(
        self,
        tx: TransactionHandle | None,
        *,
        where: JobFilter,
        after: PageKey | None,
        limit: int,
    ) -> list[Job[Any]]:
        """Jobs matching ``where``, newest first by (created_at, id), strictly after
        ``after`` in that order; at most ``limit``."""
        ...

    async def list_chains(
        self,
        tx: TransactionHandle | None,
        *,
        where: ChainFilter,
        after: PageKey | None,
        limit: int,
    ) -> list[Chain]:
        """Chains matching ``where``, in ``list_jobs`` order of their first job."""
        ...

    async def list_blocked_jobs(
        self, tx: TransactionHandle | None, *, after: PageKey | None, limit: int
    ) -> list[BlockedJob]:
        """Blocked jobs with their blockers' status, in ``list_jobs`` order."""
        ...

    async def count_jobs(self, tx: TransactionHandle | None) -> list[QueueCount]:
        """One row per queue that has unfinished jobs or a ``queues`` entry, by name."""
        ...

    async def delete_chains(
        self, tx: TransactionHandle, *, chain_ids: Sequence[UUID], cascade: bool
    ) -> ChainDeletion:
        """Delete whole chains in ``tx``. A job of another chain that may still run
        (blocked, pending, running, or failed and retryable) and waits for one of them
        is a dependant: without ``cascade`` its presence deletes nothing; with it, its
        chain goes too, transitively. Unknown ids delete nothing."""
        ...

    async def delete_expired_chains(self, *, retention: Mapping[str, timedelta], limit: int) -> int:
        """Delete up to ``limit`` ended chains whose type is a key of ``retention`` and
        that ended longer ago than its value, and commit; chains with dependants stay.
        One caller at a time: a concurrent caller returns 0 at once."""
        ...

    # --- operator reads (dashboard) -------------------------------------------------------

    async def recent_activity(
        self,
        tx: TransactionHandle | None,
        *,
        window: timedelta,
        bucket: timedelta,
        sample_size: int,
    ) -> RecentActivity:
        """Jobs that ended within ``window`` of now, per queue and ``bucket`` of their
        end time; completions among the newest ``sample_size`` jobs, failures up to
        ``sample_size`` (see ``RecentActivity``). Reads a bounded range, never the table."""
        ...

    async def chain_links(
        self, tx: TransactionHandle | None, *, chain_id: UUID, limit: int
    ) -> ChainLinks:
        """Up to ``limit`` chains ``chain_id``'s jobs wait for, and up to ``limit`` jobs of
        other chains waiting for it, each edge with the status at its other end."""
        ...

    # --- worker registry -----------------------------------------------------------------

    async def register_worker(self, *, worker: WorkerInfo) -> None:
        """Record (or re-record) a worker as alive and idle."""
        ...

    async def heartbeat(self, *, worker_id: str, active_slots: int, status: str) -> bool:
        """Refresh the worker's heartbeat; False if it was declared dead meanwhile."""
        ...

    async def find_dead_workers(self, *, older_than_s: float, exclude: str) -> list[str]:
        """Mark workers silent for longer than ``older_than_s`` stopped; return their ids."""
        ...

    async def list_workers(self, *, alive_within_s: float) -> list[WorkerRecord]: ...
