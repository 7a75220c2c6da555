"""The storage contract: named job operations every state adapter provides.

The client and the worker speak only these protocols; ``pgwork.postgres`` implements them.
The contract is cut two ways (docs/design/storage-contract.md):

- **the core**, ``CoreStateAdapter``: what every store implements, enough for the client
  to enqueue, read and control jobs and for a worker to run them. By role: ``Store``
  (verify, close, transactions), ``EnqueueStore`` (insert jobs), ``WorkerCore`` (acquire,
  renew, complete, fail, reschedule, release, reap), ``ReadCore`` (get and list jobs,
  chains, workers), ``ControlCore`` (cancel, retry, trigger, pause, delete),
  ``WorkerRegistry`` (register, heartbeat, find dead workers);
- **the capabilities**, each an optimisation or an optional feature a store may offer:
  ``BatchedTurns``, ``FlowControl``, ``LimitControl``, ``DueTimes``, ``AtomicAttempts``,
  ``AtomicGroupCommit``, ``TransactionLending``, ``InLineRenewal``, ``ChainBlockers``,
  ``Debouncing``, ``ChainSignals``,
  ``OperatorViews``, ``Maintenance``.

The roles, whole (``WorkerStore``, ``ReadStore``, ``ControlStore``), are each core part
with the capabilities it draws on, so that code needing one role is typed against that
role alone; ``StateAdapter`` is every role: the core with every capability, what the
client and the worker are given.

Arguments are keyword-only and results are frozen dataclasses (``_state_records``,
re-exported here), so a later field added to either breaks no adapter. Every write made on
behalf of a running attempt is *fenced* by ``(job_id, lease_token)``: an adapter must
change nothing when the token no longer matches a running job, and must report that
instead of raising.

Transactions: operations that take ``tx`` run inside that transaction and never commit
it; ``tx`` is either a caller's own connection/session (see ``adopt``) or a handle from
``transaction()``. Operations without ``tx`` run and commit on their own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable
from uuid import UUID

from pgwork._flow_control import Rate
from pgwork.adapters._state_records import (
    LISTED_BLOCKERS,
    AcquiredJob,
    BlockedJob,
    BlockerEdge,
    BlockerOutput,
    BlockerStatus,
    CancelledChain,
    ChainDeletion,
    ChainDependant,
    ChainFilter,
    ChainRef,
    Completion,
    CompletionResult,
    Debounce,
    DedupSpec,
    Failure,
    InsertedJob,
    JobFilter,
    Lease,
    LimitedTurn,
    NewJob,
    NewSignal,
    PageKey,
    QueueCount,
    ReapedJob,
    ReceivedSignal,
    RenewResult,
    Resolution,
    SignalDelivery,
    SignalFilter,
    SignalMatch,
    TypeLimits,
    WaitingFilter,
    WorkerInfo,
    WorkerRecord,
)
from pgwork.adapters.history import HistoryRollup, JobHistory
from pgwork.adapters.insight import ChainLinks, RecentActivity
from pgwork.adapters.limits import LimitChange, LimitPruning, TypeUsage
from pgwork.adapters.notify import NotifyAdapter
from pgwork.adapters.work import (
    ErrorGroup,
    InputMatch,
    InputScan,
    PendingType,
    WorkerJobs,
    WorkFilter,
)
from pgwork.records import Chain, Job, SignalRecord, Waiting
from pgwork.retention import Retention

__all__ = [
    "LISTED_BLOCKERS",
    "AcquiredJob",
    "AtomicAttempts",
    "AtomicGroup",
    "AtomicGroupCommit",
    "BatchedTurns",
    "BlockedJob",
    "BlockerEdge",
    "BlockerOutput",
    "BlockerStatus",
    "CancelledChain",
    "ChainBlockers",
    "ChainDeletion",
    "ChainDependant",
    "ChainFilter",
    "ChainRef",
    "ChainSignals",
    "Completion",
    "CompletionResult",
    "ControlCore",
    "ControlStore",
    "CoreStateAdapter",
    "Debounce",
    "Debouncing",
    "DedupSpec",
    "DueTimes",
    "EnqueueStore",
    "Failure",
    "FlowControl",
    "InLineRenewal",
    "InsertedJob",
    "JobFilter",
    "Lease",
    "LimitControl",
    "LimitedTurn",
    "Maintenance",
    "NewJob",
    "NewSignal",
    "OperatorViews",
    "PageKey",
    "QueueCount",
    "ReadCore",
    "ReadStore",
    "ReapedJob",
    "ReceivedSignal",
    "RenewResult",
    "Resolution",
    "SignalDelivery",
    "SignalFilter",
    "SignalMatch",
    "StateAdapter",
    "Store",
    "SyncAdopter",
    "TransactionHandle",
    "TransactionLending",
    "TransactionLoan",
    "TypeLimits",
    "WaitingFilter",
    "WorkerCore",
    "WorkerInfo",
    "WorkerRecord",
    "WorkerRegistry",
    "WorkerStore",
]


class TransactionHandle(Protocol):
    """An open transaction an adapter can run statements in (adapter-specific)."""

    async def discard(self) -> None:
        """End the transaction by dropping its connection, at once, without waiting for
        a statement in progress; the connection is never reused. For a transaction a
        handler the worker abandoned may still be using."""
        ...


class TransactionLoan(Protocol):
    """An atomic attempt's transaction lent to a sync handler's thread as a blocking
    DB-API connection (``TransactionLending.lend_transaction``).

    While it is lent, only the borrowing thread uses the transaction's connection: the
    event loop takes it back once the handler has returned, and a use from any other
    thread raises. Every statement first calls the ``check`` given to
    ``lend_transaction`` (which raises once the attempt is asked to stop), and fails
    cleanly once the loan has ended or the transaction was discarded.
    """

    def open(self) -> Any:
        """On the borrowing thread, before the handler: the blocking connection, in the
        attempt's transaction (its ``commit`` and ``rollback`` keep or undo what the
        handler wrote since its last ``commit``; the transaction itself commits with
        the job's completion)."""
        ...

    def close(self) -> None:
        """On the borrowing thread, once the handler has returned: the connection is
        given back, and every later use of it raises."""
        ...

    async def interrupt(self) -> None:
        """On the event loop: ask the server to cancel the statement the borrower is
        running, if any (the attempt was asked to stop)."""
        ...


class AtomicGroup(Protocol):
    """Several atomic attempts in one transaction, one after another, each in a savepoint
    of its own, committed once (``WorkerStore.open_atomic_group``).

    A member ``enter``s and its handler writes through the handle ``enter`` returned;
    the member's savepoint (and the group's transaction, first) opens when the member
    first uses that handle (or with its completion), so opening it costs no round trip
    of its own, and a member that used nothing may ``leave`` having cost none. Else
    the member is either kept (``complete`` or ``keep``: its writes join the group)
    or undone (``undo``: rolled back to its savepoint, nothing of it stays, the other
    members' writes are untouched). ``commit`` makes every kept member durable at
    once; until then a crash, or ``discard``, loses the whole group. Members never
    overlap: one connection. A member's job is fenced by its lease when its outcome
    is written, not locked while it runs: the worker keeps its lease renewed.
    """

    @property
    def members(self) -> int:
        """How many members were kept so far."""
        ...

    async def enter(self, *, lease: Lease, deadline: timedelta) -> TransactionHandle:
        """Start a member (``lease``'s job); its savepoint opens on the handle's first
        use. ``deadline`` bounds how long the group's transaction may stay open, idle,
        once this member is in it, should the process stop talking to the store."""
        ...

    @property
    def open(self) -> bool:
        """Whether the group's transaction was begun (a member used it)."""
        ...

    @property
    def used(self) -> bool:
        """Whether the current member used its transaction (its savepoint is open)."""
        ...

    def leave(self) -> None:
        """End the current member, which did not use its transaction, outside the
        group: nothing of it is in it (its outcome is written elsewhere)."""
        ...

    async def complete(self, completion: Completion) -> CompletionResult:
        """Keep the current member with its job's completion (no continuation, no
        children), written now in its savepoint and fenced by its lease; refused (the
        lease no longer holds), the member is undone instead and not counted. A member
        that did not use its transaction has its savepoint (and the group's transaction,
        first) opened with the completion, so every kept member commits with the group.
        What a result reports ready is announced by the caller after ``commit``."""
        ...

    async def keep(self) -> None:
        """End the current member's savepoint, its writes (outcome included) joining the
        group's."""
        ...

    async def undo(self) -> None:
        """Roll the current member back to its savepoint: nothing it wrote stays. It may
        then write again (its failure), in a savepoint of its own, and be kept."""
        ...

    async def commit(self) -> None:
        """Commit every kept member and give the connection back; raises when the group
        was lost (its connection closed or broken): then nothing committed."""
        ...

    async def discard(self) -> None:
        """Roll the whole group back and give the connection back."""
        ...


# --- the core: what every store implements ----------------------------------------------


@runtime_checkable
class Store(Protocol):
    """What every role has: a health check, a close, and transactions.

    ``transaction()`` opens one of the adapter's own; ``adopt`` wraps a caller's open one,
    so that any operation taking ``tx`` can run in the caller's unit of work."""

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


@runtime_checkable
class SyncAdopter(Protocol):
    """An optional role: adopt a caller's *blocking* connection (Django, Flask, scripts)
    for the client's ``*_sync`` calls.

    The handle it returns must make every operation the client awaits on it complete
    without suspending: the client drives those coroutines by hand, with no event loop.
    """

    def adopt_sync(self, tx: object) -> TransactionHandle: ...


@runtime_checkable
class EnqueueStore(Store, Protocol):
    """The producer's side: put jobs in (``Client.enqueue`` / ``start_chains``), and ask
    to be told when a chain ends (``Client`` awaiting a chain's result)."""

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

    async def mark_chain_awaited(self, *, chain_id: UUID) -> None: ...


@runtime_checkable
class WorkerCore(Store, Protocol):
    """The worker's core: lease jobs, keep the leases, settle the attempts, hand jobs
    back, take back expired leases.

    Every write here on behalf of an attempt is fenced by its ``Lease``. ``complete`` also
    serves ``Client.complete_job`` (``lease_token=None``: from outside any worker)."""

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
        """Complete jobs (and insert their continuations, and the children of those
        that start some: ``Completion.children``, ``ChainBlockers``) in ``tx``, or
        atomically on the adapter's own when ``tx`` is None. The ready queues a result
        reports include its children's.

        ``notify``: also announce what the results report (a ``ready`` notice per
        queue in ``ready_queues``, a ``chain_done`` notice per awaited chain that
        ended): inside ``tx``, or once the adapter's own write committed. As for
        ``insert_jobs``, given here so that an adapter sharing a database with
        ``notify`` can fold the announcement into its write. Without it the caller
        announces them."""
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


@runtime_checkable
class ReadCore(Store, Protocol):
    """The core reads: the store's clock, jobs and chains by id, a chain's jobs, the
    client's listings of jobs and chains, and the workers."""

    async def now(self) -> datetime:
        """The store's clock: the one clock for schedules and leases."""
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

    async def chains_of(
        self, tx: TransactionHandle | None, *, ids: Sequence[UUID]
    ) -> list[ChainRef]: ...

    async def list_jobs(
        self,
        tx: TransactionHandle | None,
        *,
        where: JobFilter,
        after: PageKey | None,
        limit: int,
    ) -> list[Job[Any]]:
        """Jobs matching ``where``, newest first by id (UUIDv7: creation order), strictly after
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

    async def list_workers(self, *, alive_within_s: float) -> list[WorkerRecord]: ...


@runtime_checkable
class ControlCore(Store, Protocol):
    """An operator's core changes: cancel, retry, trigger, pause queues, delete chains."""

    async def cancel_chains(
        self, tx: TransactionHandle, *, chain_ids: Sequence[UUID]
    ) -> tuple[list[CancelledChain], Resolution]:
        """Cancel active chains (every job not yet final); returns those cancelled."""
        ...

    async def retry_failed(
        self, tx: TransactionHandle, *, job_ids: Sequence[UUID], front: bool
    ) -> list[tuple[UUID, str]]:
        """Failed jobs back to pending with fresh attempts; returns (job id, queue).
        A chain this reopens is waited for again by the jobs still blocked on it
        (``ChainBlockers``): its failure no longer counts against their need."""
        ...

    async def trigger(self, tx: TransactionHandle, *, job_ids: Sequence[UUID]) -> list[str]:
        """Make scheduled jobs due now; returns the queues touched."""
        ...

    async def set_queue_paused(
        self, tx: TransactionHandle | None, *, queue: str, paused: bool
    ) -> None: ...

    async def delete_chains(
        self, tx: TransactionHandle, *, chain_ids: Sequence[UUID], cascade: bool
    ) -> ChainDeletion:
        """Delete whole chains in ``tx``. A job of another chain that may still run
        (blocked, pending, running, or failed and retryable) and waits for one of them
        is a dependant: without ``cascade`` its presence deletes nothing; with it, its
        chain goes too, transitively. Unknown ids delete nothing."""
        ...


@runtime_checkable
class WorkerRegistry(Store, Protocol):
    """Workers announcing themselves: register, heartbeat, and declare the silent dead.
    (Listing workers is a read: ``ReadCore.list_workers``; pruning the stopped is
    ``Maintenance.prune_workers``.)"""

    async def register_worker(self, *, worker: WorkerInfo) -> None:
        """Record (or re-record) a worker as alive and idle."""
        ...

    async def heartbeat(
        self, *, worker_id: str, active_slots: int, status: str, abandoned_handlers: int = 0
    ) -> bool:
        """Refresh the worker's heartbeat; False if it was declared dead meanwhile."""
        ...

    async def find_dead_workers(self, *, older_than_s: float, exclude: str) -> list[str]:
        """Mark workers silent for longer than ``older_than_s`` stopped; return their ids."""
        ...


@runtime_checkable
class CoreStateAdapter(EnqueueStore, WorkerCore, ReadCore, ControlCore, WorkerRegistry, Protocol):
    """The core of the contract: what a store implements to hold jobs for the client and
    the worker. Everything else is a capability below, an optimisation or an optional
    feature a store may offer."""


# --- capabilities: what a store may offer beyond the core -------------------------------


@runtime_checkable
class BatchedTurns(Protocol):
    """A worker's turn in one round trip: the finished batch's completions and the next
    acquire, committed together. Without it: ``complete`` then ``acquire``."""

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
        a continuation or children are refused (``ValueError``): they need a transaction
        of their own."""
        ...


@runtime_checkable
class FlowControl(Protocol):
    """Acquiring within job types' limits, exactly: however many workers acquire at
    once, no more jobs of a type (or of one of its limit groups) run than its limit, and
    the jobs of a keyed type are served fairly across groups. Without it a worker
    refuses job types that declare limits."""

    async def acquire_limited(
        self,
        *,
        completions: Sequence[Completion],
        worker_id: str,
        leases: Mapping[str, timedelta],
        queues: Sequence[str],
        limit: int,
        limits: Mapping[str, TypeLimits],
        expect_short: bool = True,
        freed: Sequence[tuple[str, str]] = (),
    ) -> LimitedTurn:
        """``complete_and_acquire`` (or ``acquire``, without completions) where each
        type that is a key of ``limits`` is leased only within them: counted against
        what runs now, under a serialisation that no other acquire of the type can
        race, and round-robin across its limit groups (each group's first job before
        any group's second, starting after the group served last). Types of ``leases``
        absent from ``limits`` are acquired as ``acquire`` would. Completions with a
        continuation or children are refused (``ValueError``).

        An acquire that comes back short with jobs of a limited type left pending
        marks that a worker waits for room in the type; an acquire that finds a type so
        marked (by an earlier acquire) with room left clears the mark and returns the
        type in ``waited_for``. ``expect_short`` is a hint (the caller's last acquire
        came back short): a store may leave the marks out of an acquire not expected to
        come back short, but then must acquire again, with them, if it does.
        ``freed``: the (type, limit key, '' for none) of the caller's attempts that
        ended since its last acquire; a keyed type is reported only when one of them
        left room in its group (a key limit holds its waiting workers back, and only an
        attempt of that key that ends lets them on)."""
        ...


@runtime_checkable
class LimitControl(Protocol):
    """Flow limits changed at run time: an operator's overrides of a type's declared
    limits and pauses of a type or of one of its keys, kept in the store (one row per
    type, ``limit_key`` '', or per key of a type) for every worker's acquire to read,
    and read back with what runs against them. Without it a client cannot change
    limits (``CapabilityMissingError``), and an attempt cannot pause its key."""

    async def change_limits(
        self,
        tx: TransactionHandle | None,
        *,
        type_name: str,
        limit_key: str,
        change: LimitChange,
    ) -> list[str]:
        """Write ``change`` to the row of ``type_name`` and ``limit_key`` ('' for the
        type's own row), creating it when missing: each field that is not ``KEEP`` is
        set (None clears it); the acquire's own columns (its fairness cursor) are never
        touched. A ``timedelta`` pause is from now on the store's clock. Returns the
        queues that workers running the type take jobs from (to announce them ready:
        a raised limit or an ended pause starts waiting jobs at once). The values were
        checked by the caller; the store only keeps them. Without ``tx`` the change
        commits on its own."""
        ...

    async def limit_usage(
        self,
        tx: TransactionHandle | None,
        *,
        type_names: Sequence[str],
        key_concurrency: Mapping[str, int],
        rate: Mapping[str, Rate],
        key_rate: Mapping[str, Rate],
        keys: int,
    ) -> list[TypeUsage]:
        """One ``TypeUsage`` per type of ``type_names`` and per type that has a row of
        its own, by name: its row's overrides and pause (a pause that has passed reads
        None), how many of its limited jobs run and wait now, and up to ``keys`` of its
        keys closest to their limits, then up to ``keys`` more that are paused now or
        have an override of their own.

        ``key_concurrency``, ``rate`` and ``key_rate``: what each type declares (a type
        left out declares no such limit), under the overrides of its row; a key's own
        row overrides the per-key ones for it. ``started`` counts the attempts that
        ``acquire_limited`` recorded as started in the window of the effective rate,
        ending now: of the type as a whole for its ``rate`` (every key's starts), of
        the key alone for a key's ``key_rate``; None where there is no such rate. A
        key's closeness is the larger of running over its concurrency limit and
        started over its rate's count (with neither, its running jobs)."""
        ...


@runtime_checkable
class DueTimes(Protocol):
    """When the next scheduled job becomes due, so that an idle worker sleeps until then
    instead of polling."""

    async def next_due(
        self,
        *,
        type_names: Sequence[str],
        queues: Sequence[str],
        missed_after: float | None = None,
    ) -> float | None:
        """Seconds until the earliest pending job of ``type_names`` in ``queues`` that is
        not due yet becomes due, on the database clock; None when there is none.

        What an idle worker sleeps until instead of polling: time has no notification.
        It must stay cheap however many jobs are scheduled (an index, never a scan).

        ``missed_after`` is a ``time.monotonic()`` instant, about when an acquire that
        found nothing was sent: a job that became due since then (reckoned when the
        statement runs) counts too, as due now (0.0). That acquire may have seen it not
        due yet: a timer that fired early, a worker clock ahead of the database's. A
        job due before then is left out: that acquire passed it over (a caller holds
        its row), and it must not hide the next due time.
        """
        ...


@runtime_checkable
class AtomicAttempts(Protocol):
    """Atomic attempts: a handler writes in a transaction of the store's, and its job's
    completion commits with those writes or not at all. For a store that is the
    application's own database."""

    async def begin_atomic(
        self, tx: TransactionHandle, *, lease: Lease, deadline: timedelta
    ) -> bool:
        """Open an atomic attempt in ``tx``: bound the transaction and check that
        ``lease`` still holds its job (False if not). The row is not locked: the
        attempt's lease is renewed while it runs, and its completion is fenced."""
        ...

    def atomic_transaction(
        self, *, lease: Lease, deadline: timedelta
    ) -> AbstractAsyncContextManager[TransactionHandle | None]:
        """``transaction()`` with ``begin_atomic`` already done, in as few round trips
        as the store allows: yields the open transaction, or None (rolled back at
        once) when ``lease`` no longer holds its job. Commits on clean exit, unless
        ``complete_atomic`` ended the transaction already."""
        ...

    async def complete_atomic(
        self, tx: TransactionHandle, *, completion: Completion
    ) -> CompletionResult:
        """Complete an atomic attempt's job in ``tx`` (from ``atomic_transaction``) and
        commit ``tx`` with it, in as few round trips as the store allows; ``tx`` is over
        either way. When the completion is refused (the lease no longer holds the job),
        ``tx`` is rolled back instead — nothing written in it commits — and the result
        is not accepted. Dependants of a chain it ends are settled after the commit, as
        ``complete(None, ...)`` does. ``completion`` has no continuation and no
        children (``ValueError``): those go through ``complete(tx, ...)``."""
        ...


@runtime_checkable
class AtomicGroupCommit(Protocol):
    """Several atomic attempts in one transaction, committed once (see ``AtomicGroup``)."""

    async def open_atomic_group(self) -> AtomicGroup:
        """A group of atomic attempts sharing one transaction and one commit (see
        ``AtomicGroup``); it holds one of the adapter's connections until its
        ``commit`` or ``discard``."""
        ...


@runtime_checkable
class TransactionLending(Protocol):
    """Sync (plain ``def``) handlers of atomic job types: an atomic attempt's
    transaction lent to the handler's thread as a blocking DB-API connection, so that
    blocking code writes in the job's own transaction. For a store whose driver can
    hand one connection from the event loop to a thread and back."""

    def lend_transaction(
        self, tx: TransactionHandle, *, check: Callable[[], None]
    ) -> TransactionLoan:
        """Lend ``tx`` (from ``atomic_transaction``; on the event loop, no I/O);
        ``check`` is called before each of the borrower's statements. ``tx``'s
        ``discard`` then also stops the borrower's use of it: its statement in
        progress fails, and so does every later one."""
        ...


@runtime_checkable
class InLineRenewal(Protocol):
    """Renewing a lease whose row a caller's transaction holds, waiting in line for it:
    for a store whose callers' transactions can lock a job's row."""

    async def renew_in_line(
        self, *, lease: Lease, duration: timedelta, wait: timedelta
    ) -> RenewResult:
        """``renew`` one lease whose row another transaction holds (``renew`` reported it
        ``deferred``), waiting in line up to ``wait`` for that transaction to let go;
        ``deferred`` again if it has not by then. While the worker waits, ``reap``
        leaves the job alone, even once its lease has run out: the moment the caller
        lets go, the worker still running the job renews its lease before any reaper
        can take it. The lease counts from the moment the row was got."""
        ...


@runtime_checkable
class ChainBlockers(Protocol):
    """Jobs that wait for other chains (``NewJob.blockers``): their blockers' outputs,
    and settling them when their blockers end (docs/design/fan-out.md).

    A blocked job is inserted by ``insert_jobs``: a chain's first job blocked on
    existing chains, or a later job of its chain (a continuation) blocked on the
    children its completion starts (``Completion.children``, written by ``complete``
    before it). It waits ``blocked`` until ``blocker_need`` of its blockers (all of
    them when None) are *met*: completed, deleted, or ended (failed, cancelled) under
    its ``blocker_failure="unblock"``; then it is pending. Once so many have ended
    otherwise that the rest cannot make up the need, its policy ``"fail"`` or
    ``"cancel"`` ends it and its chain that way, and that chain's own dependants
    follow. Each blocker's end must cost the same however many blockers the job has:
    10,000 children are settled by 10,000 small writes, not by reading every edge at
    every end."""

    async def blocker_outputs(
        self, tx: TransactionHandle | None, *, job_id: UUID
    ) -> list[BlockerOutput]:
        """Each of ``job_id``'s blockers in the order given, with its chain's status and
        final output, and whether it was met when last counted (``BlockerOutput.met``:
        a job released with ``blocker_need`` of them reads the rest as not met, those
        that ended together with the last one needed included)."""
        ...

    async def resolve_dependants(
        self, tx: TransactionHandle | None, *, chain_ids: Sequence[UUID]
    ) -> Resolution:
        """Settle jobs blocked on ``chain_ids`` (ended chains) per their edges' policy.
        Settling one end twice changes nothing the second time."""
        ...

    async def sweep_blocked(self, *, limit: int = 100) -> Resolution:
        """Settle, up to ``limit``, blocked jobs some of whose blockers ended without
        being settled (a process died between ending a chain and settling its
        dependants), counting their blockers again from their chains' status."""
        ...


@runtime_checkable
class Debouncing(Protocol):
    """Debounced enqueues (``start_chain(dedup=Debounce(...))``): a burst of enqueues of
    one key becomes one job, which runs once the burst settles."""

    async def debounce_jobs(
        self,
        tx: TransactionHandle,
        *,
        jobs: Sequence[NewJob],
        notify: NotifyAdapter | None = None,
    ) -> list[InsertedJob]:
        """Insert each of ``jobs`` (each a new chain's first job whose ``dedup`` is a
        ``Debounce``, with no schedule and no blockers) in ``tx``, or merge it into the
        pending job of its chain type and key that a debounced enqueue started and that
        has never started; the results come in ``jobs``' order.

        A new job is due ``delay`` after now and records its deadline, now plus
        ``max_wait`` (``Job.debounce_deadline``). A merge changes that job alone: its
        input becomes the new one under ``keep="last"`` (stays under ``"first"``), and
        it is due at the later of when it was due and now plus ``delay``, at most its
        deadline; the result names it, ``deduplicated`` and ``debounced``. Jobs of one
        key within ``jobs`` merge in order, the first inserting or merging.

        Race-safe at every isolation level: of concurrent enqueues of one key, one
        inserts and each other merges, in turn, after the previous has committed; a
        transaction whose snapshot cannot see that commit (REPEATABLE READ,
        SERIALIZABLE) fails with a serialization failure and nothing of it is written,
        never a second job. A job that starts (is acquired) meanwhile is not merged
        into: the enqueue then inserts. ``notify``: as for ``insert_jobs``, a ``ready``
        notice with the due time of each queue that got a new job.
        """
        ...


@runtime_checkable
class ChainSignals(Protocol):
    """Steps that wait for a signal (``NewJob.wait_signal``) and the signals sent to
    them (docs/design/signals.md). ``insert_jobs`` inserts a waiting step (blocked, or
    pending at its timeout); these operations write signals and pair them with steps.

    Neither ``send_signals`` nor the hand-on that writes a step looks for the other:
    each asks, once committed, for its name to be matched (the sender by a ``signal``
    notice, a worker's hand-on by ``match_signals``), and whichever match runs second
    sees both rows. ``sweep_signals`` pairs what a lost match left."""

    async def send_signals(
        self,
        tx: TransactionHandle,
        *,
        signals: Sequence[NewSignal],
        notify: NotifyAdapter | None = None,
    ) -> None:
        """Write ``signals`` in ``tx`` (a caller's transaction, at any isolation level:
        the write reads nothing), pending until a match hands each to a step. ``notify``:
        also announce a ``signal`` notice per name, inside ``tx`` (so on commit only),
        folded into the write when the store shares a database with it."""
        ...

    async def match_signals(self, *, names: Sequence[str], limit: int = 100) -> SignalMatch:
        """Pair the pending signals of each of ``names`` with its waiting steps, oldest
        with oldest, up to ``limit`` per name, and commit: each signal paired is
        consumed by its step, and the step is pending now. A step waits while it has not
        started: blocked, or pending with its timeout still to come. Matches of one name
        never overlap (a signal goes to one step); a match that begins after a signal
        and a step were committed pairs them, unless another match of the name is under
        way then: it waits for none, and returns that name in ``busy`` instead, pairing
        nothing of it (the other match may have begun before that commit: the caller
        asks again shortly)."""
        ...

    async def sweep_signals(self, *, limit: int = 100) -> SignalMatch:
        """Match up to ``limit`` names that have both a pending signal and a waiting
        step (a match lost with a worker that died, or a notice never heard); a name
        another match is pairing is waited for, not returned ``busy``."""
        ...

    async def received_signal(
        self, tx: TransactionHandle | None, *, job_id: UUID
    ) -> ReceivedSignal | None:
        """The signal a match handed to ``job_id``, or None (it started without one)."""
        ...

    async def prune_signals(self, *, older_than: timedelta, limit: int = 1000) -> int:
        """Delete, and commit, up to ``limit`` signals sent longer than ``older_than``
        ago that nothing will read: pending ones no step took, and consumed ones whose
        step is gone or completed or cancelled (a failed step may be retried, and reads
        its signal again). A signal a match holds is left for a later call."""
        ...


@runtime_checkable
class OperatorViews(Protocol):
    """An operator's bounded views: counts, blocked jobs, recent activity, chain links,
    the work views, the job history, and what waits (the CLI's read commands, the
    dashboard)."""

    async def count_jobs(self, tx: TransactionHandle | None) -> list[QueueCount]:
        """One row per queue that has unfinished jobs or a ``queues`` entry, by name."""
        ...

    async def list_blocked_jobs(
        self, tx: TransactionHandle | None, *, after: PageKey | None, limit: int
    ) -> list[BlockedJob]:
        """Blocked jobs in ``list_jobs`` order, each with its counts and its first
        ``LISTED_BLOCKERS`` blockers' status (``BlockedJob``): a read bounded by
        ``limit`` however many chains each job waits for."""
        ...

    async def list_blockers(
        self, tx: TransactionHandle | None, *, job_id: UUID, after: int | None, limit: int
    ) -> list[BlockerEdge]:
        """The chains ``job_id`` waits for, by position, strictly after the position
        ``after`` (None: from the first); at most ``limit``. Empty for an unknown job."""
        ...

    async def recent_activity(
        self,
        tx: TransactionHandle | None,
        *,
        window: timedelta,
        bucket: timedelta,
        sample_size: int,
    ) -> RecentActivity:
        """Jobs that completed or failed within ``window`` of now (from the start of its
        first ``bucket``), per queue and ``bucket`` of their end time, counting at most
        the newest ``sample_size`` of them (see ``RecentActivity``). Reads one index
        range, never the table."""
        ...

    async def chain_links(
        self, tx: TransactionHandle | None, *, chain_id: UUID, limit: int
    ) -> ChainLinks:
        """Up to ``limit`` chains ``chain_id``'s jobs wait for, and up to ``limit`` jobs of
        other chains waiting for it, each edge with the status at its other end."""
        ...

    async def list_work(
        self,
        tx: TransactionHandle | None,
        *,
        where: WorkFilter,
        after: PageKey | None,
        oldest_first: bool,
        limit: int,
    ) -> list[Job[Any]]:
        """Jobs matching ``where`` in the order of their status's time (see
        ``WorkStatus``) then id, strictly after ``after``; at most ``limit``."""
        ...

    async def running_by_worker(
        self, tx: TransactionHandle | None, *, per_worker: int
    ) -> list[WorkerJobs]:
        """Per worker holding running jobs (by worker id): how many it holds and the
        ``per_worker`` it started first (by ``started_at``, then id)."""
        ...

    async def pending_types(
        self, tx: TransactionHandle | None, *, sample: int
    ) -> list[PendingType]:
        """The job types among the ``sample`` oldest ready jobs of each queue and
        priority, per queue."""
        ...

    async def error_groups(
        self, tx: TransactionHandle | None, *, sample: int, limit: int
    ) -> list[ErrorGroup]:
        """The newest ``sample`` failed jobs grouped by error type and message, largest
        group first; at most ``limit`` groups."""
        ...

    async def jobs_in_id_range(
        self, tx: TransactionHandle | None, *, low: UUID, high: UUID, limit: int
    ) -> list[Job[Any]]:
        """Jobs whose id is within ``[low, high]``, in id order; at most ``limit``."""
        ...

    async def scan_input(
        self,
        tx: TransactionHandle | None,
        *,
        match: InputMatch,
        before: PageKey | None,
        examine: int,
        limit: int,
    ) -> InputScan:
        """Look at the newest ``examine`` jobs created before ``before`` (by id; all
        jobs when ``None``) and return those ``match`` matches, newest first, stopping
        at ``limit`` matches. Reads at most ``examine`` rows whatever the table holds:
        no index on inputs is needed, and no enqueue pays for one."""
        ...

    async def chain_waits(
        self, tx: TransactionHandle | None, *, chain_ids: Sequence[UUID]
    ) -> list[Waiting]:
        """What the current step (the newest job) of each of ``chain_ids`` waits for,
        one ``Waiting`` per chain whose step waits (any order); none for a chain that
        is missing, ended, or whose step is ready, running or retrying. A signal wait
        is the one ``ChainSignals.match_signals`` pairs: not started, and blocked or
        pending with its timeout still to come. A blockers wait's ``done`` of ``total``
        is the job's own count of its blockers' ends (``ChainBlockers``: an end counts
        once settled), read without going through its blockers one by one."""
        ...

    async def list_waiting(
        self,
        tx: TransactionHandle | None,
        *,
        where: WaitingFilter,
        after: PageKey | None,
        limit: int,
    ) -> list[Waiting]:
        """Waiting steps matching ``where``, newest first by job id, strictly after
        ``after``; at most ``limit``. Reads the waiting steps of the kinds asked for,
        never the ended or ready jobs."""
        ...

    async def list_signals(
        self,
        tx: TransactionHandle | None,
        *,
        where: SignalFilter,
        after: PageKey | None,
        limit: int,
    ) -> list[SignalRecord]:
        """Signals matching ``where``, newest first by id, strictly after ``after``; at
        most ``limit``. A store without ``ChainSignals`` has none."""
        ...

    async def job_history(
        self,
        tx: TransactionHandle | None,
        *,
        window: timedelta,
        resolution: timedelta,
        step: timedelta,
        group_resolution: timedelta,
        queue: str | None,
        type_name: str | None,
    ) -> JobHistory:
        """The history within ``window`` of now, from the start of the step (or group
        bucket, the longer) it begins in: per ``step`` (a multiple of ``resolution``,
        one of the widths ``roll_up_history`` writes) from buckets of ``resolution``,
        and per queue and type from buckets of ``group_resolution``; ``queue`` /
        ``type_name`` keep only theirs. Reads the history alone, never the jobs."""
        ...


@runtime_checkable
class Maintenance(Protocol):
    """What the worker's maintenance runs: retention, the history rollup, pruning stopped
    workers and flow-control rows nothing reads any more."""

    async def delete_expired_chains(self, *, retention: Mapping[str, Retention], limit: int) -> int:
        """Delete up to ``limit`` ended chains whose type is a key of ``retention`` and
        that ended longer ago than its policy's period for how they ended, and commit;
        return how many. Kept whatever their period (``pgwork.retention``): a chain a job
        that may still run waits on, one enqueued with a ``DedupSpec`` whose window has
        not ended (``scope="window"``; ``"ever"`` has no end), and one awaited that
        ended less than ``AWAITED_HOLD`` ago. One caller at a time:
        a concurrent caller returns 0 at once. The ended jobs it deletes that the
        history has not counted yet are counted into it."""
        ...

    async def roll_up_history(
        self, *, limit: int, keep: timedelta, max_lag: timedelta
    ) -> HistoryRollup:
        """Count the jobs that ended since the history's progress into its buckets
        (about ``limit`` jobs at most, oldest first), move the progress past them,
        and delete daily buckets older than ``keep`` (finer ones after
        ``history.FINE_KEEP`` and ``history.HOURLY_KEEP``); commit. Each ended job is
        counted exactly once, however many callers run at once (a concurrent one
        returns ``skipped``) and whether retention deletes it before or after. Only
        jobs that ended before every transaction still open began are counted (their
        end could still commit earlier), unless that transaction has been open longer
        than ``max_lag``.
        Jobs that ended more than ``keep`` ago are not counted."""
        ...

    async def prune_workers(self, *, stopped_for_s: float, limit: int = 1000) -> int:
        """Delete up to ``limit`` workers that have been stopped (by ``stop()`` or declared
        dead) for longer than ``stopped_for_s``; return how many. A worker not stopped is
        never deleted, however old its heartbeat."""
        ...

    async def prune_limits(
        self, *, starts_older_than: timedelta, limit: int = 1000
    ) -> LimitPruning:
        """Delete, and commit, up to ``limit`` keys' rows of flow limits (``LimitControl``)
        that hold nothing any more: no override, no pause still to come (none, or one
        that has passed) and no mark of a worker waiting; and up to ``limit`` recorded
        attempt starts (``FlowControl``'s rates) older than ``starts_older_than``, which
        the caller gives as the longest window a rate can have
        (``pgwork._flow_control.MAX_RATE_PERIOD``), so that no window counts them.

        A type's own row (``limit_key`` '') is never deleted: it holds the type's
        overrides and the acquire's fairness cursor. Deleting a key's row changes no
        acquire (a missing row reads as the passed pause it held), and a row that an
        operator or an attempt writes meanwhile is not deleted with what it now holds:
        it is kept, or left for a later call. A store without those capabilities has
        nothing to delete."""
        ...


# --- the roles, whole: each core part with the capabilities it draws on ----------------


@runtime_checkable
class WorkerStore(
    WorkerCore,
    BatchedTurns,
    FlowControl,
    LimitControl,
    DueTimes,
    AtomicAttempts,
    AtomicGroupCommit,
    TransactionLending,
    InLineRenewal,
    ChainBlockers,
    ChainSignals,
    Protocol,
):
    """What a worker does with jobs: its core and every capability it uses."""


@runtime_checkable
class ReadStore(ReadCore, OperatorViews, Protocol):
    """Reads that change nothing: the client's queries and anything that only looks
    (``pgwork jobs``/``queues``/``workers``, a dashboard) depend on this role alone."""


@runtime_checkable
class ControlStore(ControlCore, LimitControl, Maintenance, Protocol):
    """An operator's changes (flow limits at run time included), and the maintenance
    that expires old chains, rolls the history up and prunes stopped workers."""


@runtime_checkable
class StateAdapter(
    EnqueueStore, Debouncing, WorkerStore, ReadStore, ControlStore, WorkerRegistry, Protocol
):
    """Every role over one store: what ``Client`` and ``InProcessWorker`` are given.
    Implementations must pass ``pgwork.testing.conformance`` unchanged."""
