"""The in-process worker: one main loop feeding a fixed number of slots.

Each turn of the loop (1) reaps at most one expired lease of a type this worker
handles, (2) fills every free slot with ONE acquire statement, and (3) waits for the
first of: a notification, the poll interval, a slot finishing. Slots run in an anyio
task group; a side task renews staged leases, another listens for notifications.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import anyio
import anyio.abc

from pgwork.adapters.notify import Listener, Notice
from pgwork.adapters.state import AcquiredJob, Completion, Failure, Lease, WorkerInfo
from pgwork.backoff import backoff_delay
from pgwork.client import Client
from pgwork.errors import ConfigurationError, PgworkError, WorkerStateError
from pgwork.job_types import JobType
from pgwork.middleware import CallNext, Middleware, compose
from pgwork.observability import (
    ATTEMPT_ABORTED,
    ATTEMPT_COMPLETED,
    ATTEMPT_FAILED,
    ATTEMPT_RETRIED,
    ATTEMPT_STARTED,
    JOB_REAPED,
    LEASE_LOST,
    LISTENER_RECONNECTED,
    WORKER_STARTED,
    WORKER_STOPPED,
    Observer,
)
from pgwork.observability._events import Emitter
from pgwork.records import AbortReason, Job, JobStatus
from pgwork.schedules import CronSchedule
from pgwork.worker._attempt import Attempt, Completed, Rescheduled, error_record
from pgwork.worker._batch import CompletionBatcher
from pgwork.worker._heartbeat import Heartbeat
from pgwork.worker._lease import renew_forever
from pgwork.worker._maintenance import Maintenance

log = logging.getLogger("pgwork.worker")

__all__ = ["Handler", "InProcessWorker"]

Handler = Callable[[Attempt[Any, Any]], Awaitable[Any]]

# While no expired lease is found, the loop looks for one at most this often (seconds).
REAP_INTERVAL = 0.5

# Failed loop turns (database unreachable) back off up to this many seconds.
LOOP_BACKOFF_MAX = 5.0


class _Rollback(Exception):
    """Leaves an atomic attempt's transaction without committing the handler's writes."""


class _Slot:
    """One running attempt's bookkeeping; also the renewer's LeaseHolder."""

    __slots__ = ("acquired", "attempt", "job_type", "lease_deadline", "pending_abort", "started")

    def __init__(self, acquired: AcquiredJob, job_type: JobType[Any, Any]) -> None:
        self.acquired = acquired
        self.job_type = job_type
        self.attempt: Attempt[Any, Any] | None = None
        self.pending_abort: AbortReason | None = None
        self.lease_deadline = time.monotonic() + job_type.lease.total_seconds()
        self.started = time.monotonic()

    @property
    def lease(self) -> Lease:
        return self.acquired.lease

    @property
    def lease_duration(self) -> timedelta:
        return self.job_type.lease

    @property
    def staged(self) -> bool:
        return self.job_type.mode == "staged"

    def renewed(self, deadline: float) -> None:
        self.lease_deadline = deadline

    def abort(self, reason: AbortReason) -> None:
        if self.attempt is not None:
            self.attempt.abort(reason)
        elif self.pending_abort is None:
            self.pending_abort = reason


class InProcessWorker:
    """Runs handlers for the job types in ``processors``. Create with
    ``create_in_process_worker``; run with ``async with worker:``, ``stop = await
    worker.start()`` or ``await worker.run()`` (until ``stop()``)."""

    def __init__(
        self,
        *,
        client: Client,
        processors: Mapping[JobType[Any, Any] | str, Handler],
        max_slots: int,
        worker_id: str | None,
        poll_interval: float,
        queues: Sequence[str] | None,
        middlewares: Sequence[Middleware],
        grace_period: float,
        rng: random.Random | None,
        observers: Sequence[Observer] | None = None,
        schedules: Sequence[CronSchedule[Any]] = (),
        heartbeat_interval: float = 5.0,
        dead_worker_after: float = 30.0,
    ) -> None:
        if max_slots < 1:
            raise ConfigurationError(f"max_slots must be >= 1, got {max_slots}")
        if poll_interval <= 0:
            raise ConfigurationError(f"poll_interval must be positive, got {poll_interval}")
        if grace_period < 0:
            raise ConfigurationError(f"grace_period must not be negative, got {grace_period}")
        if not processors:
            raise ConfigurationError("processors is empty: give at least one {job_type: handler}")
        self.client = client
        self.state = client.state
        self.notify = client.notify
        self.worker_id = worker_id or default_worker_id()
        self.max_slots = max_slots
        self.poll_interval = poll_interval
        self.grace_period = grace_period
        self.middlewares = tuple(middlewares)
        self._rng = rng or random.Random()
        for schedule in schedules:
            client.registry.entry(schedule.job_type)
        names = [schedule.name for schedule in schedules]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"schedule names must be unique, got {names}")
        self._maintenance = Maintenance(client, schedules)
        self._batcher = CompletionBatcher(client.state, in_flight=lambda: len(self._slots))
        self._last_reap = -REAP_INTERVAL
        self._events = Emitter(client.observers if observers is None else observers)
        self._drain_scope: anyio.CancelScope | None = None
        self._types: dict[str, JobType[Any, Any]] = {}
        self._handlers: dict[str, CallNext] = {}
        for key, handler in processors.items():
            job_type = client.registry.resolve(key)
            self._types[job_type.name] = job_type
            self._handlers[job_type.name] = compose(self.middlewares, handler)
        self.queues: tuple[str, ...] = (
            tuple(queues) if queues else tuple(dict.fromkeys(t.queue for t in self._types.values()))
        )
        self._leases = {name: t.lease for name, t in self._types.items()}
        self._slots: dict[Any, _Slot] = {}
        self._wake = anyio.Event()
        self._stop_requested = anyio.Event()
        self._running = anyio.Event()
        self._stopped = anyio.Event()
        self._phase = "new"
        self._startup_error: BaseException | None = None
        self._task: Any = None
        self._heartbeat = Heartbeat(
            client.state,
            WorkerInfo(
                id=self.worker_id,
                host=socket.gethostname(),
                pid=os.getpid(),
                queues=self.queues,
                job_types=tuple(self._types),
                max_slots=max_slots,
            ),
            interval=heartbeat_interval,
            dead_after=dead_worker_after,
            status=self._status,
            on_reclaimed=self._wake_up,
        )

    # --- lifecycle ---------------------------------------------------------------------

    def _status(self) -> tuple[str, int]:
        """What the heartbeat reports: status and active slots."""
        if self._stop_requested.is_set():
            return "stopping", len(self._slots)
        return ("busy" if self._slots else "idle"), len(self._slots)

    def _wake_up(self) -> None:
        self._wake.set()

    @property
    def active_slots(self) -> int:
        return len(self._slots)

    @property
    def job_types(self) -> tuple[str, ...]:
        return tuple(self._types)

    async def run(self) -> None:
        """Work until ``stop()``; returns after in-flight attempts are settled."""
        if self._phase != "new":
            raise WorkerStateError(f"worker {self.worker_id} was already started ({self._phase})")
        self._phase = "running"
        try:
            await self._heartbeat.register()
            async with self.notify.listen() as listener, anyio.create_task_group() as side:
                side.start_soon(self._listen, listener)
                side.start_soon(renew_forever, self.state, self._staged_holders)
                side.start_soon(self._maintenance.run_forever)
                side.start_soon(self._heartbeat.run_forever)
                side.start_soon(self._batcher.run_forever)
                self._running.set()
                self._events.emit(
                    WORKER_STARTED,
                    worker_id=self.worker_id,
                    job_types=tuple(self._types),
                    queues=self.queues,
                    max_slots=self.max_slots,
                )
                try:
                    await self._main_loop()
                finally:
                    side.cancel_scope.cancel()
                    with anyio.CancelScope(shield=True):
                        await self._heartbeat.stopped()
        except BaseException as exc:
            self._startup_error = exc
            raise
        finally:
            self._phase = "stopped"
            self._running.set()
            self._stopped.set()
            error = self._startup_error
            self._events.emit(
                WORKER_STOPPED,
                worker_id=self.worker_id,
                error=repr(error) if isinstance(error, Exception) else None,
            )

    async def start(self) -> Callable[[], Awaitable[None]]:
        """Run the worker in the background (asyncio) and return its ``stop``.

        Returns once the worker is listening, so a job enqueued afterwards wakes it;
        raises what stopped it from starting (e.g. the database is unreachable).
        """
        import asyncio

        if self._phase != "new" or self._task is not None:
            raise WorkerStateError(f"worker {self.worker_id} was already started")
        self._task = asyncio.get_running_loop().create_task(
            self.run(), name=f"pgwork-worker-{self.worker_id}"
        )
        await self._running.wait()
        if self._task.done() and self._task.exception() is not None:
            raise self._task.exception()
        return self.stop

    async def stop(self, *, grace_period: float | timedelta | None = None) -> None:
        """Stop taking jobs, let in-flight attempts finish within the grace period, then
        abort the rest and hand their jobs back without burning an attempt. Safe to call
        twice and before start; returns when the worker has stopped.

        ``grace_period`` shortens the worker's own for this stop, also for a stop already
        in progress: ``stop(grace_period=0)`` aborts in-flight attempts at once (what a
        second Ctrl-C does in ``pgwork worker``)."""
        if grace_period is not None:
            self._hurry(
                grace_period.total_seconds()
                if isinstance(grace_period, timedelta)
                else float(grace_period)
            )
        self._stop_requested.set()
        self._wake.set()
        if self._phase == "new":
            self._phase = "stopped"
            self._stopped.set()
            return
        await self._stopped.wait()
        task, self._task = self._task, None
        if task is not None:
            try:
                await task
            except Exception as exc:
                log.error("pgwork worker %s ended with an error: %r", self.worker_id, exc)

    def _hurry(self, grace_period: float) -> None:
        self.grace_period = min(self.grace_period, max(grace_period, 0.0))
        if self._drain_scope is not None:
            deadline = anyio.current_time() + self.grace_period
            self._drain_scope.deadline = min(self._drain_scope.deadline, deadline)

    async def __aenter__(self) -> InProcessWorker:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # --- main loop ---------------------------------------------------------------------

    async def _main_loop(self) -> None:
        failures = 0
        async with anyio.create_task_group() as slots:
            while not self._stop_requested.is_set():
                self._wake = anyio.Event()
                try:
                    await self._reap()
                    await self._fill(slots)
                    failures = 0
                except PgworkError:
                    raise  # configuration/schema problems do not heal by retrying
                except Exception as exc:
                    failures += 1
                    delay = min(LOOP_BACKOFF_MAX, 0.05 * 2**failures) * self._rng.uniform(0.8, 1.2)
                    log.warning(
                        "pgwork worker %s turn failed (%r); retrying in %.2fs",
                        self.worker_id,
                        exc,
                        delay,
                    )
                    with anyio.move_on_after(delay):
                        await self._stop_requested.wait()
                    continue
                with anyio.move_on_after(self.poll_interval):
                    await self._wake.wait()
            await self._drain()

    async def _reap(self) -> None:
        # At most one per turn, and only every REAP_INTERVAL while nothing is found:
        # under load turns come every few milliseconds and expired leases are rare.
        now = time.monotonic()
        if now - self._last_reap < REAP_INTERVAL:
            return
        reaped = await self.state.reap(
            type_names=list(self._types), exclude_worker=self.worker_id, limit=1
        )
        self._last_reap = -REAP_INTERVAL if reaped else now
        for job in reaped:
            self._events.emit(
                JOB_REAPED,
                job_id=job.job_id,
                job_type=job.type_name,
                attempt=job.attempt,
                status=job.status.value,
                previous_worker=job.leased_by,
                worker_id=self.worker_id,
            )

    async def _fill(self, slots: anyio.abc.TaskGroup) -> None:
        free = self.max_slots - len(self._slots)
        if free <= 0 or not self._heartbeat.healthy:
            return
        acquired = await self.state.acquire(
            worker_id=self.worker_id, leases=self._leases, queues=self.queues, limit=free
        )
        for job in acquired:
            slot = _Slot(job, self._types[job.type_name])
            # Keyed by lease token: the same job can come back to this worker (reaped,
            # then re-acquired) while a stale attempt on it is still being aborted.
            self._slots[job.lease_token] = slot
            slots.start_soon(self._run_slot, slot, name=f"pgwork-slot-{job.id}")

    async def _drain(self) -> None:
        """Graceful stop: wait up to the grace period, then abort what still runs."""
        with anyio.move_on_after(self.grace_period) as self._drain_scope:
            while self._slots:
                self._wake = anyio.Event()
                await self._wake.wait()
        for slot in list(self._slots.values()):
            slot.abort(AbortReason.WORKER_STOPPING)

    def _staged_holders(self) -> list[_Slot]:
        return [s for s in self._slots.values() if s.staged and s.attempt is not None]

    async def _listen(self, listener: Listener) -> None:
        failures = 0
        while True:
            try:
                notices = await listener.wait(self.poll_interval)
                failures = 0
            except Exception as exc:
                failures += 1
                log.warning("pgwork listener failed (%r)", exc)
                await anyio.sleep(min(LOOP_BACKOFF_MAX, 0.1 * 2**failures))
                continue
            for notice in notices:
                self._on_notice(notice)

    def _on_notice(self, notice: Notice) -> None:
        if (
            notice.kind == "ready" and (notice.queue is None or notice.queue in self.queues)
        ) or notice.kind == "reconnected":
            self._wake.set()
            if notice.kind == "reconnected":
                self._events.emit(LISTENER_RECONNECTED, worker_id=self.worker_id)
        elif notice.kind == "abort":
            reason = AbortReason(notice.reason or AbortReason.OWNERSHIP_LOST)
            for slot in list(self._slots.values()):
                if slot.acquired.id == notice.job_id:
                    slot.abort(reason)

    # --- one slot ----------------------------------------------------------------------

    async def _run_slot(self, slot: _Slot) -> None:
        try:
            if slot.job_type.mode == "atomic":
                await self._run_atomic(slot)
            else:
                await self._run_staged(slot)
        except Exception as exc:
            log.exception(
                "pgwork worker %s: unexpected error settling job %s",
                self.worker_id,
                slot.acquired.id,
            )
            record = error_record(exc)
            self._emit(
                ATTEMPT_FAILED,
                slot,
                error_type=record.type,
                error_message=record.message,
                settled=False,
            )
        finally:
            self._slots.pop(slot.acquired.lease_token, None)
            self._wake.set()

    def _attempt(
        self, slot: _Slot, transaction: object | None
    ) -> tuple[Attempt[Any, Any] | None, BaseException | None]:
        """Build the handler's Attempt, or return why the stored input cannot be decoded
        (that fails the job at once: retrying cannot fix it)."""
        acquired = slot.acquired
        try:
            job_input = slot.job_type.input_codec.decode(acquired.input)
        except PgworkError as exc:
            return None, exc
        job: Job[Any] = Job(
            id=acquired.id,
            type_name=acquired.type_name,
            chain_id=acquired.chain_id,
            chain_type_name=acquired.chain_type_name,
            chain_index=acquired.chain_index,
            input=job_input,
            output=None,
            status=JobStatus.RUNNING,
            queue=acquired.queue,
            priority=acquired.priority,
            created_at=acquired.created_at,
            scheduled_at=acquired.scheduled_at,
            started_at=None,
            completed_at=None,
            attempt=acquired.attempt,
            max_attempts=acquired.max_attempts,
            last_attempt_error=acquired.last_attempt_error,
            last_attempt_at=None,
            leased_by=self.worker_id,
            leased_until=acquired.leased_until,
        )
        attempt = Attempt(
            job=job,
            job_type=slot.job_type,
            acquired=acquired,
            worker_id=self.worker_id,
            registry=self.client.registry,
            max_payload_bytes=self.client.max_payload_bytes,
            transaction=transaction,
            state=self.state,
        )
        slot.attempt = attempt
        if slot.pending_abort is not None:
            attempt.abort(slot.pending_abort)
        return attempt, None

    async def _call_handler(
        self, slot: _Slot, attempt: Attempt[Any, Any], timeout: timedelta | None
    ) -> BaseException | None:
        """Run the handler through the middlewares; return the exception it ended with
        (a deadline overrun is a ``TimeoutError``). An abort returns None with
        ``attempt.abort_reason`` set."""
        handler = self._handlers[slot.job_type.name]
        slot.started = time.monotonic()
        acquired = slot.acquired
        self._emit(
            ATTEMPT_STARTED,
            slot,
            duration=False,
            mode=slot.job_type.mode,
            queued_s=(
                acquired.leased_until - slot.job_type.lease - acquired.scheduled_at
            ).total_seconds(),
            trace_context=acquired.trace_context,
        )
        with attempt.cancel_scope:
            try:
                if timeout is not None:
                    with anyio.fail_after(timeout.total_seconds()):
                        result = await handler(attempt)
                else:
                    result = await handler(attempt)
                await attempt._finish_with(result)
            except Exception as exc:
                return exc
        return None

    async def _run_staged(self, slot: _Slot) -> None:
        attempt, decode_error = self._attempt(slot, None)
        if attempt is None:
            with anyio.CancelScope(shield=True):
                await self._settle_failure(slot, decode_error, terminal=True)
            return
        error = await self._call_handler(slot, attempt, slot.job_type.timeout)
        with anyio.CancelScope(shield=True):
            await self._settle(slot, attempt, error)

    async def _run_atomic(self, slot: _Slot) -> None:
        """Run the handler inside one transaction that holds the job's row lock; the
        handler's writes commit with the completion or not at all."""
        # Atomic attempts pin a row lock, so they always have a deadline.
        deadline = slot.job_type.timeout or slot.job_type.lease
        attempt: Attempt[Any, Any] | None = None
        failure: BaseException | None = None
        try:
            async with self.state.transaction() as tx:
                if not await self.state.begin_atomic(tx, lease=slot.lease, deadline=deadline):
                    log.warning(
                        "pgwork job %s was taken from this worker before it started",
                        slot.acquired.id,
                    )
                    return
                attempt, failure = self._attempt(slot, tx)
                if attempt is None:
                    raise _Rollback
                failure = await self._call_handler(slot, attempt, deadline)
                if failure is not None or attempt.aborted:
                    raise _Rollback
                with anyio.CancelScope(shield=True):
                    written = await self._write_outcome(slot, attempt, tx)
            self._report_outcome(slot, attempt, written)  # after the commit
            return
        except _Rollback:
            pass
        # The handler's writes were rolled back; record what happened on its own.
        with anyio.CancelScope(shield=True):
            if attempt is None:
                await self._settle_failure(slot, failure, terminal=True)
            else:
                await self._settle(slot, attempt, failure)

    # --- settling an attempt -----------------------------------------------------------

    async def _settle(
        self, slot: _Slot, attempt: Attempt[Any, Any], error: BaseException | None
    ) -> None:
        reason = attempt.abort_reason
        if reason is AbortReason.WORKER_STOPPING:
            released = await self.state.release(leases=[slot.lease])
            self._emit(ATTEMPT_ABORTED, slot, reason=reason.value, released=bool(released))
            return
        if reason is not None:
            self._emit(ATTEMPT_ABORTED, slot, reason=reason.value, released=False)
            if reason in (AbortReason.OWNERSHIP_LOST, AbortReason.COMPLETED_ELSEWHERE):
                self._emit(LEASE_LOST, slot, duration=False, action="renewal")
            return
        if error is not None:
            await self._settle_failure(slot, error, terminal=False)
            return
        self._report_outcome(slot, attempt, await self._write_outcome(slot, attempt, None))

    def _emit(self, name: str, slot: _Slot, *, duration: bool = True, **fields: Any) -> None:
        """Emit an attempt event with the attempt's identity (and duration) filled in."""
        if not self._events:
            return
        acquired = slot.acquired
        self._events.emit(
            name,
            job_id=acquired.id,
            chain_id=acquired.chain_id,
            job_type=acquired.type_name,
            queue=acquired.queue,
            attempt=acquired.attempt,
            max_attempts=acquired.max_attempts,
            worker_id=self.worker_id,
            lease_token=acquired.lease_token,
            **({"duration_s": time.monotonic() - slot.started} if duration else {}),
            **fields,
        )

    def _report_outcome(self, slot: _Slot, attempt: Attempt[Any, Any], written: bool) -> None:
        outcome = attempt.outcome
        if not written:
            self._emit(LEASE_LOST, slot, duration=False, action="completion")
        elif isinstance(outcome, Completed) and outcome.continuation is not None:
            self._emit(
                ATTEMPT_COMPLETED,
                slot,
                outcome="continued",
                continued_with=outcome.continuation.type_name,
            )
        else:
            kind = "rescheduled" if isinstance(outcome, Rescheduled) else "completed"
            self._emit(ATTEMPT_COMPLETED, slot, outcome=kind, continued_with=None)

    async def _write_outcome(self, slot: _Slot, attempt: Attempt[Any, Any], tx: Any | None) -> bool:
        """Write the handler's outcome; False when the lease no longer held."""
        outcome = attempt.outcome
        lease = slot.lease
        if isinstance(outcome, Rescheduled):
            ok = await self.state.reschedule(
                tx,
                lease=lease,
                run_at=outcome.run_at,
                run_after=outcome.run_after,
                count_attempt=False,
            )
        elif isinstance(outcome, Completed):
            completion = Completion(
                job_id=lease.job_id,
                lease_token=lease.lease_token,
                output_json=outcome.output_json,
                continuation=outcome.continuation,
            )
            ok = await self._complete(completion, slot.acquired.chain_id, tx)
        else:  # pragma: no cover - _finish_with always sets an outcome
            raise AssertionError("attempt finished without an outcome")
        return ok

    async def _complete(self, completion: Completion, chain_id: Any, tx: Any | None) -> bool:
        """Write a completion and announce what it made ready (continuation, unblocked
        dependants) and, for an awaited chain, its end — in ``tx`` when there is one
        (delivered on commit), else right after the autocommitted write."""
        if tx is None and completion.continuation is not None:
            async with self.state.transaction() as own:
                return await self._complete(completion, chain_id, own)
        if tx is None:
            result = await self._batcher.complete(completion)
        else:
            result = (await self.state.complete(tx, completions=[completion]))[0]
        notices = [Notice(kind="ready", queue=q) for q in result.ready_queues]
        if result.chain_awaited:
            notices.append(Notice(kind="chain_done", chain_id=chain_id))
        if notices:
            await self.notify.publish(tx, notices=notices)
        return result.accepted

    async def _settle_failure(
        self, slot: _Slot, error: BaseException | None, *, terminal: bool
    ) -> None:
        error = error or RuntimeError("attempt failed without an exception")
        acquired = slot.acquired
        terminal = terminal or acquired.attempt >= acquired.max_attempts
        retry_after = (
            None if terminal else backoff_delay(acquired.attempt, slot.job_type.retry, self._rng)
        )
        record = error_record(error)
        accepted = await self.state.fail(
            None,
            failures=[Failure(acquired.id, acquired.lease_token, record, retry_after)],
        )
        if not accepted[0]:
            self._emit(LEASE_LOST, slot, action="failure")
        elif terminal:
            self._emit(
                ATTEMPT_FAILED,
                slot,
                error_type=record.type,
                error_message=record.message,
                settled=True,
            )
        else:
            self._emit(
                ATTEMPT_RETRIED,
                slot,
                error_type=record.type,
                error_message=record.message,
                retry_in_s=retry_after.total_seconds() if retry_after else 0.0,
            )


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{random.randbytes(2).hex()}"
