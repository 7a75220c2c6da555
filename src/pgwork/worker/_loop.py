"""The in-process worker: one main loop feeding a fixed number of slots.

The loop is ``InProcessWorker._turns``. Each turn (1) starts what the last acquires
brought (``_fetch``'s arrivals), (2) reaps at most one expired lease of a type this
worker handles (``_reaper``), (3) decides how many jobs to ask for, the free slots plus
prefetch room while handlers are short (``_admission``), and sends ONE acquire that
runs beside the loop and carries the finished jobs' completions (``_fetch``,
``_batch``), unless the last acquire found the queues drained and nothing has said
otherwise since (``_wakeups``), and (4) waits for the bell (``_bell``): a notification
(``_notices``), a slot freed, an acquire back, a job becoming due, or the poll
interval since the queues were found drained. The jobs the worker holds, and the task
each attempt runs in, are ``_slots``'; each moves through the states of ``_slot``. An
attempt runs in ``_runner`` by mode (``_atomic``, ``_atomic_group``), through the
steps they share (``_steps``). Side tasks renew leases (``_lease``), send heartbeats
(``_heartbeat``), give up on stuck handlers (``_watchdog``), run maintenance
(``_maintenance``) and match signals with the steps waiting for them (``_signals``).

The worker is given its parts made and wired (``_build``); it only runs them. What
the store offers beyond the core of the contract is read once, as the worker is built
(``client.capabilities``): each part is made with the capability or without it (an
acquire alone instead of a batched turn, no look-ahead without due times, no waiter in
line for a held row, no sweep or rollup), and a job type or option that cannot work
without one (an atomic type, ``atomic_group`` > 1) is refused then.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from pgwork.adapters.notify import Listener
from pgwork.client import Client
from pgwork.errors import (
    DatabaseTimeoutError,
    PgworkError,
    WorkerStateError,
)
from pgwork.job_types import JobType
from pgwork.observability import (
    WORKER_STARTED,
    WORKER_STOPPED,
)
from pgwork.observability.emitter import Emitter
from pgwork.records import AbortReason
from pgwork.worker._announce import announce_ready
from pgwork.worker._attempt import Attempt
from pgwork.worker._batch import CompletionBatcher
from pgwork.worker._bell import Bell
from pgwork.worker._deadline import StopDeadline
from pgwork.worker._fetch import Fetcher
from pgwork.worker._side.heartbeat import Heartbeat
from pgwork.worker._side.lease import renew_forever
from pgwork.worker._side.maintenance import Maintenance
from pgwork.worker._side.notices import Abort, Claim, NoticeRouter, act_on_claim
from pgwork.worker._side.reaper import Reaper
from pgwork.worker._side.watchdog import keep_abandoned
from pgwork.worker._signals import SignalMatcher
from pgwork.worker._slots import Slots
from pgwork.worker._sync import SyncHandler
from pgwork.worker._wakeups import Wakeups

log = logging.getLogger("pgwork.worker")

__all__ = ["Handler", "InProcessWorker", "Limits", "Processor"]

Handler = Callable[[Attempt[Any, Any]], Awaitable[Any]]
# What ``processors`` maps a job type to: an async handler, or a sync one (``_sync``).
Processor = Handler | SyncHandler

# Failed loop turns (database unreachable) back off up to this many seconds.
LOOP_BACKOFF_MAX = 5.0
# A cancelled worker waits this long for the reports of its batcher's last write.
LATE_SETTLE_S = 2.0
# How long a stop waits for a maintenance step in progress to end by itself (a retention
# round ends after its current batch).
MAINTENANCE_WIND_DOWN_S = 2.0


@dataclass(frozen=True, slots=True)
class Limits:
    """The numbers the main loop decides by."""

    max_slots: int
    poll_interval: float
    grace_period: float
    # At most this many jobs unsettled at once (prefetched, running, outcome unwritten).
    max_unsettled: int
    # While prefetched jobs wait, no acquire asks for fewer.
    least_acquire: int
    shortest_lease: timedelta


class InProcessWorker:
    """Runs handlers for the job types in ``processors``. Create with
    ``create_in_process_worker``; run with ``async with worker:``, ``stop = await
    worker.start()`` or ``await worker.run()`` (until ``stop()``)."""

    def __init__(
        self,
        *,
        client: Client,
        worker_id: str,
        types: Mapping[str, JobType[Any, Any]],
        queues: tuple[str, ...],
        limits: Limits,
        rng: random.Random,
        events: Emitter,
        bell: Bell,
        wakeups: Wakeups,
        deadline: StopDeadline,
        stopping: anyio.Event,
        batcher: CompletionBatcher,
        slots: Slots,
        fetcher: Fetcher,
        heartbeat: Heartbeat,
        reaper: Reaper,
        notices: NoticeRouter,
        maintenance: Maintenance,
        matcher: SignalMatcher | None = None,
    ) -> None:
        """Made by ``create_in_process_worker`` (``_build``), which wires the parts."""
        self.client = client
        self.state = client.state
        self.notify = client.notify
        self.worker_id = worker_id
        self.queues = queues
        self.max_slots = limits.max_slots
        self.poll_interval = limits.poll_interval
        self.grace_period = limits.grace_period
        self._limits = limits
        self._types = types
        self._rng = rng
        self._events = events
        self._bell = bell
        self._wakeups = wakeups
        self._deadline = deadline
        self._stop_requested = stopping
        self._batcher = batcher
        self._slots = slots
        self._fetcher = fetcher
        self._heartbeat = heartbeat
        self._reaper = reaper
        self._notices = notices
        self._maintenance = maintenance
        self._matcher = matcher
        capabilities = client.capabilities
        self._due_times = capabilities.due_times
        self._in_line_renewal = capabilities.in_line_renewal
        self._drain_scope: anyio.CancelScope | None = None
        self._failures = 0  # turns failed in a row
        self._written_alone = 0  # the batcher's ``written_alone`` when the loop last looked
        self._running = anyio.Event()
        self._stopped = anyio.Event()
        self._phase = "new"
        self._startup_error: BaseException | None = None
        self._task: Any = None

    # --- lifecycle ---------------------------------------------------------------------

    @property
    def active_slots(self) -> int:
        return len(self._slots)

    @property
    def abandoned_handlers(self) -> int:
        """Handlers this worker gave up on (they ignored cancellation) that still run."""
        return len(self._slots.abandoned)

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
                side.start_soon(self._slots.watch_forever)
                if self._matcher is not None:
                    side.start_soon(self._matcher.run_forever)
                await self._start_processes()
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
                    if self._matcher is not None:
                        # The names its last hand-ons left: matched now rather than by
                        # another worker's sweep.
                        with anyio.move_on_after(LATE_SETTLE_S):
                            await self._matcher.flush()
                    if self._slots.limited:
                        # The room its last attempts freed (their completions written
                        # by the batcher, with no acquire after them) may be waited for.
                        with anyio.move_on_after(LATE_SETTLE_S):
                            await announce_ready(self.notify, [None])
                finally:
                    # Maintenance ends its step first: cut off mid-statement, it
                    # would lose its connection (``Maintenance.wind_down``).
                    left = self._left()
                    bound = (
                        MAINTENANCE_WIND_DOWN_S
                        if left is None
                        else min(left, MAINTENANCE_WIND_DOWN_S)
                    )
                    with anyio.CancelScope(shield=True), anyio.move_on_after(bound):
                        await self._maintenance.wind_down()
                    side.cancel_scope.cancel()
                    with anyio.CancelScope(shield=True), anyio.move_on_after(self._left()):
                        await self._heartbeat.stopped()
        except BaseException as exc:
            self._startup_error = exc
            raise
        finally:
            await self._end_late_settling()
            self._slots.threads.close()
            processes = self._slots.processes
            if processes is not None:
                with anyio.CancelScope(shield=True):
                    await processes.close()
            groups = self._slots.runner.groups
            if groups is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(self._left()):
                    await groups.close()
            self._phase = "stopped"
            self._running.set()
            self._stopped.set()
            error = self._startup_error
            self._events.emit(
                WORKER_STOPPED,
                worker_id=self.worker_id,
                error=repr(error) if isinstance(error, Exception) else None,
            )

    async def _start_processes(self) -> None:
        """Start the process handlers' processes before the first job is taken, so no
        attempt's timeout pays for a process's start; a stop asked for meanwhile ends
        the wait (the processes still starting are ended with the worker)."""
        processes = self._slots.processes
        if processes is None:
            return
        try:
            async with anyio.create_task_group() as starting:

                async def stop_waiting() -> None:
                    await self._stop_requested.wait()
                    starting.cancel_scope.cancel()

                starting.start_soon(stop_waiting)
                await processes.start()
                starting.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # Only the start can fail here: what stopped the worker from starting.
            raise group.exceptions[0] from None

    async def _end_late_settling(self) -> None:
        """Cancelled, the worker's batcher still writes the completions that wait, and
        reports them on the event loop's next round; one that made work ready announces
        it in a slot task of its own. Let those end (briefly) so that nothing of the
        worker outlives ``run``."""
        with anyio.CancelScope(shield=True):
            await anyio.lowlevel.checkpoint()
            tasks = self._slots.tasks
            if tasks:
                # Stopping, the stop's deadline bounds this as it bounds the rest.
                left = self._left()
                with anyio.move_on_after(LATE_SETTLE_S if left is None else left):
                    await tasks.wait()
                left = self._left()
                await tasks.cancel_and_wait(LATE_SETTLE_S if left is None else left)

    async def start(self) -> Callable[[], Awaitable[None]]:
        """Run the worker in the background (asyncio) and return its ``stop``.

        Returns once the worker is listening, so a job enqueued afterwards wakes it;
        raises what stopped it from starting (e.g. the database is unreachable).
        """

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
        self._bell.ring()
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

    async def _turns(self) -> None:
        """The main loop: start what the acquires brought, reap one expired lease, fill
        the free slots with one SKIP LOCKED acquire, then wait for the bell (a
        notification, a slot freed, an acquire back, a due time, the poll). Stops
        taking jobs on ``stop()`` and settles the running ones within the grace period."""
        async with anyio.create_task_group() as self._fetcher.group:
            while not self._stop_requested.is_set():
                self._bell.clear()
                try:
                    await self._start_arrivals()
                    self._announce_freed()
                    await self._slots.hand_back_unsettled()
                    await self._reaper.reap_one(held=self._slots.held_tokens, idle=self._idle)
                    self._fill()
                    await self._look_ahead()
                except DatabaseTimeoutError as exc:
                    # A connection that went silent: it was closed, and a new one may
                    # work (a PgworkError, but one that heals by retrying).
                    await self._back_off(exc)
                    continue
                except PgworkError:
                    raise  # configuration/schema problems do not heal by retrying
                except Exception as exc:
                    await self._back_off(exc)
                    continue
                self._failures = 0
                await self._wait(self._wakeups.deadline() - time.monotonic())
                self._wakeups.tick()
            self._fetcher.stop_filling()
            await self._drain()
            # What was aborted has until ``_left`` to settle: a handler that ignores
            # its abort is given up on by then, and a write the database does not
            # answer is not waited for longer (it is left behind, see ``_main_loop``).
            with anyio.move_on_after(self._left()):
                await self._slots.tasks.wait()
            # An acquire still in flight is waited for (what it brings is handed back
            # below) until the deadline, and left behind then: a statement the
            # database does not answer would keep the stop for ``operation_timeout``.
            self._deadline.cut(self._fetcher.group.cancel_scope)
        # The acquires still in flight have come back (the task group waited for them):
        # what they brought goes straight back, within what is left of the stop.
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._left()):
            await self._hand_back_arrivals()

    @property
    def _idle(self) -> bool:
        """No job held and the last acquire found the queues empty."""
        return not self._slots and self._wakeups.found_nothing

    async def _wait(self, seconds: float) -> None:
        """Wait ``seconds`` or until the bell rings.

        A bell rung already returns without yielding (asyncio's event), so a turn
        yields here itself: the loop never spins without letting the event loop run."""
        if self._bell.rung:
            await anyio.lowlevel.checkpoint()
            return
        with anyio.move_on_after(seconds):
            await self._bell.wait()

    async def _back_off(self, error: Exception) -> None:
        """A turn failed (the database is away): wait, longer each time in a row (never
        longer than the poll interval), cut short by ``stop()`` or by the listener
        coming back (the database is reachable again), so recovery does not wait out
        the backoff."""
        # A failed acquire surfaces a turn later, so its own count of failures in a row
        # says how long the database has been away.
        self._failures = max(self._failures + 1, self._fetcher.failures)
        longest = min(LOOP_BACKOFF_MAX, self.poll_interval)
        delay = min(longest, 0.05 * 2**self._failures * self._rng.uniform(0.8, 1.2))
        log.warning(
            "pgwork worker %s turn failed (%r); retrying in %.2fs", self.worker_id, error, delay
        )
        await self._wait(delay)

    async def _main_loop(self) -> None:
        try:
            await self._turns()
        finally:
            self._fetcher.stop_filling()
            tasks = self._slots.tasks
            if tasks:  # cancelled from outside, or stopping late: take the slots down
                runner = self._slots.runner
                left = self._deadline.left()
                limit = runner.steps.abandon_after if left is None else left
                for task in await tasks.cancel_and_wait(limit or 0.0):
                    keep_abandoned(task, self._slots.abandoned, "cancelled with its worker")

    def _fill(self, incoming: int = 0) -> None:
        """Send an acquire if there is room (``incoming`` jobs just acquired are about
        to take some of it) and the queues may have work; raise what made the last
        acquire fail."""
        fetcher = self._fetcher
        error, fetcher.error = fetcher.error, None
        admission = self._slots.admission
        free = min(admission.room(), self._limits.max_unsettled - len(self._slots)) - incoming
        blocked = error is not None or not self._heartbeat.healthy
        if (
            blocked
            or not self._wakeups.may_have_work
            or self._acquire_later(free - fetcher.asked, waiting=len(admission.queued) + incoming)
        ):
            free = 0
        fetcher.fill(free)
        if error is not None:
            raise error

    def _acquire_later(self, wanted: int, *, waiting: int) -> bool:
        """Whether an acquire for ``wanted`` jobs can wait: enough prefetched jobs wait
        for a slot to keep the slots busy, and no completion would ride along. Slots
        whose attempts free them one at a time (atomic ones: each waits for its own
        round trips) otherwise send an acquire, and a commit, for every job or two."""
        least = self._limits.least_acquire
        return (
            wanted < least
            and waiting >= least
            and self._slots.admission.prefetching
            and not self._batcher.waiting
        )

    async def _start_arrivals(self) -> None:
        """Start the jobs the acquires brought (or keep them waiting for a slot). While
        prefetching, the next acquire goes out first, so that the server works on it
        while their handlers run.

        Then the turn lets their tasks take a first step before it decides anything
        else: a quick handler is done by then, and its completion rides with the
        acquire this turn sends, rather than leaving the batcher to write it alone
        (``_batch``)."""
        arrivals = self._fetcher.take_arrivals()
        if not arrivals:
            return
        if self._slots.admission.prefetching and self._fetcher.error is None:
            self._fill(sum(len(arrival.jobs) for arrival in arrivals))
        for arrival in arrivals:
            self._slots.arrived(arrival.jobs, leased_at=arrival.sent_at)
        await anyio.lowlevel.checkpoint()

    def _announce_freed(self) -> None:
        """Room in limited types: an attempt of one ended here, so this worker acquires
        again (an idle one took its last short acquire for drained queues). A handler
        that returned leaves its completion with the batcher, and that acquire carries
        it, freeing the place and leasing into it in one statement; an outcome written
        on its own (the batcher's ``written_alone``, a failure, an atomic commit) is
        followed by one. Under the type's lock the acquire tells whether a worker waits
        for room left (``LimitedTurn.waited_for``); only then are the jobs announced,
        to every worker: where nobody waits, an attempt that ends sends no notice."""
        alone = self._batcher.written_alone
        if self._slots.limited_ended or (alone != self._written_alone and self._slots.limited):
            self._slots.limited_ended = False
            self._wakeups.hint()
        self._written_alone = alone
        if not self._fetcher.waited_for or self._fetcher.group is None:
            return
        self._fetcher.waited_for = frozenset()
        self._fetcher.group.start_soon(announce_ready, self.notify, [None])

    async def _hand_back_arrivals(self) -> None:
        """The worker is stopping: hand what the acquires brought straight back, no
        attempt burned."""
        for arrival in self._fetcher.take_arrivals():
            await self._slots.hand_back(arrival.jobs)

    async def _look_ahead(self) -> None:
        """Once the queues are drained, learn when the next job becomes due (see
        ``_wakeups``): at start, and after a timer fired but found nothing. A store
        without ``DueTimes`` is not asked: an idle worker finds scheduled jobs by the
        poll (and the notifications that announce them)."""
        wakeups = self._wakeups
        if not wakeups.look_ahead or wakeups.may_have_work or self._fetcher.in_flight:
            return
        wakeups.look_ahead = False
        due_times = self._due_times
        if due_times is None:
            return
        seconds = await due_times.next_due(
            type_names=list(self._types), queues=self.queues, missed_after=wakeups.missed_after()
        )
        if seconds is not None:
            wakeups.due_in(seconds)
            if wakeups.may_have_work:
                self._bell.ring()  # due already (a hint): acquire this turn, not never

    async def _drain(self) -> None:
        """Graceful stop: hand prefetched jobs back, wait up to the grace period for
        the running ones, then abort what still runs."""
        with anyio.move_on_after(self.grace_period) as self._drain_scope:
            await self._fetcher.idle()
            await self._hand_back_arrivals()
            await self._slots.release_prefetched()
            while self._slots:
                self._bell.clear()
                await self._bell.wait()
        self._slots.abort_all(AbortReason.WORKER_STOPPING)
        # The watchdog gives up on a handler that ignores its abort ``abandon_after``
        # later, and then writes its failure: a moment more for that write.
        self._deadline.set_in(self._slots.runner.steps.abandon_after + LATE_SETTLE_S)

    def _left(self) -> float | None:
        """How long the stop has left to settle what it aborted (None: no stop yet, no
        bound): it returns within ``grace_period + abandon_after`` and a moment for the
        last writes (``LATE_SETTLE_S``), whatever the database does."""
        return self._deadline.left()

    async def _renew_forever(self) -> None:
        await renew_forever(
            self.state,
            self._slots.lease_holders,
            shortest_lease=self._limits.shortest_lease,
            in_line=self._in_line_renewal,
        )

    async def _listen(self, listener: Listener) -> None:
        """Act on the notices the listener hears; the aborts are the slots' to act on,
        the names to match the signal matcher's."""
        async for action in self._notices.actions(listener, timeout=self.poll_interval):
            if isinstance(action, Abort):
                self._slots.abort_job(action.job_id, action.reason)
            elif isinstance(action, Claim):
                await act_on_claim(
                    listener,
                    action,
                    has_room=self._has_room,
                    wakeups=self._wakeups,
                    bell=self._bell,
                )
            elif self._matcher is not None:
                self._matcher.want([action.name])

    @property
    def _has_room(self) -> bool:
        """A job acquired now would start or wait its turn here (the same room ``_fill``
        asks for, ignoring what acquires in flight asked: their snapshots may predate
        the job a notice announces)."""
        return (
            self._slots.admission.room() > 0
            and len(self._slots) < self._limits.max_unsettled
            and self._heartbeat.healthy
            and not self._stop_requested.is_set()
        )
