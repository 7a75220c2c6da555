"""The in-process worker: one main loop feeding a fixed number of slots.

Each turn of the loop (1) reaps at most one expired lease of a type this worker
handles, (2) starts ONE acquire statement for every free slot (it runs beside the loop
and carries the finished jobs' completions, see ``_fetch``), and (3) waits for the
first of: a notification, the poll interval, a handler returning, an acquire coming
back. A staged slot is free once its handler returns; at most ``2 * max_slots``
attempts are unsettled. Each attempt runs in a task the worker owns (``_slot_tasks``);
side tasks renew staged leases, listen for notifications, send heartbeats and run
maintenance.
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
from pgwork.adapters.state import AcquiredJob, Lease, WorkerInfo
from pgwork.client import Client
from pgwork.errors import ConfigurationError, PgworkError, WorkerStateError
from pgwork.job_types import JobType
from pgwork.middleware import CallNext, Middleware, compose
from pgwork.observability import (
    ATTEMPT_FAILED,
    JOB_REAPED,
    LISTENER_RECONNECTED,
    WORKER_STARTED,
    WORKER_STOPPED,
    Observer,
)
from pgwork.observability._events import Emitter
from pgwork.records import AbortReason
from pgwork.schedules import CronSchedule
from pgwork.worker._admission import Admission
from pgwork.worker._attempt import Attempt, error_record
from pgwork.worker._batch import CompletionBatcher
from pgwork.worker._fetch import Fetcher
from pgwork.worker._heartbeat import Heartbeat
from pgwork.worker._lease import renew_forever
from pgwork.worker._maintenance import Maintenance
from pgwork.worker._slot import Slot, SlotRunner
from pgwork.worker._slot_tasks import SlotTasks
from pgwork.worker._watchdog import Watchdog, keep_abandoned

log = logging.getLogger("pgwork.worker")

__all__ = ["Handler", "InProcessWorker"]

Handler = Callable[[Attempt[Any, Any]], Awaitable[Any]]

# While no expired lease is found, the loop looks for one at most this often (seconds).
REAP_INTERVAL = 0.5

# Failed loop turns (database unreachable) back off up to this many seconds.
LOOP_BACKOFF_MAX = 5.0


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
        abandon_after: float = 5.0,
        prefetch: int | None = None,
    ) -> None:
        if max_slots < 1:
            raise ConfigurationError(f"max_slots must be >= 1, got {max_slots}")
        if poll_interval <= 0:
            raise ConfigurationError(f"poll_interval must be positive, got {poll_interval}")
        if grace_period < 0:
            raise ConfigurationError(f"grace_period must not be negative, got {grace_period}")
        if abandon_after < 0:
            raise ConfigurationError(f"abandon_after must not be negative, got {abandon_after}")
        if prefetch is not None and prefetch < 0:
            raise ConfigurationError(f"prefetch must not be negative, got {prefetch}")
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
        self._admission: Admission[Slot] = Admission(
            max_slots=max_slots, prefetch=prefetch, start=self._launch
        )
        # Staged slots count as free once their handler returns; at most this many
        # jobs may be unsettled (prefetched, handler running or outcome not yet
        # durable), so writing one batch of outcomes overlaps acquiring and running the
        # next.
        self._max_unsettled = 2 * (max_slots + self._admission.most_prefetched)
        self._batcher = CompletionBatcher(client.state)
        self._last_reap = -REAP_INTERVAL
        self._unsettled: list[Lease] = []
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
        self._queue_rank = {name: rank for rank, name in enumerate(self.queues)}
        self._slots: dict[Any, Slot] = {}
        self._wake = anyio.Event()
        # Set (and replaced) each time the main loop decided whether to acquire, and
        # how many acquires had come back then; cleared when the loop stops filling.
        self._filled = anyio.Event()
        self._decided_after = 0
        self._filling = True
        self._group: anyio.abc.TaskGroup | None = None
        self._stop_requested = anyio.Event()
        self._running = anyio.Event()
        self._stopped = anyio.Event()
        self._phase = "new"
        self._startup_error: BaseException | None = None
        self._task: Any = None
        self._slot_tasks = SlotTasks()
        self._fetcher = Fetcher(
            state=client.state,
            batcher=self._batcher,
            worker_id=self.worker_id,
            leases=self._leases,
            queues=self.queues,
            arrived=self._start_slots,
            back=self._refill,
            done=self._wake_up,
        )
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
        self._batcher.hold = self._hold_completions
        self._watchdog: Watchdog[Slot] = Watchdog(self._slots.values, self._abandon)
        self._runner = SlotRunner(
            client=client,
            worker_id=self.worker_id,
            handlers=self._handlers,
            batcher=self._batcher,
            events=self._events,
            rng=self._rng,
            abandon_after=abandon_after,
            watchdog=self._watchdog,
            on_returned=self._handler_returned,
        )

    # --- lifecycle ---------------------------------------------------------------------

    def _status(self) -> tuple[str, int]:
        """What the heartbeat reports: status and active slots."""
        if self._stop_requested.is_set():
            return "stopping", len(self._slots)
        return ("busy" if self._slots else "idle"), len(self._slots)

    def _wake_up(self) -> None:
        self._wake.set()

    def _handler_returned(self, slot: Slot) -> None:
        self._admission.freed(slot, time.monotonic())
        self._wake.set()

    @property
    def active_slots(self) -> int:
        return len(self._slots)

    @property
    def abandoned_handlers(self) -> int:
        """Handlers this worker gave up on (they ignored cancellation) that still run."""
        return len(self._runner.abandoned)

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
                side.start_soon(self._renew_forever)
                side.start_soon(self._maintenance.run_forever)
                side.start_soon(self._heartbeat.run_forever)
                side.start_soon(self._batcher.run_forever)
                side.start_soon(self._watchdog.run_forever)
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
        try:
            await self._turns()
        finally:
            self._stop_filling()
            if self._slot_tasks:  # cancelled from outside: take the slots down with us
                stuck = await self._slot_tasks.cancel_and_wait(self._runner.abandon_after)
                for task in stuck:
                    keep_abandoned(task, self._runner.abandoned, "cancelled with its worker")

    async def _turns(self) -> None:
        failures = 0
        async with anyio.create_task_group() as self._group:
            while not self._stop_requested.is_set():
                self._wake = anyio.Event()
                try:
                    await self._release_unsettled()
                    await self._reap()
                    self._fill()
                    failures = 0
                except PgworkError:
                    raise  # configuration/schema problems do not heal by retrying
                except Exception as exc:
                    # A failed acquire surfaces a turn later, so its own count of
                    # failures in a row says how long the database has been away.
                    failures = max(failures + 1, self._fetcher.failures)
                    delay = min(LOOP_BACKOFF_MAX, 0.05 * 2**failures) * self._rng.uniform(0.8, 1.2)
                    log.warning(
                        "pgwork worker %s turn failed (%r); retrying in %.2fs",
                        self.worker_id,
                        exc,
                        delay,
                    )
                    # Cut short by stop() or by the listener coming back (the database
                    # is reachable again), so recovery does not wait out the backoff.
                    with anyio.move_on_after(delay):
                        await self._wake.wait()
                    continue
                with anyio.move_on_after(self.poll_interval):
                    await self._wake.wait()
            self._stop_filling()
            await self._drain()
            await self._slot_tasks.wait()

    async def _release_unsettled(self) -> None:
        """Give back jobs whose attempt ended while its outcome could not be written.

        Each goes back to the queue at once, fenced by its lease token (a job someone
        else took meanwhile is left alone), and the attempt still counts: the handler
        did run, and a job whose outcome can never be written must not retry forever.
        """
        if not self._unsettled:
            return
        leases, self._unsettled = self._unsettled, []
        handed_back = 0
        for position, lease in enumerate(leases):
            try:
                handed_back += await self.state.reschedule(
                    None, lease=lease, run_at=None, run_after=None, count_attempt=True
                )
            except Exception:
                self._unsettled.extend(leases[position:])
                raise
        log.warning(
            "pgwork worker %s handed back %d of %d job(s) whose outcome it could not write",
            self.worker_id,
            handed_back,
            len(leases),
        )

    async def _reap(self) -> None:
        # At most one per turn, and only every REAP_INTERVAL while nothing is found:
        # under load turns come every few milliseconds and expired leases are rare.
        now = time.monotonic()
        if now - self._last_reap < REAP_INTERVAL:
            return
        reaped = await self.state.reap(
            type_names=list(self._types),
            exclude_worker=self.worker_id,
            limit=1,
            held=list(self._slots),
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

    def _fill(self, incoming: int = 0) -> None:
        """Send an acquire if there is room; ``incoming`` jobs just acquired are about
        to take some of it."""
        try:
            if self._fetcher.error is not None:
                error, self._fetcher.error = self._fetcher.error, None
                raise error
            admission = self._admission
            free = min(admission.room(), self._max_unsettled - len(self._slots)) - incoming
            if free > 0 and self._heartbeat.healthy and self._group is not None:
                # Prefetching, one acquire at a time keeps the server busy enough; two
                # racing on the same rows cost it more than they gain.
                self._fetcher.fill(
                    self._group, free, max_in_flight=1 if admission.prefetching else 2
                )
        finally:
            self._decided_after = self._fetcher.finished
            self._filled.set()
            self._filled = anyio.Event()

    def _refill(self, incoming: int) -> None:
        """An acquire came back with ``incoming`` jobs: while prefetching, send the next
        one now rather than a loop turn later, after their handlers ran."""
        if (
            self._filling
            and self._admission.prefetching
            and self._fetcher.error is None  # the loop's own turn raises it
            and not self._stop_requested.is_set()
        ):
            self._fill(incoming)

    def _stop_filling(self) -> None:
        self._filling = False
        self._filled.set()

    async def _hold_completions(self) -> None:
        """Return once no acquire will take the waiting completions along: none is in
        flight, and the loop has decided (not) to send one since the last came back."""
        fetcher = self._fetcher
        while self._filling:
            if fetcher.in_flight:
                await fetcher.idle()
            elif self._decided_after >= fetcher.finished:
                return
            else:
                await self._filled.wait()

    async def _start_slots(self, acquired: list[AcquiredJob]) -> None:
        if self._stop_requested.is_set():
            # Arrived after stop(): hand them straight back, no attempt burned.
            await self.state.release(leases=[job.lease for job in acquired])
            return
        if len(acquired) > 1:
            # The statement returns its rows in no particular order; jobs that wait
            # for a slot must start in the queue's order.
            rank = self._queue_rank
            acquired.sort(key=lambda j: (rank.get(j.queue, 0), j.priority, j.scheduled_at))
        for job in acquired:
            slot = Slot(job, self._types[job.type_name])
            # Keyed by lease token: the same job can come back to this worker (reaped,
            # then re-acquired) while a stale attempt on it is still being aborted.
            self._slots[job.lease_token] = slot
            slot.watchdog = self._watchdog
            self._admission.arrived(slot)

    def _launch(self, slot: Slot) -> None:
        # A fixed name: formatting the job id into it cost more than the no-op job.
        slot.task = self._slot_tasks.start(self._run_slot(slot), name="pgwork-slot")

    def _abandon(self, slot: Slot) -> None:
        """The watchdog gave up on ``slot``'s handler: free the slot now, let the
        handler's task run on detached, and settle the attempt in a task of its own."""
        slot.abandoned = True
        if not slot.settling:
            slot.settling = True  # no longer renewed
            self._admission.freed(slot, time.monotonic())
        if slot.task is not None:
            self._slot_tasks.detach(slot.task)
            keep_abandoned(slot.task, self._runner.abandoned, f"of job {slot.acquired.id}")
        self._slot_tasks.start(self._run_slot(slot, abandoned=True), name="pgwork-abandoned")
        self._wake.set()

    async def _drain(self) -> None:
        """Graceful stop: hand prefetched jobs back, wait up to the grace period for
        the running ones, then abort what still runs."""
        with anyio.move_on_after(self.grace_period) as self._drain_scope:
            await self._fetcher.idle()
            await self._release_prefetched()
            while self._slots:
                self._wake = anyio.Event()
                await self._wake.wait()
        for slot in list(self._slots.values()):
            slot.abort(AbortReason.WORKER_STOPPING)

    async def _release_prefetched(self) -> None:
        waiting = self._admission.take_queued()
        for slot in waiting:
            self._slots.pop(slot.acquired.lease_token, None)
        if not waiting:
            return
        try:
            await self.state.release(leases=[slot.lease for slot in waiting])
        except Exception as exc:
            # Not lost: their leases expire and another worker reaps them.
            log.warning(
                "pgwork worker %s could not hand back %d prefetched job(s) (%r)",
                self.worker_id,
                len(waiting),
                exc,
            )

    async def _renew_forever(self) -> None:
        shortest = min(self._leases.values())
        await renew_forever(self.state, self._staged_holders, shortest_lease=shortest)

    def _staged_holders(self) -> list[Slot]:
        holders = [
            s for s in self._slots.values() if s.staged and s.attempt is not None and not s.settling
        ]
        # Prefetched jobs (of either mode) are leased too while they wait for a slot.
        holders.extend(self._admission.queued)
        return holders

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

    async def _run_slot(self, slot: Slot, *, abandoned: bool = False) -> None:
        """Run ``slot``'s attempt (or, ``abandoned``, settle it without its handler)
        and free the slot. The task of a handler given up on frees nothing when it
        ends at last: the task that settled its attempt did."""
        try:
            if abandoned:
                await self._runner.settle_abandoned(slot)
            else:
                await self._runner.run(slot)
        except Exception as exc:
            if slot.abandoned and not abandoned:
                return
            log.exception(
                "pgwork worker %s: unexpected error settling job %s",
                self.worker_id,
                slot.acquired.id,
            )
            record = error_record(exc)
            self._runner.emit(
                ATTEMPT_FAILED,
                slot,
                error_type=record.type,
                error_message=record.message,
                settled=False,
            )
            # Nothing could be written (the database went away): hand the job back as
            # soon as it is reachable again, instead of leaving it to a reaper.
            self._unsettled.append(slot.lease)
        finally:
            if abandoned or not slot.abandoned:
                if not slot.settling:
                    self._admission.freed(slot, time.monotonic())
                self._slots.pop(slot.acquired.lease_token, None)
                self._wake.set()


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{random.randbytes(2).hex()}"
