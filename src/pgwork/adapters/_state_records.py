"""The records the state protocols take and return: frozen dataclasses, no behaviour.

Kept apart from the protocols (``pgwork.adapters.state``, which re-exports every name
here) so that the protocol file reads as a list of operations. Arguments are
keyword-only and results are these dataclasses, so a field added later breaks no adapter.
Import them from ``pgwork.adapters.state``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal
from uuid import UUID

from pgwork._limits import check_dedup_key, check_delay
from pgwork.errors import ConfigurationError, InvalidDedupWindowError, InvalidOptionError
from pgwork.records import AttemptError, ChainStatus, Job, JobStatus, WaitKind

__all__ = [
    "LISTED_BLOCKERS",
    "AcquiredJob",
    "BlockedJob",
    "BlockerEdge",
    "BlockerOutput",
    "BlockerStatus",
    "CancelledChain",
    "ChainDeletion",
    "ChainDependant",
    "ChainFilter",
    "ChainRef",
    "Completion",
    "CompletionResult",
    "Debounce",
    "DedupSpec",
    "Failure",
    "InsertedJob",
    "JobFilter",
    "Lease",
    "NewJob",
    "NewSignal",
    "PageKey",
    "QueueCount",
    "ReapedJob",
    "ReceivedSignal",
    "RenewResult",
    "Resolution",
    "SignalDelivery",
    "SignalFilter",
    "SignalMatch",
    "TypeLimits",
    "WaitingFilter",
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


@dataclass(frozen=True, slots=True)
class Debounce:
    """Trailing-edge debounce: one run after a burst of enqueues of one key settles.

    The first enqueue of ``key`` (per chain type) starts a chain whose first job is due
    ``delay`` later. Each enqueue of the key while that job is still pending and has
    never started merges into it instead of starting a chain: the job takes the new
    input (``keep="last"``) or keeps its own (``keep="first"``), and its start moves to
    ``delay`` after the new enqueue, never earlier than it was and never later than
    ``max_wait`` after the first enqueue (the job's ``debounce_deadline``). Once the job
    has started, the next enqueue starts a new chain: a change made after the start
    runs again.

    ``delay``: longer than zero; ``max_wait``: at least ``delay``, required so that a
    steady stream of enqueues cannot hold the job back for ever. Every field is checked
    here, before any statement runs (``InvalidOptionError``).
    """

    key: str
    delay: timedelta
    max_wait: timedelta
    keep: Literal["last", "first"] = "last"

    def __post_init__(self) -> None:
        check_dedup_key(self.key, where="Debounce")
        if not isinstance(self.delay, timedelta) or self.delay <= timedelta(0):
            raise InvalidOptionError(
                "delay", self.delay, "a timedelta longer than zero", f"Debounce({self.key!r})"
            )
        check_delay("delay", self.delay, where=f"Debounce({self.key!r})")
        if not isinstance(self.max_wait, timedelta) or self.max_wait < self.delay:
            raise InvalidOptionError(
                "max_wait",
                self.max_wait,
                f"a timedelta at least as long as the delay ({self.delay}): the longest "
                "the first enqueue waits for its job to start",
                f"Debounce({self.key!r})",
            )
        check_delay("max_wait", self.max_wait, where=f"Debounce({self.key!r})")
        if self.keep not in ("last", "first"):
            raise InvalidOptionError(
                "keep",
                self.keep,
                "'last' (a merge replaces the pending job's input) or 'first' (keeps it)",
                f"Debounce({self.key!r})",
            )


@dataclass(slots=True)
class NewJob:
    """A job to insert. ``input_json`` is already validated, encoded JSON text.

    Not frozen, though nothing changes one after it is built: a frozen dataclass sets
    each field through ``object.__setattr__``, which makes building one 2.5 times
    slower, and a batch builds thousands.

    ``id`` is a UUIDv7 made just before the insert (``pgwork._ids.new_id``, as the
    client does): ids are time-ordered, and job listings rely on it (newest first by
    id; ``created_after`` bounds the range of ids read).

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
    # A ``Debounce`` goes to ``Debouncing.debounce_jobs`` only (never to ``insert_jobs``),
    # and its job has no schedule (its delay is one) and no blockers.
    dedup: DedupSpec | Debounce | None = None
    trace_context: Mapping[str, str] | None = None
    # Chains this job waits for, and what their failure does to it: a chain's first job
    # (``start_chain(blockers=...)``), or a later job of its chain that waits for the
    # children its completion writes (``Continue(..., wait_for=Children(...))``).
    blockers: tuple[UUID, ...] = ()
    blocker_failure: Literal["fail", "cancel", "unblock"] = "fail"
    # How many of ``blockers`` must be met (completed, or ended under ``"unblock"``)
    # before it runs; None: all of them. From 1 to ``len(blockers)``.
    blocker_need: int | None = None
    # A logging context (``start_chain(context=...)``), already checked; continuations
    # inherit their chain's.
    context: Mapping[str, str] | None = None
    # The key its type's flow limits count it by, already checked; a continuation
    # carries the key of the job that handed on unless ``Continue`` gave its own.
    limit_key: str | None = None
    # The group its type's limits count it in (``JobType.limit_group``); None for a type
    # without limits.
    limit_group: str | None = None
    # A waiting step (``Continue(..., wait_for=...)``): the name of the signal it waits
    # for. Without a schedule it is inserted ``blocked``; with one (its timeout, as
    # ``run_after``) ``pending`` until then. A signal matched to it makes it pending
    # now (``ChainSignals``). Never on a chain's first job, nor with blockers or a
    # dedup key.
    wait_signal: str | None = None


@dataclass(slots=True)
class InsertedJob:
    """What ``insert_jobs`` did for one ``NewJob`` (same order as given). Not frozen
    for the same reason as ``NewJob``.

    When deduplicated, ``job_id``/``chain_id`` are the existing chain's and nothing new
    was written. ``debounced`` (``Debouncing.debounce_jobs``): the job was merged into
    the existing pending job of its debounce key, which took its input (or kept its
    own) and its later start; ``deduplicated`` is then true too (no chain was started).
    """

    job_id: UUID
    chain_id: UUID
    status: JobStatus
    deduplicated: bool
    debounced: bool = False


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
    # The rest of what ``get_job`` returns, so a handler's ``attempt.job`` is the stored
    # job: when it first started, when its previous attempt ended, its dedup key.
    started_at: datetime | None = None
    last_attempt_at: datetime | None = None
    dedup_key: str | None = None
    context: dict[str, str] | None = None
    # The job's limit key (``NewJob.limit_key``).
    limit_key: str | None = None

    @property
    def lease(self) -> Lease:
        return Lease(self.id, self.lease_token)


@dataclass(frozen=True, slots=True)
class TypeLimits:
    """What an acquire may lease of one job type (``FlowControl.acquire_limited``).

    ``concurrency``: at most this many of the type running at once, across every
    worker; ``key_concurrency``: at most this many per limit group (a limit key, or the
    group of the type's jobs enqueued without one). The store reads an operator's
    overrides of each at each acquire. ``most``: at most this many leased by this
    acquire (the worker's own cap on the type, less what it holds). None: no such
    limit."""

    concurrency: int | None = None
    key_concurrency: int | None = None
    most: int | None = None
    # ``rate``: at most this many attempts started in any window of ``rate_per_s``
    # seconds, across every worker; ``key_rate``: the same per limit group.
    rate_n: int | None = None
    rate_per_s: float | None = None
    key_rate_n: int | None = None
    key_rate_per_s: float | None = None

    @property
    def shared(self) -> bool:
        """Whether the limits count what every worker runs (so acquires of the type
        must not race), not only this one."""
        return self.concurrency is not None or self.key_concurrency is not None or self.rated

    @property
    def keyed(self) -> bool:
        """Whether a limit counts per limit group."""
        return self.key_concurrency is not None or self.key_rate_n is not None

    @property
    def rated(self) -> bool:
        """Whether a rate counts the attempts started."""
        return self.rate_n is not None or self.key_rate_n is not None


@dataclass(frozen=True, slots=True)
class LimitedTurn:
    """What ``FlowControl.acquire_limited`` did: the completions' results, the jobs it
    leased, and ``waited_for``: the limited types in which a worker waits for room (an
    acquire of its came back short with jobs of the type left pending) and that have
    room now. The caller announces their jobs as ready, so the waiting workers wake;
    where nobody waits, an attempt that ends announces nothing."""

    results: list[CompletionResult]
    acquired: list[AcquiredJob]
    waited_for: frozenset[str] = frozenset()
    # After a short acquire: when a limit holding its types' pending jobs back (a rate
    # whose window is full, a pause) may next let one start, never later than that
    # moment; the caller sets a timer for it. None: nothing to wait for.
    opens_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class RenewResult:
    """Outcome of renewing one lease: ``renewed``, or the job's status now (if any).

    ``deferred``: not renewed this time because another transaction holds the job's
    row (a caller cancelling or completing it, say); the lease still holds as it was,
    and the next renewal tries again. Renewal never waits on such a row."""

    job_id: UUID
    lease_token: UUID
    renewed: bool
    leased_until: datetime | None
    status: JobStatus | None
    deferred: bool = False


@dataclass(frozen=True, slots=True)
class Completion:
    """Complete a job, optionally continuing its chain with ``continuation``.

    ``lease_token`` fences a worker's completion; ``None`` completes from outside any
    worker (it then applies to a pending or running job).

    ``children``: new chains' first jobs (plain: no schedule, blocker, dedup key or
    signal) the completion starts (``attempt.start_chain``), written in its transaction
    when it is accepted and not at all when it is refused. A ``continuation`` blocked
    on them (its ``blockers`` among their ids) is written after them. Only a store
    with ``ChainBlockers`` is given children.
    """

    job_id: UUID
    lease_token: UUID | None
    output_json: str
    continuation: NewJob | None = None
    children: tuple[NewJob, ...] = ()


@dataclass(frozen=True, slots=True)
class CompletionResult:
    """What one completion did. ``ready_queues``: queues where jobs became ready
    (continuation, unblocked dependants); ``due``: (queue, seconds since the epoch)
    where a job became due later (a scheduled continuation or dependant), the
    earliest per queue; ``chain_awaited``: the chain ended and someone awaits it — all
    for the caller to announce after commit."""

    job_id: UUID
    accepted: bool
    chain_completed: bool = False
    continuation_id: UUID | None = None
    ready_queues: tuple[str, ...] = ()
    chain_awaited: bool = False
    due: tuple[tuple[str, float], ...] = ()
    # Not written this time (``accepted`` False): another transaction holds the job's
    # row, and a worker's own batch skips such a row rather than wait on it. The lease
    # is untouched; write the completion again later.
    deferred: bool = False


@dataclass(frozen=True, slots=True)
class Resolution:
    """The effect of settling blocked dependants of chains that ended. ``due``:
    (queue, seconds since the epoch) where a dependant became pending but is
    scheduled later, the earliest per queue."""

    ready_queues: tuple[str, ...] = ()
    ended_chain_ids: tuple[UUID, ...] = ()
    awaited_chain_ids: tuple[UUID, ...] = ()
    due: tuple[tuple[str, float], ...] = ()

    def merge(self, other: Resolution) -> Resolution:
        return Resolution(
            ready_queues=tuple(sorted(set(self.ready_queues) | set(other.ready_queues))),
            ended_chain_ids=self.ended_chain_ids + other.ended_chain_ids,
            awaited_chain_ids=self.awaited_chain_ids + other.awaited_chain_ids,
            due=earliest_due((*self.due, *other.due)),
        )


def earliest_due(due: Iterable[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
    """The earliest due time per queue among ``due``, ordered by queue."""
    earliest: dict[str, float] = {}
    for queue, at in due:
        if at < earliest.get(queue, at + 1):
            earliest[queue] = at
    return tuple(sorted(earliest.items()))


@dataclass(frozen=True, slots=True)
class BlockerOutput:
    """One blocker chain of a job: its status and (once completed) its final output.

    ``met``: whether the blocker was counted as met (completed, deleted, or ended
    under ``"unblock"``) when it was last counted for the job: by the job's release at
    the latest. A job released once ``blocker_need`` of its blockers were met reads
    the others as not met, whatever became of them since; of blockers that ended
    together with the last one needed, only the first ``blocker_need`` met, in the
    order given, read as met."""

    chain_id: UUID
    status: ChainStatus | None
    type_name: str | None
    output: Any
    met: bool = True


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
    # Handlers it gave up on (they ignored cancellation) that still run.
    abandoned_handlers: int = 0


@dataclass(frozen=True, slots=True)
class CancelledChain:
    chain_id: UUID
    job_ids: tuple[UUID, ...]


@dataclass(frozen=True, slots=True)
class Failure:
    """End an attempt with an error: retry after ``retry_after``, or fail for good.

    The failure is kept in the job's attempt history, with ``ran_for`` (how long the
    handler ran, as the worker measured it) when given."""

    job_id: UUID
    lease_token: UUID
    error: AttemptError
    retry_after: timedelta | None
    ran_for: timedelta | None = None


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
class WaitingFilter:
    """Which waiting steps ``list_waiting`` returns. ``kinds``: the kinds of wait
    (``WaitKind``; empty: every kind); ``signal`` / ``signal_prefix``: only steps
    waiting for that signal name, or for a name that starts with it (signal waits
    alone); ``chain_type``: only steps of chains of that type."""

    kinds: tuple[WaitKind, ...] = ()
    signal: str | None = None
    signal_prefix: str | None = None
    chain_type: str | None = None


@dataclass(frozen=True, slots=True)
class SignalFilter:
    """Which signals ``list_signals`` returns: ``pending`` ones only (no step has taken
    them yet) or every signal kept; of one ``name``, or names starting with
    ``name_prefix``."""

    pending: bool = True
    name: str | None = None
    name_prefix: str | None = None


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
    """A position in a newest-first listing: rows strictly older than this come next
    (by ``id`` alone for job listings, ids being time-ordered; by ``(created_at, id)``
    for the others)."""

    created_at: datetime
    id: UUID


@dataclass(frozen=True, slots=True)
class BlockerStatus:
    """One chain a blocked job waits for; ``status`` is ``None`` once it was deleted."""

    chain_id: UUID
    status: ChainStatus | None


# The blockers ``list_blocked_jobs`` gives each job at most: a step may wait for
# 10,000 children, and a page of such steps must not carry all of their edges.
LISTED_BLOCKERS = 20


@dataclass(frozen=True, slots=True)
class BlockedJob:
    """A job in status ``blocked``, its counts and the first chains it waits for.

    ``blockers``: the first ``LISTED_BLOCKERS`` (20) chains it waits for, in
    declaration order (the order a handler started its children), each with its
    status now; ``more_blockers``: it waits for more than those (page through every
    one with ``Client.list_blockers``). The counts are the job's own, kept as its
    blockers' ends are settled: ``blockers_needed`` (how many must be met: all, or the
    ``need`` of ``Children``), ``blockers_met`` and ``blockers_open`` (not ended yet, as
    far as it knows: an end the blocker sweep has still to settle counts as open).
    None for a step that waits for a signal (blocked, on no chain), and on a store
    that keeps no counts."""

    job: Job[Any]
    blockers: tuple[BlockerStatus, ...]
    more_blockers: bool = False
    blockers_needed: int | None = None
    blockers_met: int | None = None
    blockers_open: int | None = None


@dataclass(frozen=True, slots=True)
class BlockerEdge:
    """One chain a job waits for, at its ``position`` among the job's blockers (from 0,
    in declaration order); ``status`` is ``None`` once the chain was deleted."""

    position: int
    chain_id: UUID
    status: ChainStatus | None


@dataclass(frozen=True, slots=True)
class QueueCount:
    """Unfinished work of one queue, as a dashboard or ``pgwork queues`` shows it.

    ``ready``: pending and due; ``scheduled``: pending, due later; ``running``: leased
    by a worker, which includes jobs a worker prefetched that wait for a slot (their
    rows are the same until the handler ends; ``pgwork queues`` shows the column as
    LEASED and splits it with the workers' heartbeats); ``oldest_ready_age``:
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


# --- signals ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewSignal:
    """A signal to send (``ChainSignals.send_signals``): ``payload_json`` is already
    validated, encoded JSON text. ``id`` is a UUIDv7 made as it is sent: signals of one
    name are delivered in id order."""

    id: UUID
    name: str
    payload_json: str


@dataclass(frozen=True, slots=True)
class SignalDelivery:
    """One signal a match handed to one waiting step, now pending in ``queue``."""

    signal_id: UUID
    job_id: UUID
    name: str
    queue: str


@dataclass(frozen=True, slots=True)
class SignalMatch:
    """What a match (or a sweep) did: each signal delivered, with its step. ``full``:
    the names where a side reached the match's ``limit``, which may have more pairs
    (match them again). ``busy``: the names another match was pairing at that moment,
    left alone by this one (nothing of theirs delivered); that match may have begun
    before the commit that asked for the name, so ask again shortly."""

    delivered: tuple[SignalDelivery, ...] = ()
    full: tuple[str, ...] = ()
    busy: tuple[str, ...] = ()

    @property
    def ready_queues(self) -> tuple[str, ...]:
        """The queues where a step became ready now, once each, by name."""
        return tuple(sorted({d.queue for d in self.delivered}))


@dataclass(frozen=True, slots=True)
class ReceivedSignal:
    """The signal a step was handed (``ChainSignals.received_signal``): its parsed JSON
    ``payload``, not yet decoded to a model."""

    signal_id: UUID
    name: str
    payload: Any
    sent_at: datetime
