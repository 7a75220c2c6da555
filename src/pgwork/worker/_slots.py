"""The worker's acquired jobs, from arrival to settled: waiting for a slot (prefetched),
running, being written, or given up on.

Each attempt runs in a task of its own (``SlotTasks``) through the ``SlotRunner``;
``Admission`` decides which start; the ``Watchdog`` gives up on handlers that ignore
cancellation. A job whose attempt could not be settled at all is remembered in
``unsettled`` for the main loop to settle once the database is reachable: as a failure
of that attempt when its handler had started (the attempt counts), else handed back.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import operator
import time
from collections.abc import Collection, Coroutine, Mapping, Sequence
from typing import Any
from uuid import UUID

import anyio

from pgwork.adapters.notify import NotifyAdapter
from pgwork.adapters.state import AcquiredJob, Failure, Lease, WorkerCore
from pgwork.job_types import JobType
from pgwork.observability import ATTEMPT_FAILED, HANDLER_ENDED_LATE
from pgwork.records import AbortReason
from pgwork.worker._admission import Admission
from pgwork.worker._announce import announce_ready
from pgwork.worker._bell import Bell
from pgwork.worker._processes import HandlerProcesses
from pgwork.worker._runner import SlotRunner
from pgwork.worker._side.watchdog import Watchdog, keep_abandoned
from pgwork.worker._slot import Slot, SlotState
from pgwork.worker._threads import HandlerThreads

log = logging.getLogger("pgwork.worker")

__all__ = ["SlotTasks", "Slots"]

_PRIORITY_THEN_DUE = operator.attrgetter("priority", "scheduled_at")


class SlotTasks:
    """The set of running slot tasks (asyncio holds tasks only weakly): one plain
    asyncio task per attempt, owned by the worker.

    Not anyio's task group, for speed: starting a task through ``TaskGroup.start_soon``
    costs several times what ``loop.create_task`` does, start to finish of an empty task,
    and a worker starts one per job, so with no-op handlers it was a fifth of the worker's
    CPU (``python -m bench.cpu --only drain``). Ownership stays structured: the
    worker waits for every slot task before it returns, and when the worker itself is
    cancelled it cancels them and waits for them to end.

    A task's coroutine reports its own end (``ended``, from its outermost ``finally``)
    rather than a done callback: asyncio runs a done callback in a round of the event
    loop of its own, one more per job. Nothing runs between that ``finally`` and the
    task's end (the coroutine does not wait again), so whoever ``wait``s sees the task
    finished.

    The event loop is looked up once, not per task: on Python 3.11
    ``asyncio.get_running_loop()`` (and ``current_task()`` without a loop) asks the kernel
    for the process id on every call, to notice a fork.
    """

    __slots__ = ("_changed", "_loop", "_tasks")

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # the first task's
        # Made only while someone waits for the set to empty.
        self._changed: asyncio.Event | None = None

    def __len__(self) -> int:
        return len(self._tasks)

    def start(
        self,
        coro: Coroutine[Any, Any, None],
        *,
        name: str,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[None]:
        """Run ``coro`` in a task of its own; the coroutine must call ``ended`` as it
        ends, whatever it ends with."""
        loop = self._loop
        if loop is None or not self._tasks:
            # Looked up again whenever none runs: a worker runs on one loop at a time.
            loop = self._loop = asyncio.get_running_loop()
        task = loop.create_task(coro, name=name, context=context)
        self._tasks.add(task)
        return task

    def detach(self, task: asyncio.Task[None]) -> None:
        """Stop owning ``task`` (a handler given up on): nobody waits for it."""
        self._tasks.discard(task)
        if self._changed is not None:
            self._changed.set()

    def ended(self, error: BaseException | None) -> None:
        """The running task's coroutine is ending (with ``error``, when it raises).

        The slot coroutine catches ``Exception``; a ``BaseException`` other than a
        cancellation is logged here, unless the task was detached (given up on)."""
        task = asyncio.current_task(self._loop)
        if task not in self._tasks:
            return
        self._tasks.discard(task)
        if self._changed is not None:
            self._changed.set()
        if error is not None and not isinstance(error, asyncio.CancelledError):
            log.error("pgwork slot task %s ended with %r", task.get_name(), error)

    def _gone(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._changed is not None:
            self._changed.set()

    async def wait(self) -> None:
        """Return once every slot task has ended (or was detached)."""
        while self._tasks:
            self._changed = changed = asyncio.Event()
            await changed.wait()
        self._changed = None

    async def cancel_and_wait(self, limit: float) -> list[asyncio.Task[None]]:
        """Cancel every slot task and wait for them (shielded from our own cancel) at
        most ``limit`` seconds; detach and return those that ignored it."""
        for task in self._tasks:
            # One cancelled before its first step never runs its coroutine, nor the
            # ``finally`` that calls ``ended``.
            task.add_done_callback(self._gone)
            task.cancel()
        with anyio.CancelScope(shield=True), anyio.move_on_after(limit):
            await self.wait()
        stuck = list(self._tasks)
        for task in stuck:
            self.detach(task)
        return stuck


class Slots:
    """Every job this worker holds, one ``Slot`` each (the same job can come back to
    this worker, reaped then re-acquired, while a stale attempt on it is still being
    aborted: two slots then). ``held`` is keyed by the slots themselves rather than by
    their lease tokens: ``UUID.__hash__`` is a Python method, and every job went in and
    out once.

    Each slot moves itself through its states (``Slot.move``, as ``_slot.TRANSITIONS``
    allows) and tells its owner, this, when a move frees its place (``freed``) or when
    an attempt settled after its task ended is done (``settled``)."""

    def __init__(
        self,
        *,
        runner: SlotRunner,
        worker_id: str,
        types: Mapping[str, JobType[Any, Any]],
        queues: Sequence[str],
        max_slots: int,
        prefetch: int | None,
        bell: Bell,
        limited: Collection[str] = (),
        threads: HandlerThreads | None = None,
        processes: HandlerProcesses | None = None,
    ) -> None:
        """``limited``: the job types with limits (or this worker's caps); an attempt of
        one whose handler returns, or whose outcome is written on its own, sets
        ``limited_ended`` (its room may let a job start that an acquire held back, here
        or on another worker). ``threads``: where the sync handlers run (a handler given
        up on gives its thread up there too). ``processes``: where the process handlers
        run, if any."""
        self.runner = runner
        self.state: WorkerCore = runner.state
        self.notify: NotifyAdapter = runner.notify
        self.worker_id = worker_id
        self._types = types
        self._queue_rank = {name: rank for rank, name in enumerate(queues)}
        self._bell = bell
        self.held: dict[Slot, None] = {}
        self.admission: Admission[Slot] = Admission(
            max_slots=max_slots, prefetch=prefetch, rank=self._rank
        )
        self.tasks = SlotTasks()
        self.threads = threads if threads is not None else HandlerThreads(size=0, name="")
        self.processes = processes
        self.watchdog: Watchdog[Slot] = Watchdog()
        # Handlers given up on that have not ended yet (see ``_watchdog``).
        self.abandoned: set[asyncio.Task[Any]] = set()
        # Attempts to settle once the database is reachable: the failure to write (its
        # handler had started), or the lease to hand back (it had not).
        self.unsettled: list[Failure | Lease] = []
        self.limited = frozenset(limited)
        # How many jobs of each type this worker holds (for a worker's own caps).
        self.held_by_type: dict[str, int] = dict.fromkeys(types, 0)
        # An attempt of a limited type ended since the loop last looked.
        self.limited_ended = False
        # The (job type, limit key) of each attempt of a limited type that ended since
        # the last acquire was sent: that acquire looks for room left in them, for the
        # workers a key limit holds back (``FlowControl.acquire_limited``'s ``freed``).
        self.freed_keys: set[tuple[str, str]] = set()

    def __len__(self) -> int:
        return len(self.held)

    def _rank(self, slot: Slot) -> tuple[int, int, Any]:
        job = slot.acquired
        return (self._queue_rank.get(job.queue, 0), job.priority, job.scheduled_at)

    def arrived(self, acquired: list[AcquiredJob], *, leased_at: float | None = None) -> None:
        """Jobs were acquired: start them, or keep them waiting for a slot.

        ``leased_at``: when the acquire was sent (monotonic), the latest time their
        leases can be counted from and still end no later than the database's."""
        if len(acquired) > 1:
            # The statement returns its rows in no particular order; jobs that wait
            # for a slot must start in the queue's order.
            rank = self._queue_rank
            if len(rank) > 1:
                acquired.sort(key=lambda j: (rank.get(j.queue, 0), j.priority, j.scheduled_at))
            else:  # one queue: the same order, without a Python call per job
                acquired.sort(key=_PRIORITY_THEN_DUE)
        now = time.monotonic()
        leased = now if leased_at is None else min(leased_at, now)
        types, held, by_type, watchdog, admit, launch = (
            self._types,
            self.held,
            self.held_by_type,
            self.watchdog,
            self.admission.arrived,
            self._launch,
        )
        for job in acquired:
            slot = Slot(
                job, types[job.type_name], now, leased_at=leased, owner=self, watchdog=watchdog
            )
            held[slot] = None
            by_type[job.type_name] += 1
            if admit(slot):
                launch(slot)

    def freed(self, slot: Slot) -> None:
        """``slot`` left the states that hold a place (its handler returned, or was
        given up on, or its attempt ended): the next job takes the place."""
        following = self.admission.freed(slot, time.monotonic())
        if following is not None:
            self._launch(following)
        # Its completion, left with the batcher, rides with the acquire the loop now
        # sends: the statement frees the place and leases into it.
        self._room_freed(slot, acquire=True)
        self._bell.ring()

    def settled(self, slot: Slot, then: Coroutine[Any, Any, None] | None) -> None:
        """A staged attempt whose completion the batcher wrote after its task ended
        (``SlotRunner._written``) is done; ``then`` is what is left to do for it (in a
        task of its own), before the slot is let go."""
        if then is not None:
            self.tasks.start(self._run(slot, then=then), name="pgwork-settle", context=slot.context)
            return
        self._let_go(slot, batched=True)

    def _let_go(self, slot: Slot, *, batched: bool = False) -> None:
        """``slot``'s attempt is settled: forget the job (its place freed, if it still
        held one). ``batched``: its completion was written by the batcher, with an
        acquire (which took the room it freed) or alone (``written_alone``)."""
        if slot.state is not SlotState.ABANDONED:
            slot.move(SlotState.DONE)
        if self.held.pop(slot, False) is None:
            self.held_by_type[slot.job_type.name] -= 1
        # Written on its own, its room is free now: an acquire follows. Written by the
        # batcher, with an acquire or alone (which the loop acquires after), its key
        # goes with the next acquire all the same: the one that carried its completion
        # may have been sent before the batcher wrote it alone.
        self._room_freed(slot, acquire=not batched)
        self._bell.ring()

    def _room_freed(self, slot: Slot, *, acquire: bool) -> None:
        """``slot``'s place in a limited type is free, or about to be: its (type, key)
        goes with the next acquire (``freed_keys``); ``acquire``: one must follow."""
        if self.limited and slot.job_type.name in self.limited:
            self.freed_keys.add((slot.job_type.name, slot.acquired.limit_key or ""))
            if acquire:
                self.limited_ended = True

    def abort_all(self, reason: AbortReason) -> None:
        for slot in list(self.held):
            slot.abort(reason)

    def abort_job(self, job_id: UUID, reason: AbortReason) -> None:
        for slot in list(self.held):
            if slot.acquired.id == job_id:
                slot.abort(reason)

    def held_tokens(self) -> list[UUID]:
        """The lease tokens of the jobs held (the reaper leaves them alone)."""
        return [slot.acquired.lease_token for slot in self.held]

    def lease_holders(self) -> list[Slot]:
        """Attempts whose lease the renewer keeps alive now (``Slot.lease_renewed``)."""
        now = time.monotonic()
        return [slot for slot in self.held if slot.lease_renewed(now)]

    async def hand_back(self, acquired: Sequence[AcquiredJob]) -> None:
        """Release jobs no attempt was made on (no attempt burned) and announce them,
        so another worker takes them at once."""
        if await self.state.release(leases=[job.lease for job in acquired]):
            await announce_ready(self.notify, (job.queue for job in acquired))

    async def release_prefetched(self) -> None:
        """Hand the jobs still waiting for a slot back (the worker is stopping)."""
        waiting = self.admission.take_queued()
        for slot in waiting:
            slot.move(SlotState.DONE)
            if self.held.pop(slot, False) is None:
                self.held_by_type[slot.job_type.name] -= 1
        if not waiting:
            return
        try:
            await self.hand_back([slot.acquired for slot in waiting])
        except Exception as exc:
            # Not lost: their leases expire and another worker reaps them.
            log.warning(
                "pgwork worker %s could not hand back %d prefetched job(s) (%r)",
                self.worker_id,
                len(waiting),
                exc,
            )

    async def hand_back_unsettled(self) -> None:
        """Settle attempts that ended while nothing could be written.

        One whose handler had started counts: its failure (the error that kept it from
        being written) is written now, fenced by its lease token (a job someone else
        took meanwhile is left alone), so the job is retried after its backoff or, at
        ``max_attempts``, fails for good; a job whose outcome can never be written must
        not run for ever. One whose handler never started goes back to the queue
        without burning the attempt.
        """
        if not self.unsettled:
            return
        entries, self.unsettled = self.unsettled, []
        failures = [entry for entry in entries if isinstance(entry, Failure)]
        leases = [entry for entry in entries if isinstance(entry, Lease)]
        try:
            settled = sum(await self.state.fail(None, failures=failures))
            if failures:
                # Written: only the hand-backs are left, should they fail.
                entries = list(leases)
            settled += await self.state.release(leases=leases)
        except Exception:
            self.unsettled.extend(entries)
            raise
        if settled:
            await announce_ready(self.notify, [None])
        log.warning(
            "pgwork worker %s settled %d of %d attempt(s) it could not settle before",
            self.worker_id,
            settled,
            len(failures) + len(leases),
        )

    def _launch(self, slot: Slot) -> None:
        # A fixed name: formatting the job id into it cost more than the no-op job.
        slot.move(SlotState.STARTING)
        slot.context = context = contextvars.copy_context()
        slot.task = self.tasks.start(self._run(slot), name="pgwork-slot", context=context)

    async def watch_forever(self) -> None:
        """Stop the handlers past their timeout and give up on those that ignore
        being stopped, as the watchdog finds them, until cancelled."""
        watchdog = self.watchdog
        while True:
            due = watchdog.look(list(self.held), time.monotonic())
            for slot in due.timed_out:
                slot.time_out()
            for slot in due.abandoned:
                self._abandon(slot)
            await watchdog.wait(due.next_look)

    def _abandon(self, slot: Slot) -> None:
        """The watchdog gave up on ``slot``'s handler: free the slot now, let the
        handler's task run on detached, and settle the attempt in a task of its own."""
        slot.stop_cancelling()
        slot.move(SlotState.ABANDONED)  # which frees its place
        if slot.attempt is not None:
            # A sync handler's thread is replaced, so the freed place has one to run on.
            self.threads.abandon(slot.attempt)
        if slot.task is not None:
            self.tasks.detach(slot.task)
            keep_abandoned(
                slot.task,
                self.abandoned,
                f"of job {slot.acquired.id}",
                lambda late_s, outcome: self.runner.steps.emit(
                    HANDLER_ENDED_LATE, slot, duration=False, late_s=late_s, outcome=outcome
                ),
            )
        self.tasks.start(self._run(slot, abandoned=True), name="pgwork-abandoned")
        self._bell.ring()

    async def _run(
        self,
        slot: Slot,
        *,
        abandoned: bool = False,
        then: Coroutine[Any, Any, None] | None = None,
    ) -> None:
        """Run ``slot``'s attempt (or, ``abandoned``, settle it without its handler;
        or run ``then``, what is left of settling it) and free the slot, unless the
        batcher settles it later (``settled``). The task of a handler given up on
        frees nothing when it ends at last: the task that settled its attempt did."""
        later = False
        error: BaseException | None = None
        try:
            try:
                if then is not None:
                    await then
                elif abandoned:
                    await self.runner.settle_abandoned(slot)
                else:
                    later = await self.runner.run(slot)
            except Exception as exc:
                if slot.abandoned and not abandoned:
                    return
                log.exception(
                    "pgwork worker %s: unexpected error settling job %s",
                    self.worker_id,
                    slot.acquired.id,
                )
                # Nothing could be written (the database went away): settle the attempt
                # as soon as it is reachable again, instead of leaving it to a reaper.
                if slot.attempt is None:  # its handler never started
                    self.unsettled.append(slot.lease)
                else:
                    failure = self.runner.steps.counted_failure(slot, exc)
                    self.unsettled.append(failure)
                    record = failure.error
                    self.runner.steps.emit(
                        ATTEMPT_FAILED,
                        slot,
                        error_type=record.type,
                        error_message=record.message,
                        settled=False,
                    )
            finally:
                if not later and (abandoned or not slot.abandoned):
                    self._let_go(slot, batched=then is not None)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self.tasks.ended(error)  # the task's own end (see ``SlotTasks``)
