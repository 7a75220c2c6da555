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

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, runtime_checkable
from uuid import UUID

from pgwork.records import AttemptError, Chain, ChainStatus, Job, JobStatus

__all__ = [
    "AcquiredJob",
    "BlockerOutput",
    "CancelledChain",
    "ChainRef",
    "Completion",
    "CompletionResult",
    "DedupSpec",
    "Failure",
    "InsertedJob",
    "Lease",
    "NewJob",
    "ReapedJob",
    "RenewResult",
    "Resolution",
    "StateAdapter",
    "TransactionHandle",
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


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to insert. ``input_json`` is already validated, encoded JSON text.

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


@dataclass(frozen=True, slots=True)
class InsertedJob:
    """What ``insert_jobs`` did for one ``NewJob`` (same order as given).

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


class TransactionHandle(Protocol):
    """An open transaction an adapter can run statements in (adapter-specific)."""


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
        self, tx: TransactionHandle, *, jobs: Sequence[NewJob]
    ) -> list[InsertedJob]: ...

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

    async def renew(
        self, *, leases: Sequence[Lease], duration: Mapping[UUID, timedelta]
    ) -> list[RenewResult]:
        """Extend each lease whose token still holds the running job by ``duration``
        (keyed by job id); one result per lease, identified by (job_id, lease_token)."""
        ...

    async def complete(
        self, tx: TransactionHandle | None, *, completions: Sequence[Completion]
    ) -> list[CompletionResult]:
        """Complete jobs (and insert their continuations) in ``tx``, or atomically on
        the adapter's own when ``tx`` is None."""
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
        self, *, type_names: Sequence[str], exclude_worker: str, limit: int = 1
    ) -> list[ReapedJob]:
        """Take back jobs whose lease expired (not ``exclude_worker``'s own)."""
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
