"""Instrumenting any state adapter at the seam: start/stop/error and a duration per call.

``InstrumentedStateAdapter`` is itself a ``StateAdapter``: it forwards every operation
unchanged to the adapter it wraps, so it passes the same conformance suite, and emits
``adapter.call.start`` before and ``adapter.call.stop`` (or ``adapter.call.error``)
after each one. ``transaction()`` is measured from entering to leaving the block.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

from pgwork.adapters.history import HistoryRollup, JobHistory
from pgwork.adapters.insight import ChainLinks, RecentActivity
from pgwork.adapters.notify import NotifyAdapter
from pgwork.adapters.state import (
    AcquiredJob,
    AtomicGroup,
    BlockedJob,
    BlockerOutput,
    CancelledChain,
    ChainDeletion,
    ChainFilter,
    ChainRef,
    Completion,
    CompletionResult,
    Failure,
    InsertedJob,
    JobFilter,
    Lease,
    NewJob,
    PageKey,
    QueueCount,
    ReapedJob,
    RenewResult,
    Resolution,
    StateAdapter,
    SyncAdopter,
    TransactionHandle,
    WorkerInfo,
    WorkerRecord,
)
from pgwork.adapters.work import (
    ErrorGroup,
    InputMatch,
    InputScan,
    PendingType,
    WorkerJobs,
    WorkFilter,
)
from pgwork.errors import ConfigurationError
from pgwork.observability._events import (
    ADAPTER_CALL_ERROR,
    ADAPTER_CALL_START,
    ADAPTER_CALL_STOP,
    Observer,
)
from pgwork.observability.emitter import Emitter
from pgwork.records import Chain, Job

__all__ = ["InstrumentedStateAdapter"]

T = TypeVar("T")


class InstrumentedStateAdapter:
    """Wrap ``inner`` so every call is reported to ``observers``.

    Pass it as ``state_adapter`` to ``create_client``; ``inner`` keeps its pool and is
    closed through the wrapper.
    """

    def __init__(self, inner: StateAdapter, *, observers: Iterable[Observer]) -> None:
        self.inner = inner
        self._events = Emitter(observers)

    @contextmanager
    def _timed(self, operation: str) -> Iterator[None]:
        """Emit start, then stop or error (with the duration) around one operation."""
        self._events.emit(ADAPTER_CALL_START, operation=operation)
        started = time.monotonic()
        try:
            yield
        except BaseException as exc:
            self._events.emit(
                ADAPTER_CALL_ERROR,
                operation=operation,
                duration_s=time.monotonic() - started,
                error_type=type(exc).__name__,
                error_message=str(exc),
            )
            raise
        self._events.emit(
            ADAPTER_CALL_STOP, operation=operation, duration_s=time.monotonic() - started
        )

    async def _call(self, operation: str, call: Awaitable[T]) -> T:
        with self._timed(operation):
            return await call

    async def verify(self) -> None:
        await self._call("verify", self.inner.verify())

    async def close(self) -> None:
        await self._call("close", self.inner.close())

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[TransactionHandle]:
        with self._timed("transaction"):
            async with self.inner.transaction() as tx:
                yield tx

    @asynccontextmanager
    async def atomic_transaction(
        self, *, lease: Lease, deadline: timedelta
    ) -> AsyncIterator[TransactionHandle | None]:
        with self._timed("atomic_transaction"):
            async with self.inner.atomic_transaction(lease=lease, deadline=deadline) as tx:
                yield tx

    async def adopt(self, tx: object) -> TransactionHandle:
        return await self._call("adopt", self.inner.adopt(tx))

    def adopt_sync(self, tx: object) -> TransactionHandle:
        """The wrapped adapter's ``adopt_sync`` (the client's ``*_sync`` calls)."""
        inner = self.inner
        if not isinstance(inner, SyncAdopter):
            raise ConfigurationError(
                f"{type(inner).__name__} cannot adopt a blocking connection; use the async calls"
            )
        with self._timed("adopt"):
            return inner.adopt_sync(tx)

    async def insert_jobs(
        self,
        tx: TransactionHandle,
        *,
        jobs: Iterable[NewJob],
        notify: NotifyAdapter | None = None,
    ) -> list[InsertedJob]:
        return await self._call("insert_jobs", self.inner.insert_jobs(tx, jobs=jobs, notify=notify))

    async def acquire(
        self,
        *,
        worker_id: str,
        leases: Mapping[str, timedelta],
        queues: Sequence[str] | None,
        limit: int,
    ) -> list[AcquiredJob]:
        return await self._call(
            "acquire",
            self.inner.acquire(worker_id=worker_id, leases=leases, queues=queues, limit=limit),
        )

    async def next_due(
        self,
        *,
        type_names: Sequence[str],
        queues: Sequence[str],
        missed_after: float | None = None,
    ) -> float | None:
        return await self._call(
            "next_due",
            self.inner.next_due(type_names=type_names, queues=queues, missed_after=missed_after),
        )

    async def complete_and_acquire(
        self,
        *,
        completions: Sequence[Completion],
        worker_id: str,
        leases: Mapping[str, timedelta],
        queues: Sequence[str] | None,
        limit: int,
    ) -> tuple[list[CompletionResult], list[AcquiredJob]]:
        return await self._call(
            "complete_and_acquire",
            self.inner.complete_and_acquire(
                completions=completions,
                worker_id=worker_id,
                leases=leases,
                queues=queues,
                limit=limit,
            ),
        )

    async def begin_atomic(
        self, tx: TransactionHandle, *, lease: Lease, deadline: timedelta
    ) -> bool:
        return await self._call(
            "begin_atomic", self.inner.begin_atomic(tx, lease=lease, deadline=deadline)
        )

    async def renew(
        self, *, leases: Sequence[Lease], duration: Mapping[UUID, timedelta]
    ) -> list[RenewResult]:
        return await self._call("renew", self.inner.renew(leases=leases, duration=duration))

    async def renew_in_line(
        self, *, lease: Lease, duration: timedelta, wait: timedelta
    ) -> RenewResult:
        return await self._call(
            "renew_in_line", self.inner.renew_in_line(lease=lease, duration=duration, wait=wait)
        )

    async def complete(
        self,
        tx: TransactionHandle | None,
        *,
        completions: Sequence[Completion],
        notify: NotifyAdapter | None = None,
    ) -> list[CompletionResult]:
        return await self._call(
            "complete", self.inner.complete(tx, completions=completions, notify=notify)
        )

    async def complete_atomic(
        self, tx: TransactionHandle, *, completion: Completion
    ) -> CompletionResult:
        return await self._call(
            "complete_atomic", self.inner.complete_atomic(tx, completion=completion)
        )

    async def open_atomic_group(self) -> AtomicGroup:
        # The group's own steps are not instrumented: they are a member's round trips.
        return await self._call("open_atomic_group", self.inner.open_atomic_group())

    async def fail(
        self, tx: TransactionHandle | None, *, failures: Sequence[Failure]
    ) -> list[bool]:
        return await self._call("fail", self.inner.fail(tx, failures=failures))

    async def reschedule(
        self,
        tx: TransactionHandle | None,
        *,
        lease: Lease,
        run_at: datetime | None,
        run_after: timedelta | None,
        count_attempt: bool,
    ) -> bool:
        return await self._call(
            "reschedule",
            self.inner.reschedule(
                tx, lease=lease, run_at=run_at, run_after=run_after, count_attempt=count_attempt
            ),
        )

    async def release(self, *, leases: Sequence[Lease]) -> int:
        return await self._call("release", self.inner.release(leases=leases))

    async def reap(
        self,
        *,
        type_names: Sequence[str],
        exclude_worker: str,
        limit: int = 1,
        dead_workers: Sequence[str] = (),
        held: Sequence[UUID] | None = None,
    ) -> list[ReapedJob]:
        return await self._call(
            "reap",
            self.inner.reap(
                type_names=type_names,
                exclude_worker=exclude_worker,
                limit=limit,
                dead_workers=dead_workers,
                held=held,
            ),
        )

    async def get_jobs(
        self, tx: TransactionHandle | None, *, job_ids: Sequence[UUID]
    ) -> list[Job[Any]]:
        return await self._call("get_jobs", self.inner.get_jobs(tx, job_ids=job_ids))

    async def get_chains(
        self, tx: TransactionHandle | None, *, chain_ids: Sequence[UUID]
    ) -> list[Chain]:
        return await self._call("get_chains", self.inner.get_chains(tx, chain_ids=chain_ids))

    async def list_chain_jobs(
        self, tx: TransactionHandle | None, *, chain_id: UUID
    ) -> list[Job[Any]]:
        return await self._call(
            "list_chain_jobs", self.inner.list_chain_jobs(tx, chain_id=chain_id)
        )

    # --- chain orchestration -------------------------------------------------------------

    async def resolve_dependants(
        self, tx: TransactionHandle | None, *, chain_ids: Sequence[UUID]
    ) -> Resolution:
        return await self._call(
            "resolve_dependants", self.inner.resolve_dependants(tx, chain_ids=chain_ids)
        )

    async def sweep_blocked(self, *, limit: int = 100) -> Resolution:
        return await self._call("sweep_blocked", self.inner.sweep_blocked(limit=limit))

    async def blocker_outputs(
        self, tx: TransactionHandle | None, *, job_id: UUID
    ) -> list[BlockerOutput]:
        return await self._call("blocker_outputs", self.inner.blocker_outputs(tx, job_id=job_id))

    async def chains_of(
        self, tx: TransactionHandle | None, *, ids: Sequence[UUID]
    ) -> list[ChainRef]:
        return await self._call("chains_of", self.inner.chains_of(tx, ids=ids))

    async def cancel_chains(
        self, tx: TransactionHandle, *, chain_ids: Sequence[UUID]
    ) -> tuple[list[CancelledChain], Resolution]:
        return await self._call("cancel_chains", self.inner.cancel_chains(tx, chain_ids=chain_ids))

    async def retry_failed(
        self, tx: TransactionHandle, *, job_ids: Sequence[UUID], front: bool
    ) -> list[tuple[UUID, str]]:
        return await self._call(
            "retry_failed", self.inner.retry_failed(tx, job_ids=job_ids, front=front)
        )

    async def trigger(self, tx: TransactionHandle, *, job_ids: Sequence[UUID]) -> list[str]:
        return await self._call("trigger", self.inner.trigger(tx, job_ids=job_ids))

    async def set_queue_paused(
        self, tx: TransactionHandle | None, *, queue: str, paused: bool
    ) -> None:
        await self._call(
            "set_queue_paused", self.inner.set_queue_paused(tx, queue=queue, paused=paused)
        )

    async def mark_chain_awaited(self, *, chain_id: UUID) -> None:
        await self._call("mark_chain_awaited", self.inner.mark_chain_awaited(chain_id=chain_id))

    async def now(self) -> datetime:
        return await self._call("now", self.inner.now())

    # --- queries, deletion and retention -----------------------------------------------

    async def list_jobs(
        self,
        tx: TransactionHandle | None,
        *,
        where: JobFilter,
        after: PageKey | None,
        limit: int,
    ) -> list[Job[Any]]:
        return await self._call(
            "list_jobs", self.inner.list_jobs(tx, where=where, after=after, limit=limit)
        )

    async def list_chains(
        self,
        tx: TransactionHandle | None,
        *,
        where: ChainFilter,
        after: PageKey | None,
        limit: int,
    ) -> list[Chain]:
        return await self._call(
            "list_chains", self.inner.list_chains(tx, where=where, after=after, limit=limit)
        )

    async def list_blocked_jobs(
        self, tx: TransactionHandle | None, *, after: PageKey | None, limit: int
    ) -> list[BlockedJob]:
        return await self._call(
            "list_blocked_jobs", self.inner.list_blocked_jobs(tx, after=after, limit=limit)
        )

    async def count_jobs(self, tx: TransactionHandle | None) -> list[QueueCount]:
        return await self._call("count_jobs", self.inner.count_jobs(tx))

    async def delete_chains(
        self, tx: TransactionHandle, *, chain_ids: Sequence[UUID], cascade: bool
    ) -> ChainDeletion:
        return await self._call(
            "delete_chains", self.inner.delete_chains(tx, chain_ids=chain_ids, cascade=cascade)
        )

    async def delete_expired_chains(self, *, retention: Mapping[str, timedelta], limit: int) -> int:
        return await self._call(
            "delete_expired_chains",
            self.inner.delete_expired_chains(retention=retention, limit=limit),
        )

    # --- operator reads (dashboard) -------------------------------------------------------

    async def recent_activity(
        self,
        tx: TransactionHandle | None,
        *,
        window: timedelta,
        bucket: timedelta,
        sample_size: int,
    ) -> RecentActivity:
        return await self._call(
            "recent_activity",
            self.inner.recent_activity(tx, window=window, bucket=bucket, sample_size=sample_size),
        )

    async def chain_links(
        self, tx: TransactionHandle | None, *, chain_id: UUID, limit: int
    ) -> ChainLinks:
        return await self._call(
            "chain_links", self.inner.chain_links(tx, chain_id=chain_id, limit=limit)
        )

    async def list_work(
        self,
        tx: TransactionHandle | None,
        *,
        where: WorkFilter,
        after: PageKey | None,
        oldest_first: bool,
        limit: int,
    ) -> list[Job[Any]]:
        return await self._call(
            "list_work",
            self.inner.list_work(
                tx, where=where, after=after, oldest_first=oldest_first, limit=limit
            ),
        )

    async def running_by_worker(
        self, tx: TransactionHandle | None, *, per_worker: int
    ) -> list[WorkerJobs]:
        return await self._call(
            "running_by_worker", self.inner.running_by_worker(tx, per_worker=per_worker)
        )

    async def pending_types(
        self, tx: TransactionHandle | None, *, sample: int
    ) -> list[PendingType]:
        return await self._call("pending_types", self.inner.pending_types(tx, sample=sample))

    async def error_groups(
        self, tx: TransactionHandle | None, *, sample: int, limit: int
    ) -> list[ErrorGroup]:
        return await self._call(
            "error_groups", self.inner.error_groups(tx, sample=sample, limit=limit)
        )

    async def jobs_in_id_range(
        self, tx: TransactionHandle | None, *, low: UUID, high: UUID, limit: int
    ) -> list[Job[Any]]:
        return await self._call(
            "jobs_in_id_range",
            self.inner.jobs_in_id_range(tx, low=low, high=high, limit=limit),
        )

    async def scan_input(
        self,
        tx: TransactionHandle | None,
        *,
        match: InputMatch,
        before: PageKey | None,
        examine: int,
        limit: int,
    ) -> InputScan:
        return await self._call(
            "scan_input",
            self.inner.scan_input(tx, match=match, before=before, examine=examine, limit=limit),
        )

    # --- the job history -----------------------------------------------------------------

    async def roll_up_history(
        self, *, limit: int, keep: timedelta, max_lag: timedelta
    ) -> HistoryRollup:
        return await self._call(
            "roll_up_history",
            self.inner.roll_up_history(limit=limit, keep=keep, max_lag=max_lag),
        )

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
        return await self._call(
            "job_history",
            self.inner.job_history(
                tx,
                window=window,
                resolution=resolution,
                step=step,
                group_resolution=group_resolution,
                queue=queue,
                type_name=type_name,
            ),
        )

    # --- worker registry -----------------------------------------------------------------

    async def register_worker(self, *, worker: WorkerInfo) -> None:
        await self._call("register_worker", self.inner.register_worker(worker=worker))

    async def heartbeat(
        self, *, worker_id: str, active_slots: int, status: str, abandoned_handlers: int = 0
    ) -> bool:
        return await self._call(
            "heartbeat",
            self.inner.heartbeat(
                worker_id=worker_id,
                active_slots=active_slots,
                status=status,
                abandoned_handlers=abandoned_handlers,
            ),
        )

    async def find_dead_workers(self, *, older_than_s: float, exclude: str) -> list[str]:
        return await self._call(
            "find_dead_workers",
            self.inner.find_dead_workers(older_than_s=older_than_s, exclude=exclude),
        )

    async def prune_workers(self, *, stopped_for_s: float, limit: int = 1000) -> int:
        return await self._call(
            "prune_workers", self.inner.prune_workers(stopped_for_s=stopped_for_s, limit=limit)
        )

    async def list_workers(self, *, alive_within_s: float) -> list[WorkerRecord]:
        return await self._call(
            "list_workers", self.inner.list_workers(alive_within_s=alive_within_s)
        )

    def __repr__(self) -> str:
        return f"InstrumentedStateAdapter({self.inner!r})"


def _conforms(adapter: InstrumentedStateAdapter) -> StateAdapter:
    """mypy checks here that the wrapper still satisfies the whole protocol."""
    return adapter
