"""Grouping staged completions that finish close together into one statement.

A slot hands its completion here and waits (``complete``), or leaves it here with a
callback that reports what came of it (``submit``: the slot's task ends at once, which
saves a wake-up of that task per job). Usually the worker's next acquire takes
the waiting completions and writes them in its own statement (one round trip, one
commit; see ``_fetch``); when no acquire is going out (no free slot, or the worker is
backing off), the batcher writes them itself, within ``max_delay`` (plus the time an
acquire in flight takes to come back) or as soon as ``max_size`` wait. A
slot is released only after the write committed, so nothing is acknowledged before it
is durable. Completions with a continuation, or inside an atomic attempt's
transaction, do not come here: they need their own transaction.

A completion whose job's row another transaction holds (a caller cancelling or
completing that job) is not waited on: the statement skips it, and it is written again
a moment later, with a later turn, while the rest of its batch is done.

A failed write is retried with a short backoff (the jobs are still leased to us); if
it keeps failing, every waiting slot gets the error (and settles its attempt once the
database is back). An outcome the database cannot store (``OutcomeNotStorableError``)
fails its own job only: the batch is written one completion at a time, and only that
one gets the error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from pgwork.adapters.state import Completion, CompletionResult, WorkerCore
from pgwork.errors import OutcomeNotStorableError
from pgwork.worker._deadline import StopDeadline

log = logging.getLogger("pgwork.worker")

__all__ = ["Acquires", "CompletionBatcher", "Pending"]

RETRY_DELAYS = (0.05, 0.2, 0.5, 1.0, 2.0)

# How long a completion waits before it is written again when its job's row was held
# by another transaction (a caller's) at the last try.
DEFERRED_RETRY_S = 0.1

# The longest a cancelled batcher spends writing the completions still waiting.
FINAL_FLUSH_S = 5.0


# The acquires a worker has out, and the main loop's decisions to send them: the
# fetcher (``_fetch``) sends acquires and records each going out and coming back; the
# batcher asks, before writing completions with a statement of its own, whether an
# acquire will take them along instead (``hold_completions``). Both are given this one
# record when they are made, so neither needs the other.


class Acquires:
    """How many acquires are in flight and whether the loop has decided since the last
    came back; ``filling`` ends when the worker stops taking jobs."""

    __slots__ = ("_decided_after", "_filled", "_idle", "filling", "finished", "in_flight")

    def __init__(self) -> None:
        self.in_flight = 0
        self.finished = 0  # acquires that came back (or failed) so far
        self.filling = True
        self._idle = asyncio.Event()
        self._idle.set()
        # Set (and replaced) each time the loop decided whether to acquire, with how
        # many acquires had come back then.
        self._filled = asyncio.Event()
        self._decided_after = 0

    def sent(self) -> None:
        self.in_flight += 1
        if self._idle.is_set():
            self._idle = asyncio.Event()

    def came_back(self) -> None:
        self.finished += 1
        self.in_flight -= 1
        if not self.in_flight:
            self._idle.set()

    def decided(self) -> None:
        """The loop decided whether to send an acquire (it may have sent none)."""
        self._decided_after = self.finished
        self._filled.set()
        self._filled = asyncio.Event()

    def stop_filling(self) -> None:
        self.filling = False
        self._filled.set()

    async def idle(self) -> None:
        """Return once no acquire is in flight."""
        await self._idle.wait()

    async def hold_completions(self) -> None:
        """Return once no acquire will take the waiting completions along: none is in
        flight, and the loop has decided (not) to send one since the last came back."""
        while self.filling:
            if self.in_flight:
                await self.idle()
            elif self._decided_after >= self.finished:
                return
            else:
                await self._filled.wait()


@dataclass(slots=True)
class Pending:
    """One completion waiting to be written. ``written`` is shared by every completion
    that joined the same batch: one event per batch, not per job. (asyncio's events,
    not anyio's, here and below: every job waits on one, and anyio's wrapper cost
    several times the event itself; both are cancelled the same way, by the task's
    cancellation.) A completion given with ``submit`` has nobody waiting: ``written_to``
    is called with it (and ``owner``, what the caller handed in) once its result or
    error is known."""

    completion: Completion
    written: asyncio.Event
    result: CompletionResult | None = None
    error: BaseException | None = None
    written_to: Callable[[Pending], None] | None = None
    owner: Any = None


class CompletionBatcher:
    """Holds finished staged completions until an acquire or its own timer writes them.

    It does not flush early when the last running handler returns: the acquire that
    handler's free slot sets off takes the batch a moment later, and writing it twice
    as fast would cost a statement of its own per turn."""

    def __init__(
        self,
        state: WorkerCore,
        *,
        max_size: int = 200,
        max_delay: float = 0.002,
        acquires: Acquires | None = None,
        deadline: StopDeadline | None = None,
    ):
        self.state = state
        self.max_size = max_size
        self.max_delay = max_delay
        self._waiting: list[Pending] = []
        # Groups of completions deferred (``_defer``), until queued again.
        self._aside: list[list[Pending]] = []
        self._written = asyncio.Event()
        self._arrived = asyncio.Event()
        self._full = asyncio.Event()
        # The worker's acquires, which take the waiting completions along (None: a
        # batcher that writes everything itself, as on a store without ``BatchedTurns``).
        self._acquires = acquires
        # Completions written here, with no acquire (a worker with flow limits then
        # acquires: the room they freed may be waited for).
        self.written_alone = 0
        # Batches an acquire could not take along (``write_apart``): written here.
        self._apart: list[Pending] = []
        # A stopping worker's deadline, which also ends the writes shielded here.
        self._deadline = StopDeadline() if deadline is None else deadline

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def complete(self, completion: Completion) -> CompletionResult:
        """Queue ``completion`` and return its result once it is committed."""
        pending = Pending(completion, self._written)
        self._waiting.append(pending)
        self._arrived.set()
        if len(self._waiting) >= self.max_size:
            self._full.set()
        # A completion can move to another batch's event (``take``, ``give_back``): it
        # wakes when its old event is set, finds no result, and waits on the new one.
        while pending.result is None and pending.error is None:
            await pending.written.wait()
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    def submit(
        self, completion: Completion, owner: Any, written_to: Callable[[Pending], None]
    ) -> None:
        """Queue ``completion`` without waiting for it: ``written_to(pending)`` is called
        once it is committed (``pending.result``) or its write gave up
        (``pending.error``); ``pending.owner`` is ``owner``."""
        self._waiting.append(Pending(completion, self._written, None, None, written_to, owner))
        self._arrived.set()
        if len(self._waiting) >= self.max_size:
            self._full.set()

    def take(self, limit: int | None = None) -> list[Pending]:
        """Hand the waiting completions (up to ``limit``) to a caller that writes them
        and then calls ``deliver`` or ``fail``. Every completion taken shares one event."""
        limit = self.max_size if limit is None else limit
        if not self._waiting:
            return []
        batch, self._waiting = self._waiting[:limit], self._waiting[limit:]
        if self._waiting:
            # The rest move to a fresh event; they wake once more when this batch is
            # delivered, see no result of their own, and wait on the fresh one.
            fresh = asyncio.Event()
            for pending in self._waiting:
                pending.written = fresh
            self._written = fresh
        else:
            self._written = asyncio.Event()
            self._arrived = asyncio.Event()
            self._full = asyncio.Event()
        return batch

    def deliver(self, batch: Sequence[Pending], results: Sequence[CompletionResult]) -> None:
        """Hand each completion of ``batch`` its result, but for the deferred ones
        (another transaction held the job's row): those wait, and are written again
        after ``DEFERRED_RETRY_S``."""
        later: list[Pending] = []
        for pending, result in zip(batch, results, strict=True):
            if result.deferred:
                later.append(pending)
            else:
                pending.result = result
        if later:
            self._defer(later)
        if batch:
            batch[0].written.set()
            if later:
                batch = [p for p in batch if p.result is not None]
            _call_back_soon(batch)

    def _defer(self, later: list[Pending]) -> None:
        """Keep ``later`` aside (on an event of their own, so the batch's does not wake
        them for good) and queue them again after ``DEFERRED_RETRY_S``: the turns and
        flushes meanwhile do not spin on a row a caller holds."""
        aside = asyncio.Event()
        for pending in later:
            pending.written = aside
        self._aside.append(later)
        asyncio.get_running_loop().call_later(DEFERRED_RETRY_S, self._requeue, later, aside)

    def _requeue(self, later: list[Pending], aside: asyncio.Event) -> None:
        """Queue completions set aside by ``_defer`` again (once)."""
        if not any(group is later for group in self._aside):
            return
        self._aside = [group for group in self._aside if group is not later]
        for pending in later:
            pending.written = self._written
        self._waiting.extend(later)
        aside.set()
        self._arrived.set()
        if len(self._waiting) >= self.max_size:
            self._full.set()

    @staticmethod
    def fail(batch: Sequence[Pending], error: BaseException) -> None:
        for pending in batch:
            pending.error = error
        if batch:
            batch[0].written.set()
            _call_back_soon(batch)

    def give_back(self, batch: Sequence[Pending]) -> None:
        """Return a taken batch whose write failed: the batcher retries it."""
        if not batch:
            return
        moved_from = batch[0].written
        for pending in batch:
            pending.written = self._written
        moved_from.set()
        self._waiting[:0] = batch
        self._arrived.set()
        self._full.set()

    def write_apart(self, batch: Sequence[Pending]) -> None:
        """Write a taken ``batch`` here, never with an acquire: one of its outcomes
        cannot be stored, and an acquire carrying it would fail whole."""
        self._apart.extend(batch)
        self._arrived.set()
        self._full.set()

    async def run_forever(self) -> None:
        """Flush batches until cancelled; a batch being written is shielded so slots
        are never left waiting for a write that was cut off. Cancelled, it still writes
        what waits (within ``FINAL_FLUSH_S``): a slot cancelled with its worker does not
        wait for its completion, and the job would otherwise run again elsewhere."""
        try:
            while True:
                await self._arrived.wait()
                if not self._apart:
                    with anyio.move_on_after(self.max_delay):
                        await self._full.wait()
                    if not self._full.is_set() and self._acquires is not None:
                        # The acquire that follows the one in flight takes this batch
                        # along: a statement of our own would cost the server a commit
                        # per turn.
                        await self._acquires.hold_completions()
                apart, self._apart = self._apart, []
                batch = self.take()
                if not batch:  # (only ``apart`` woke it: ``take`` reset nothing)
                    self._arrived = asyncio.Event()
                    self._full = asyncio.Event()
                with self._deadline.shield():
                    await self._flush(apart)
                    await self._flush(batch)
        finally:
            with self._deadline.shield(), anyio.move_on_after(FINAL_FLUSH_S):
                apart, self._apart = self._apart, []
                await self._flush(apart)
                await self._flush_the_rest()

    async def _flush_the_rest(self) -> None:
        """Write what waits, deferred completions included, as the batcher stops; those
        still deferred after a few tries fail (their jobs are left to be reaped)."""
        for _ in range(len(RETRY_DELAYS)):
            self._requeue_all()
            if not self._waiting:
                return
            await self._flush(self.take())
            if not self._aside and not self._waiting:
                return
            await anyio.sleep(DEFERRED_RETRY_S)
        self._requeue_all()
        left = self.take(len(self._waiting))
        self.fail(left, RuntimeError("the job's row stayed held by another transaction"))

    def _requeue_all(self) -> None:
        for group in list(self._aside):
            self._requeue(group, group[0].written)

    async def _flush(self, batch: list[Pending]) -> None:
        """Write ``batch``, retrying a failed write with a short backoff. An outcome the
        database cannot store fails its own job, not the batch: the batch is then
        written one completion at a time, and that one gets the error."""
        delays = iter((*RETRY_DELAYS, None))
        while batch:
            try:
                results = await self.state.complete(None, completions=[p.completion for p in batch])
            except OutcomeNotStorableError as exc:
                if len(batch) == 1:
                    self.fail(batch, exc)  # storing it again cannot work
                    return
                batch, error = await self._one_by_one(batch)
                if error is None:
                    return
            except Exception as exc:
                error = exc
            else:
                self.written_alone += len(batch)
                self.deliver(batch, results)
                return
            delay = next(delays)
            if delay is None:
                self.fail(batch, error)
                return
            log.warning(
                "pgwork could not write %d completion(s) (%r); retrying in %.2fs",
                len(batch),
                error,
                delay,
            )
            await anyio.sleep(delay)

    async def _one_by_one(self, batch: list[Pending]) -> tuple[list[Pending], BaseException | None]:
        """Write ``batch`` one completion at a time: each that cannot be stored fails
        alone. Stops at a write that fails otherwise (the database went away): returns
        the completions not written yet, and that error."""
        for pending in batch:
            _move([pending], asyncio.Event())  # each delivered on its own
        for at, pending in enumerate(batch):
            try:
                results = await self.state.complete(None, completions=[pending.completion])
            except OutcomeNotStorableError as exc:
                self.fail([pending], exc)
            except Exception as exc:
                rest = batch[at:]
                _move(rest, asyncio.Event())  # one batch again
                return rest, exc
            else:
                self.deliver([pending], results)
        return [], None


def _move(batch: Sequence[Pending], written: asyncio.Event) -> None:
    """Make ``batch`` wait on ``written``: whoever waits on a completion's old event
    wakes, finds no result, and waits on the new one."""
    for pending in batch:
        moved_from, pending.written = pending.written, written
        moved_from.set()


def _call_back_soon(batch: Sequence[Pending]) -> None:
    """Call the submitters back on the event loop's next round, as it woke the waiters:
    the jobs an acquire brought along with these results start first (what is written
    frees room, and the worker's loop, woken before they ran, would send its next
    acquire without their completions)."""
    asyncio.get_running_loop().call_soon(_call_back, batch)


def _call_back(batch: Sequence[Pending]) -> None:
    """Tell the submitters of ``batch`` what came of their completions; one failing
    callback does not keep the others from theirs."""
    for pending in batch:
        written_to = pending.written_to
        if written_to is None:
            continue
        try:
            written_to(pending)
        except Exception:
            log.exception("pgwork could not settle job %s", pending.completion.job_id)
