"""The client: enqueue chains inside the caller's transaction, and read them back.

Everything that can be checked without the database (job type, entry flag, input
model, JSON-ability, size) is checked before the first statement, so bad input raises
a ``PgworkError`` and leaves the caller's transaction untouched and usable.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast
from uuid import UUID

from pgwork._continuations import Schedule, split_schedule
from pgwork._ids import new_id, new_ids
from pgwork._limits import (
    check_context,
    check_dedup_key,
    check_delay,
    check_limit_key,
    check_max_attempts,
    check_payload_cap,
    check_priority,
    check_queue_name,
)
from pgwork.adapters.capabilities import Capabilities
from pgwork.adapters.in_process import InProcessNotifyAdapter
from pgwork.adapters.notify import NotifyAdapter
from pgwork.adapters.state import (
    CoreStateAdapter,
    Debounce,
    DedupSpec,
    InsertedJob,
    NewJob,
    TransactionHandle,
)
from pgwork.client._control import ControlMixin
from pgwork.client._history import HistoryMixin
from pgwork.client._insight import InsightMixin
from pgwork.client._limits import LimitsMixin
from pgwork.client._queries import QueryMixin
from pgwork.client._signals import SignalMixin
from pgwork.client._starts import ChainStart, StartedChain
from pgwork.client._sync import SyncEnqueueMixin
from pgwork.client._waiting import WaitingMixin
from pgwork.client._work import WorkMixin
from pgwork.errors import (
    ChainNotFoundError,
    ConfigurationError,
    InvalidOptionError,
    JobNotFoundError,
    PayloadError,
)
from pgwork.job_types import JobType, JobTypeRegistry
from pgwork.observability import JOB_ENQUEUED, Observer, default_observers
from pgwork.observability.emitter import Emitter
from pgwork.payload import DEFAULT_MAX_PAYLOAD_BYTES
from pgwork.records import Chain, Job, JobStatus

__all__ = ["Client", "create_client"]

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741

_Schedule = tuple[datetime | None, timedelta | None]  # (run_at, run_after)
_NOW: _Schedule = (None, None)


class Client(
    QueryMixin,
    ControlMixin,
    LimitsMixin,
    InsightMixin,
    SyncEnqueueMixin,
    WorkMixin,
    HistoryMixin,
    SignalMixin,
    WaitingMixin,
):
    """Enqueue and query jobs. Create with ``create_client``."""

    def __init__(
        self,
        *,
        state_adapter: CoreStateAdapter,
        notify_adapter: NotifyAdapter,
        registry: JobTypeRegistry,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        observers: Sequence[Observer] | None = None,
    ) -> None:
        registry.validate()
        check_payload_cap(max_payload_bytes)
        # The core of the contract; what the store offers beyond it is asked once, here
        # (the worker built on this client reads it too). A feature that needs a
        # capability the store lacks raises ``CapabilityMissingError``.
        self.state: CoreStateAdapter = state_adapter
        self.capabilities = Capabilities.of(state_adapter)
        self.notify = notify_adapter
        self.registry = registry
        self.max_payload_bytes = max_payload_bytes
        self.observers = tuple(default_observers() if observers is None else observers)
        self._events = Emitter(self.observers)

    # --- enqueue -----------------------------------------------------------------------

    async def start_chain(
        self,
        tx: object,
        job_type: JobType[I, O],
        input: I,
        *,
        schedule: Schedule = None,
        dedup: str | DedupSpec | Debounce | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        blockers: Sequence[UUID | StartedChain[Any, Any]] = (),
        context: Mapping[str, str] | None = None,
        limit_key: str | None = None,
    ) -> StartedChain[I, O]:
        """Start a chain with ``job_type`` inside the caller's open transaction ``tx``.

        ``tx``: a psycopg ``AsyncConnection``, an asyncpg ``Connection`` in a transaction,
        or a SQLAlchemy ``AsyncConnection`` / ``AsyncSession`` (psycopg or asyncpg driver;
        its transaction is begun if it was not). Nothing is committed here: the job exists
        once, and only if, the caller commits. ``schedule``: a timezone-aware datetime
        or a delay. ``dedup``: a key (or ``DedupSpec``) — if a matching chain exists it
        is returned with ``deduplicated=True`` and nothing is inserted; or a
        ``Debounce``, which merges this enqueue into its key's pending debounced job
        (``debounced=True``: that job took this input, or kept its own, and starts
        later) or starts one due after its delay (no ``schedule``, no ``blockers``;
        docs/enqueue.md, "Debounce"). ``blockers``:
        chains that must complete first; the job waits ``blocked`` until they do (and its
        type's ``blocker_failure`` decides what a failed or cancelled blocker does).
        ``context``: a small ``{str: str}`` map (a request id, a tenant; at most 4 KiB
        encoded) stored with the job, inherited by its chain's continuations, returned
        as ``Job.context`` and bound to every log line of its attempts.
        ``limit_key``: the key its type's per-key flow limits (``key_concurrency``,
        ``key_rate``) count the chain's jobs by, such as a tenant or a host: a
        non-empty string of at most 200 characters, kept by the chain's
        continuations and returned as ``Job.limit_key``. Accepted for any type (a type
        without a key limit stores it all the same); a keyed type's jobs enqueued
        without one share one key of their own.
        """
        if schedule is None and dedup is None and not blockers:
            return await self._start_plain(
                job_type,
                input,
                queue,
                priority,
                max_attempts,
                context,
                limit_key,
                self.state.adopt,
                tx,
            )
        started = await self.start_chains(
            tx,
            [
                ChainStart(
                    job_type,
                    input,
                    schedule=schedule,
                    dedup=dedup,
                    queue=queue,
                    priority=priority,
                    max_attempts=max_attempts,
                    blockers=blockers,
                    context=context,
                    limit_key=limit_key,
                )
            ],
        )
        return started[0]

    async def start_chains(
        self, tx: object, items: Sequence[ChainStart[Any]]
    ) -> list[StartedChain[Any, Any]]:
        """Start many chains in the caller's transaction with one insert per batch."""
        if not items:
            return []
        return await self._start_chains(items, self.state.adopt, tx)

    async def _start_chains(
        self,
        items: Sequence[ChainStart[Any]],
        adopt: Callable[[object], Awaitable[TransactionHandle]],
        tx: object,
    ) -> list[StartedChain[Any, Any]]:
        """The one enqueue: validate and encode, adopt ``tx``, insert, report. The
        ``*_sync`` twins drive this same coroutine by hand (``_sync.py``)."""
        names = [
            item.job_type.name if isinstance(item.job_type, JobType) else str(item.job_type)
            for item in items
        ]
        with self._events.trace_enqueue(names) as trace:
            new_jobs: Iterable[NewJob]
            new_jobs, debounced = self._new_chains(items, trace)
            # Asked once per batch: the default observer declines this event.
            wanted = self._events.wants(JOB_ENQUEUED) if self._events else False
            if wanted or debounced:
                new_jobs = list(new_jobs)
            handle = await adopt(tx)
            if debounced:
                inserted = await self._insert_debounced(handle, cast("list[NewJob]", new_jobs))
            else:
                inserted = await self.state.insert_jobs(handle, jobs=new_jobs, notify=self.notify)
            for job, result in zip(new_jobs, inserted, strict=True) if wanted else ():
                self._events.emit(
                    JOB_ENQUEUED,
                    job_id=result.job_id,
                    chain_id=result.chain_id,
                    job_type=job.type_name,
                    queue=job.queue,
                    deduplicated=result.deduplicated,
                    scheduled=job.run_at is not None
                    or job.run_after is not None
                    or isinstance(job.dedup, Debounce),
                )
        # Positional: by keyword each StartedChain cost a third more
        # (python -m bench.cpu --only enqueue).
        return [
            StartedChain(
                result.chain_id,
                result.job_id,
                item.job_type,
                result.deduplicated,
                result.status,
                result.debounced,
            )
            for item, result in zip(items, inserted, strict=True)
        ]

    async def _insert_debounced(
        self, handle: TransactionHandle, jobs: list[NewJob]
    ) -> list[InsertedJob]:
        """A batch with debounced jobs: those go to the store's ``debounce_jobs``, the
        others to ``insert_jobs``, in the one transaction; results in ``jobs``' order."""
        debouncing = self.capabilities.require_debouncing("start_chain(dedup=Debounce(...))")
        debounced = [job for job in jobs if isinstance(job.dedup, Debounce)]
        others = [job for job in jobs if not isinstance(job.dedup, Debounce)]
        inserted = iter(
            await self.state.insert_jobs(handle, jobs=others, notify=self.notify) if others else ()
        )
        merged = iter(await debouncing.debounce_jobs(handle, jobs=debounced, notify=self.notify))
        return [next(merged) if isinstance(j.dedup, Debounce) else next(inserted) for j in jobs]

    async def _start_plain(
        self,
        job_type: JobType[I, O],
        input: I,
        queue: str | None,
        priority: int | None,
        max_attempts: int | None,
        context: Mapping[str, str] | None,
        limit_key: str | None,
        adopt: Callable[[object], Awaitable[TransactionHandle]],
        tx: object,
    ) -> StartedChain[I, O]:
        """``_start_chains`` for one chain runnable now (no schedule, no dedup key, no
        blocker), the commonest enqueue: the same checks in the same order, then one
        job built and inserted, without the batch's lists and iterators."""
        name = job_type.name if isinstance(job_type, JobType) else str(job_type)
        with self._events.trace_enqueue([name]) as trace:
            resolved = self.registry.entry(job_type)
            input_json = resolved.input_codec.encode(input, max_bytes=self.max_payload_bytes)
            if queue is None:
                queue = resolved.queue
            else:
                check_queue_name(queue)
            if priority is None:
                priority = resolved.priority
            else:
                check_priority(priority)
            if max_attempts is not None:
                check_max_attempts(max_attempts)
            if context is not None:
                check_context(context)
            if limit_key is not None:
                check_limit_key(limit_key)
            job_id = new_id()
            job = NewJob(
                id=job_id,
                type_name=resolved.name,
                chain_id=job_id,
                chain_type_name=resolved.name,
                chain_index=0,
                input_json=input_json,
                queue=queue,
                priority=priority,
                max_attempts=max_attempts or resolved.max_attempts,
                run_at=None,
                run_after=None,
                dedup=None,
                trace_context=trace,
                blockers=(),
                blocker_failure=resolved.blocker_failure,
                context=context,
                limit_key=limit_key,
                limit_group=resolved.limit_group(limit_key),
            )
            handle = await adopt(tx)
            (result,) = await self.state.insert_jobs(handle, jobs=[job], notify=self.notify)
            if self._events and self._events.wants(JOB_ENQUEUED):
                self._events.emit(
                    JOB_ENQUEUED,
                    job_id=result.job_id,
                    chain_id=result.chain_id,
                    job_type=resolved.name,
                    queue=queue,
                    deduplicated=result.deduplicated,
                    scheduled=False,
                )
        # Positional, as in _start_chains.
        return StartedChain(
            result.chain_id, result.job_id, job_type, result.deduplicated, result.status
        )

    def _new_chains(
        self, items: Sequence[ChainStart[Any]], trace: Mapping[str, str] | None
    ) -> tuple[Iterator[NewJob], bool]:
        """Validate and encode every item now, before any statement runs; return the
        jobs as an iterator that builds them as the adapter takes them, and whether
        any of them is debounced.

        Everything that can fail happens here, so bad input leaves the caller's
        transaction untouched. Building the jobs cannot fail, so it is left to the
        adapter's pace: it can start writing the first rows while the rest are built,
        and the database inserts while Python works. Per batch, not per item: each
        distinct job type is resolved once, and ids come from one call.
        """
        types: dict[int, JobType[Any, Any]] = {}
        max_bytes = self.max_payload_bytes
        resolved: list[JobType[Any, Any]] = []
        inputs: list[str] = []
        schedules: list[_Schedule] = []
        dedups: list[DedupSpec | Debounce | None] = []
        debounced = False
        for item in items:
            job_type = types.get(id(item.job_type))
            if job_type is None:
                job_type = types[id(item.job_type)] = self.registry.entry(item.job_type)
            resolved.append(job_type)
            inputs.append(job_type.input_codec.encode(item.input, max_bytes=max_bytes))
            # The checks below, skipped for what most items leave out (a call each).
            schedule = item.schedule
            schedules.append(_NOW if schedule is None else split_schedule(schedule))
            dedup = item.dedup
            if dedup is None:
                dedups.append(None)
            else:
                spec = _dedup_spec(dedup)
                dedups.append(spec)
                if type(spec) is Debounce:
                    _check_debounced(item, spec)
                    if not debounced:
                        self.capabilities.require_debouncing("start_chain(dedup=Debounce(...))")
                        debounced = True
            if (
                item.queue is not None
                or item.priority is not None
                or item.max_attempts is not None
                or item.context is not None
                or item.limit_key is not None
                or item.blockers
            ):
                _check_options(item)
                if item.blockers:
                    self.capabilities.require_blockers("starting a chain with blockers")
        checked = zip(resolved, inputs, schedules, dedups, strict=True)
        return _build_jobs(items, checked, new_ids(len(items)), trace), debounced

    # --- reads -------------------------------------------------------------------------

    async def get_job(self, job_id: UUID, *, tx: object | None = None) -> Job[Any]:
        """Return one job with its input decoded to the model of its type (when the type
        is registered; raw JSON otherwise). Raises JobNotFoundError."""
        handle = await self.state.adopt(tx) if tx is not None else None
        jobs = await self.state.get_jobs(handle, job_ids=[job_id])
        if not jobs:
            raise JobNotFoundError([job_id])
        return self._decoded(jobs[0])

    async def get_chain(self, chain_id: UUID, *, tx: object | None = None) -> Chain:
        """Return a chain: status, input, final output (once completed), newest job."""
        handle = await self.state.adopt(tx) if tx is not None else None
        chains = await self.state.get_chains(handle, chain_ids=[chain_id])
        if not chains:
            raise ChainNotFoundError([chain_id])
        return self._decoded_chain(chains[0])

    async def list_chain_jobs(self, chain_id: UUID, *, tx: object | None = None) -> list[Job[Any]]:
        """A chain's jobs in order (first job first)."""
        handle = await self.state.adopt(tx) if tx is not None else None
        jobs = await self.state.list_chain_jobs(handle, chain_id=chain_id)
        if not jobs:
            raise ChainNotFoundError([chain_id])
        return [self._decoded(job) for job in jobs]

    def _decode_input(self, type_name: str, data: Any) -> Any:
        if type_name not in self.registry:
            return data
        return _leniently(self.registry.get(type_name).input_codec.decode, data)

    def _decoded(self, job: Job[Any]) -> Job[Any]:
        if job.type_name not in self.registry:
            return job
        job_type = self.registry.get(job.type_name)
        output = job.output
        if output is not None and job.status is JobStatus.COMPLETED:
            output = _leniently(job_type.output_codec.decode, output)
        return replace(job, input=_leniently(job_type.input_codec.decode, job.input), output=output)

    async def close(self) -> None:
        """Close both adapters (their pools and listener connections)."""
        await self.notify.close()
        await self.state.close()


def _build_jobs(
    items: Sequence[ChainStart[Any]],
    checked: Iterable[tuple[JobType[Any, Any], str, _Schedule, DedupSpec | Debounce | None]],
    ids: Sequence[UUID],
    trace: Mapping[str, str] | None,
) -> Iterator[NewJob]:
    """The first job of each chain in ``items``, from what ``_new_chains`` checked:
    the job type, encoded input, schedule and dedup spec of each."""
    for item, (job_type, input_json, (run_at, run_after), dedup), job_id in zip(
        items, checked, ids, strict=True
    ):
        yield NewJob(
            id=job_id,
            type_name=job_type.name,
            chain_id=job_id,
            chain_type_name=job_type.name,
            chain_index=0,
            input_json=input_json,
            queue=job_type.queue if item.queue is None else item.queue,
            priority=item.priority if item.priority is not None else job_type.priority,
            max_attempts=item.max_attempts or job_type.max_attempts,
            run_at=run_at,
            run_after=run_after,
            dedup=dedup,
            trace_context=trace,
            # A chain listed twice is waited for once (one edge per blocker).
            blockers=item.blockers if len(item.blockers) < 2 else _distinct(item.blockers),
            blocker_failure=job_type.blocker_failure,
            context=item.context,
            limit_key=item.limit_key,
            limit_group=job_type.limit_group(item.limit_key),
        )


def _distinct(blockers: tuple[UUID, ...]) -> tuple[UUID, ...]:
    unique = tuple(dict.fromkeys(blockers))
    return blockers if len(unique) == len(blockers) else unique


def _check_options(item: ChainStart[Any]) -> None:
    """Hold each per-call override to what its column accepts (see ``_limits``)."""
    if item.queue is not None:
        check_queue_name(item.queue)
    if item.priority is not None:
        check_priority(item.priority)
    if item.max_attempts is not None:
        check_max_attempts(item.max_attempts)
    if item.context is not None:
        check_context(item.context)
    if item.limit_key is not None:
        check_limit_key(item.limit_key)
    for blocker in item.blockers:
        if not isinstance(blocker, UUID):
            raise ConfigurationError(
                f"blockers must be chain ids (UUID) or StartedChain values, got {blocker!r}"
            )


def _check_debounced(item: ChainStart[Any], spec: Debounce) -> None:
    """A debounced chain's start is its delay's, and it waits for nothing else: a merge
    could not tell which schedule or which blockers to keep."""
    where = f"a chain debounced on {spec.key!r}"
    if item.schedule is not None:
        raise InvalidOptionError(
            "schedule", item.schedule, "None (the Debounce's delay sets the start)", where
        )
    if item.blockers:
        raise InvalidOptionError(
            "blockers", item.blockers, "empty (a debounced chain cannot wait for others)", where
        )


def _dedup_spec(dedup: str | DedupSpec | Debounce | None) -> DedupSpec | Debounce | None:
    if dedup is None:
        return None
    if isinstance(dedup, Debounce):
        return dedup  # checked whole when it was made
    if isinstance(dedup, str):
        dedup = DedupSpec(dedup)
    elif not isinstance(dedup, DedupSpec):
        check_dedup_key(dedup)  # raises: neither a key nor a spec
    check_dedup_key(dedup.key)
    if dedup.window is not None:
        check_delay("dedup window", dedup.window)
    return dedup


def create_client(
    *,
    state_adapter: CoreStateAdapter,
    notify_adapter: NotifyAdapter | None = None,
    registry: JobTypeRegistry,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    observers: Sequence[Observer] | None = None,
) -> Client:
    """Build a Client. Without ``notify_adapter`` an in-process one is used (workers in
    other processes then find new jobs by polling only). ``observers`` receive the
    events of ``pgwork.observability`` (default: a ``LoggingObserver``; ``[]``: none);
    workers built on this client share them unless given their own. ``state_adapter``
    needs only the core of the storage contract; a feature that needs a capability it
    does not offer raises ``CapabilityMissingError`` (docs/design/storage-contract.md)."""
    for name, adapter in (("state_adapter", state_adapter), ("notify_adapter", notify_adapter)):
        _refuse_awaitable(name, adapter)
    return Client(
        state_adapter=state_adapter,
        notify_adapter=notify_adapter or InProcessNotifyAdapter(),
        registry=registry,
        max_payload_bytes=max_payload_bytes,
        observers=observers,
    )


def _refuse_awaitable(name: str, adapter: object) -> None:
    """An adapter still to be awaited (``PostgresStateAdapter.connect(dsn)`` without
    ``await``, as code without an event loop writes it) would fail only at the first
    enqueue, with a message about something else: refuse it here, with the recipe."""
    if not inspect.isawaitable(adapter):
        return
    if inspect.iscoroutine(adapter):
        adapter.close()  # never awaited: no "was never awaited" warning on top
    raise ConfigurationError(
        f"{name} is {type(adapter).__name__}, still to be awaited: write `await "
        "PostgresStateAdapter.connect(dsn)` inside an event loop. Code without one "
        "(Django, Flask, scripts) that only enqueues with start_chain_sync builds the "
        "adapter on a pool it never opens: `PostgresStateAdapter(AsyncConnectionPool("
        "dsn, open=False))` (docs/enqueue.md, 'Without an event loop')"
    )


def _leniently(decode: Callable[[Any], Any], stored: Any) -> Any:
    """``decode(stored)``, or ``stored`` itself when it no longer fits its model (the
    model changed since it was written, or it is an ``UndecodablePayload``): a read
    shows every row it finds rather than failing on one; the worker, which must act
    on the value, still fails such a job."""
    try:
        return decode(stored)
    except PayloadError:
        return stored
