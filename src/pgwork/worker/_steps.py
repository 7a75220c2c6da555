"""The steps every attempt shares, whatever its mode: ``AttemptSteps``.

Build the ``Attempt`` the handler sees, call the handler through the middlewares and
take its cancellation back, write the outcome (or the failure, with its backoff) and
report it. The staged runner (``_runner``), an atomic attempt alone (``_atomic``) and
the atomic groups (``_atomic_group``) sit above and call these; nothing here knows
which of them called. Every write is fenced by the attempt's lease token.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pgwork._frozen import frozen_builder
from pgwork.adapters.notify import Notice, ready_notices
from pgwork.adapters.state import Completion, CompletionResult, Failure
from pgwork.backoff import backoff_delay
from pgwork.client import Client
from pgwork.errors import (
    ChildNotStartedHereError,
    ChildWaitNotAllowedError,
    ContinuationNotAllowedError,
    HandlerAbandonedError,
    OutcomeNotStorableError,
    PgworkError,
    WaitNotDeclaredError,
)
from pgwork.observability import (
    ATTEMPT_ABANDONED,
    ATTEMPT_ABORTED,
    ATTEMPT_COMPLETED,
    ATTEMPT_FAILED,
    ATTEMPT_RETRIED,
    ATTEMPT_STARTED,
    JOB_ENQUEUED,
    LEASE_LOST,
)
from pgwork.observability.emitter import Emitter
from pgwork.records import AbortReason, Job, JobStatus
from pgwork.worker._announce import announce_ready, due_epoch
from pgwork.worker._attempt import Attempt, Completed, Rescheduled, error_record
from pgwork.worker._batch import CompletionBatcher, Pending
from pgwork.worker._signals import SignalMatcher
from pgwork.worker._slot import Abandoned, Slot, SlotState
from pgwork.worker.middleware import CallNext

log = logging.getLogger("pgwork.worker")

__all__ = ["AttemptSteps"]

# Mistakes in the handler's code that fail the same way on every retry: the job fails
# for good at once.
_PROGRAMMING_ERRORS = (
    ContinuationNotAllowedError,
    WaitNotDeclaredError,
    ChildNotStartedHereError,
    ChildWaitNotAllowedError,
)

# Every attempt builds its ``Job``; the builder sets its 22 fields without the frozen
# ``__init__``'s ``object.__setattr__`` (``_frozen``). The values go in this order.
_build_job = frozen_builder(
    Job,
    (
        "id",
        "type_name",
        "chain_id",
        "chain_type_name",
        "chain_index",
        "input",
        "output",
        "status",
        "queue",
        "priority",
        "created_at",
        "scheduled_at",
        "started_at",
        "completed_at",
        "attempt",
        "max_attempts",
        "last_attempt_error",
        "last_attempt_at",
        "leased_by",
        "leased_until",
        "dedup_key",
        "context",
        "limit_key",
    ),
)
# A plain staged completion: job_id, lease_token, output_json, continuation.
_build_completion = frozen_builder(
    Completion, ("job_id", "lease_token", "output_json", "continuation")
)


def _take_back(task: asyncio.Task[Any], cancels: int) -> int:
    """Undo ``cancels`` cancellations of ``task``; return how many are left pending."""
    left = task.cancelling()
    for _ in range(cancels):
        left = task.uncancel()
    return left


class AttemptSteps:
    """The steps of one worker's attempts; holds no per-attempt state (that is
    ``Slot``), and moves a slot only as its handler starts and ends."""

    def __init__(
        self,
        *,
        client: Client,
        worker_id: str,
        handlers: Mapping[str, CallNext],
        batcher: CompletionBatcher,
        events: Emitter,
        rng: random.Random,
        abandon_after: float,
        matcher: SignalMatcher | None = None,
    ) -> None:
        self.client = client
        self.state = client.state
        capabilities = client.capabilities
        self._blockers = capabilities.blockers
        self._signals = capabilities.signals
        # Matches the names of the waiting steps this worker's hand-ons write.
        self._matcher = matcher
        self._limit_control = capabilities.limit_control
        # The store's atomic attempts (a worker without them runs no atomic type).
        self.atomic = capabilities.atomic
        self.notify = client.notify
        self.worker_id = worker_id
        self._handlers = handlers
        self._batcher = batcher
        self._events = events
        self._rng = rng
        self.abandon_after = abandon_after

    def build_attempt(
        self, slot: Slot, transaction: object | None
    ) -> tuple[Attempt[Any, Any] | None, BaseException | None]:
        """Build the handler's Attempt, or return why the stored input cannot be decoded
        (that fails the job at once: retrying cannot fix it)."""
        acquired = slot.acquired
        try:
            job_input = slot.job_type.input_codec.decode(acquired.input)
        except PgworkError as exc:
            return None, exc
        job: Job[Any] = _build_job(
            acquired.id,
            acquired.type_name,
            acquired.chain_id,
            acquired.chain_type_name,
            acquired.chain_index,
            job_input,
            None,  # output
            JobStatus.RUNNING,
            acquired.queue,
            acquired.priority,
            acquired.created_at,
            acquired.scheduled_at,
            acquired.started_at,
            None,  # completed_at
            acquired.attempt,
            acquired.max_attempts,
            acquired.last_attempt_error,
            acquired.last_attempt_at,
            self.worker_id,  # leased_by
            acquired.leased_until,
            acquired.dedup_key,
            acquired.context,
            acquired.limit_key,
        )
        attempt = Attempt(
            job=job,
            job_type=slot.job_type,
            acquired=acquired,
            worker_id=self.worker_id,
            registry=self.client.registry,
            max_payload_bytes=self.client.max_payload_bytes,
            transaction=transaction,
            blockers=self._blockers,
            limit_control=self._limit_control,
            signals=self._signals,
        )
        slot.attempt = attempt
        if slot.pending_abort is not None:
            attempt.abort(slot.pending_abort)
        return attempt, None

    async def call_handler(
        self,
        slot: Slot,
        attempt: Attempt[Any, Any],
        timeout: timedelta | None,
        after: SlotState,
    ) -> BaseException | None:
        """Run the handler through the middlewares; return the exception it ended with
        (a deadline overrun is a ``TimeoutError``). An abort returns None with
        ``attempt.abort_reason`` set. The slot is ``RUNNING`` meanwhile and moves to
        ``after`` as the handler ends (or at once, when it was aborted before it could
        start). A handler the watchdog gave up on raises ``Abandoned`` here once it
        ends: its attempt was settled without it.

        The handler is stopped by cancelling this task (``Slot.interrupt``); the
        cancellation is taken back here (``uncancel``) once the handler ended, so
        nothing after it is cancelled. A cancellation of the task from elsewhere
        (the worker itself cancelled) goes on up."""
        handler = self._handlers[slot.job_type.name]
        slot.started = started = time.monotonic()
        acquired = slot.acquired
        if self._events.wants(ATTEMPT_STARTED):
            self.emit(
                ATTEMPT_STARTED,
                slot,
                duration=False,
                mode=slot.job_type.mode,
                queued_s=(
                    acquired.leased_until - slot.job_type.lease - acquired.scheduled_at
                ).total_seconds(),
                trace_context=acquired.trace_context,
            )
        abandon_after = slot.job_type.abandon_after
        slot.abandon_after = (
            self.abandon_after if abandon_after is None else abandon_after.total_seconds()
        )
        if attempt.aborted:
            # Aborted before its handler could start (an atomic one while its
            # transaction opened): the handler does not run at all.
            slot.move(after)
            return None
        task = slot.task
        if task is None:  # the runner driven outside a worker's slot task
            task = asyncio.current_task()
        slot.handler_task = task
        # Cancellations of the task not yet taken back (none, unless a caller up the
        # task swallowed one): the interruption's is told apart from them.
        pending = task.cancelling() if task is not None else 0
        error: BaseException | None = None
        if timeout is not None:
            slot.timeout = timeout
            seconds = timeout.total_seconds()
            slot.stop_at = stop_at = started + seconds
            if slot.watchdog is not None:
                slot.watchdog.watch(stop_at)  # which stops the handler then
            attempt.deadline = asyncio.get_running_loop().time() + seconds
        slot.move(SlotState.RUNNING)
        try:
            result = await handler(attempt)
            attempt._finish_with(result)
        except Exception as exc:
            error = exc
        except asyncio.CancelledError:
            interrupts = slot.interrupts
            if not interrupts:
                raise
            slot.interrupts = 0
            if task is not None and _take_back(task, interrupts) > pending:
                raise  # cancelled from elsewhere as well
            # The handler ended by the interruption (one that swallowed it and
            # returned keeps its result).
            if attempt.abort_reason is None and slot.timed_out:
                error = TimeoutError()
        finally:
            if slot.stop_at is not None or slot.recheck is not None:
                slot.stop_cancelling()
            if slot.interrupts and task is not None:
                # Interrupted, and the handler swallowed it: take it back all the same.
                _take_back(task, slot.interrupts)
                slot.interrupts = 0
            if slot.state is SlotState.RUNNING:  # else given up on meanwhile
                slot.move(after)
        if slot.abandoned:
            raise Abandoned
        return error

    def abandoned_error(self, slot: Slot) -> HandlerAbandonedError:
        """The failure recorded for an attempt whose handler was given up on."""
        acquired = slot.acquired
        attempt = slot.attempt
        reason = attempt.abort_reason if attempt is not None else None
        timeout = slot.timeout
        stopped_at = slot.stopped_at
        if stopped_at is None:
            stopped_at = slot.started + (timeout.total_seconds() if timeout else 0.0)
        return HandlerAbandonedError(
            acquired.id,
            acquired.type_name,
            acquired.attempt,
            reason.value if reason is not None else f"timeout after {timeout}",
            time.monotonic() - stopped_at,
        )

    def submit_completion(self, slot: Slot, outcome: Completed) -> None:
        """Leave a plain completion (no continuation) with the batcher, which writes it
        with others and the worker's next acquire; ``_written`` reports it and lets the
        slot go (``SlotOwner.settled``) once it is committed."""
        acquired = slot.acquired
        self._batcher.submit(
            _build_completion(acquired.id, acquired.lease_token, outcome.output_json, None),
            slot,
            self._written,
        )

    def _written(self, pending: Pending) -> None:
        """A plain staged completion was committed (or its write gave up): report it,
        then let the slot go (``SlotOwner.settled``). Announcing what it made ready needs a
        round trip, so that, and a write that failed, finish in a task."""
        slot: Slot = pending.owner
        result = pending.result
        if (
            result is not None
            and result.accepted
            and not result.ready_queues
            and not result.due
            and not result.chain_awaited
            and not self._events.wants(ATTEMPT_COMPLETED)
        ):
            # Nothing to report and nothing to announce (the usual staged job, with no
            # observer at DEBUG): no need to enter the slot's context for it.
            slot.owner.settled(slot, None)
        elif slot.context is not None:
            slot.context.run(self._report_written, slot, pending)
        else:
            self._report_written(slot, pending)

    def _report_written(self, slot: Slot, pending: Pending) -> None:
        """``_written``, in the context the slot's task ran in."""
        result = pending.result
        if result is None or result.ready_queues or result.due or result.chain_awaited:
            slot.owner.settled(slot, self._written_later(slot, pending))
            return
        assert slot.attempt is not None
        self.report_outcome(slot, slot.attempt, result.accepted)
        slot.owner.settled(slot, None)

    async def _written_later(self, slot: Slot, pending: Pending) -> None:
        if isinstance(pending.error, OutcomeNotStorableError):
            # Its own outcome cannot be stored: the attempt failed (and counts).
            await self.settle_failure(slot, pending.error, terminal=False)
            return
        if pending.error is not None:
            raise pending.error
        result = pending.result
        assert result is not None
        assert slot.attempt is not None
        await self._announce(result, slot.acquired.chain_id, None)
        self.report_outcome(slot, slot.attempt, result.accepted)

    # --- settling an attempt -----------------------------------------------------------

    async def settle(
        self, slot: Slot, attempt: Attempt[Any, Any], error: BaseException | None
    ) -> None:
        reason = attempt.abort_reason
        if isinstance(error, HandlerAbandonedError):
            self._report_abandoned(slot, error)
            if reason in (None, AbortReason.WORKER_STOPPING):
                # The handler may still be doing its work: the attempt counts.
                await self.settle_failure(slot, error, terminal=False)
                return
        if reason is not None:
            await self.settle_abort(slot, reason)
            return
        if error is not None:
            # A continuation the type does not declare is a programming error: the
            # same code fails the same way on every retry, so fail at once.
            terminal = isinstance(error, _PROGRAMMING_ERRORS)
            await self.settle_failure(slot, error, terminal=terminal)
            return
        try:
            written = await self.write_outcome(slot, attempt, None)
        except OutcomeNotStorableError as exc:
            await self.settle_failure(slot, exc, terminal=False)
            return
        self.report_outcome(slot, attempt, written)

    async def settle_abort(
        self, slot: Slot, reason: AbortReason, *, hand_back: bool = False
    ) -> None:
        """An aborted attempt: a stopping worker hands the job back (no attempt burned),
        as does one whose handler never started (``hand_back``): the release is fenced
        by the lease token, so it does nothing if someone took the job meanwhile;
        otherwise the job is someone else's now and nothing is written."""
        if reason is AbortReason.WORKER_STOPPING or hand_back:
            released = await self.state.release(leases=[slot.lease])
            self.emit(ATTEMPT_ABORTED, slot, reason=reason.value, released=bool(released))
            if released:
                await announce_ready(self.notify, [slot.acquired.queue])
            return
        self.emit(ATTEMPT_ABORTED, slot, reason=reason.value, released=False)
        if reason in (AbortReason.OWNERSHIP_LOST, AbortReason.COMPLETED_ELSEWHERE):
            self.emit(LEASE_LOST, slot, duration=False, action="renewal")

    def _report_abandoned(self, slot: Slot, error: HandlerAbandonedError) -> None:
        self.emit(ATTEMPT_ABANDONED, slot, cause=error.cause, waited_s=error.waited)

    def emit(self, name: str, slot: Slot, *, duration: bool = True, **fields: Any) -> None:
        """Emit an attempt event with the attempt's identity (and duration) filled in."""
        if not self._events.wants(name):
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

    def report_outcome(self, slot: Slot, attempt: Attempt[Any, Any], written: bool) -> None:
        """Report an outcome once it is committed (``written``: its lease held): every
        caller calls this after the commit, an atomic attempt's and a group's included,
        so the children it started are reported enqueued only if they exist."""
        outcome = attempt.outcome
        if not written:
            self.emit(LEASE_LOST, slot, duration=False, action="completion")
            return
        if isinstance(outcome, Completed) and outcome.children:
            self._report_children(outcome)
        if isinstance(outcome, Completed) and outcome.continuation is not None:
            self.emit(
                ATTEMPT_COMPLETED,
                slot,
                outcome="continued",
                continued_with=outcome.continuation.type_name,
            )
        else:
            kind = "rescheduled" if isinstance(outcome, Rescheduled) else "completed"
            self.emit(ATTEMPT_COMPLETED, slot, outcome=kind, continued_with=None)

    def _report_children(self, outcome: Completed) -> None:
        """``job.enqueued`` for each chain the attempt started, as the client reports
        the chains it starts (fields and all): each child is a new chain, runnable now."""
        if not self._events.wants(JOB_ENQUEUED):
            return
        for child in outcome.children:
            self._events.emit(
                JOB_ENQUEUED,
                job_id=child.id,
                chain_id=child.chain_id,
                job_type=child.type_name,
                queue=child.queue,
                deduplicated=False,
                scheduled=False,
            )

    async def write_outcome(self, slot: Slot, attempt: Attempt[Any, Any], tx: Any | None) -> bool:
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
            if ok:
                due = due_epoch(outcome.run_at, outcome.run_after)
                await announce_ready(self.notify, [slot.acquired.queue], at=due, tx=tx)
        elif isinstance(outcome, Completed):
            completion = Completion(
                job_id=lease.job_id,
                lease_token=lease.lease_token,
                output_json=outcome.output_json,
                continuation=outcome.continuation,
                children=outcome.children,
            )
            ok = await self._complete(completion, slot.acquired.chain_id, tx)
        else:  # pragma: no cover - _finish_with always sets an outcome
            raise AssertionError("attempt finished without an outcome")
        return ok

    async def _complete(self, completion: Completion, chain_id: Any, tx: Any | None) -> bool:
        """Write a completion and announce what it made ready (continuation, unblocked
        dependants) and, for an awaited chain, its end — in ``tx`` when there is one
        (delivered on commit), else right after the autocommitted write."""
        following = completion.continuation
        if tx is None and (following is not None or completion.children):
            # A hand-on (or children to start): the adapter completes, continues and
            # announces in one go (one statement on PostgreSQL for a plain hand-on, a
            # transaction of its own for children and a step blocked on them).
            [handed_on] = await self.state.complete(
                None, completions=[completion], notify=self.notify
            )
            if handed_on.accepted and following is not None and following.wait_signal:
                # Committed: its name is matched now (a signal sent before it waits).
                assert self._matcher is not None  # the attempt checked the store has them
                self._matcher.want([following.wait_signal])
            return handed_on.accepted
        if tx is None:
            result = await self._batcher.complete(completion)
        else:
            result = (await self.state.complete(tx, completions=[completion]))[0]
        if result.ready_queues or result.due or result.chain_awaited:
            await self._announce(result, chain_id, tx)
        if tx is not None and result.accepted and following and following.wait_signal:
            # Its name is matched once ``tx`` commits, by the workers that hear this.
            await self.notify.publish(
                tx, notices=[Notice(kind="signal", name=following.wait_signal)]
            )
        return result.accepted

    async def _announce(self, result: CompletionResult, chain_id: Any, tx: Any | None) -> None:
        """Announce what a completion made ready (or due later) and, for an awaited
        chain, its end."""
        notices = ready_notices(result.ready_queues, result.due)
        if result.chain_awaited:
            notices.append(Notice(kind="chain_done", chain_id=chain_id))
        await self.notify.publish(tx, notices=notices)

    def _failure(self, slot: Slot, error: BaseException | None, *, terminal: bool) -> Failure:
        """What to write for an attempt that failed with ``error``: retry it after its
        backoff, or (``terminal``, or its last attempt) fail the job for good."""
        error = error or RuntimeError("attempt failed without an exception")
        acquired = slot.acquired
        terminal = terminal or acquired.attempt >= acquired.max_attempts
        retry_after = (
            None if terminal else backoff_delay(acquired.attempt, slot.job_type.retry, self._rng)
        )
        # ``started`` is when the handler started (set as it starts; before, when the
        # job arrived): the attempt history says how long the attempt ran.
        ran_for = timedelta(seconds=time.monotonic() - slot.started)
        return Failure(acquired.id, acquired.lease_token, error_record(error), retry_after, ran_for)

    def counted_failure(self, slot: Slot, error: BaseException) -> Failure:
        """The failure to write for an attempt whose handler started but whose outcome
        could not be written (``error`` says why): the attempt counts, so the job is
        retried after its backoff or, at its last attempt, fails for good."""
        return self._failure(slot, error, terminal=False)

    def failure_of(
        self, slot: Slot, attempt: Attempt[Any, Any] | None, error: BaseException | None
    ) -> Failure | None:
        """The failure to record for an attempt that ended with ``error`` (``attempt``
        None: its input could not be decoded), or None when it did not fail (it was
        aborted, or succeeded). A continuation the type does not declare, or an input
        that cannot be decoded, fails the same way on every retry: for good at once."""
        if attempt is None:
            return self._failure(slot, error, terminal=True)
        if attempt.abort_reason is not None or error is None:
            return None
        return self._failure(slot, error, terminal=isinstance(error, _PROGRAMMING_ERRORS))

    async def settle_failure(
        self, slot: Slot, error: BaseException | None, *, terminal: bool
    ) -> None:
        failure = self._failure(slot, error, terminal=terminal)
        accepted = await self.state.fail(None, failures=[failure])
        if accepted[0] and failure.retry_after is not None:
            due = time.time() + failure.retry_after.total_seconds()
            await announce_ready(self.notify, [slot.acquired.queue], at=due)
        self.report_failure(slot, failure, accepted[0])

    def report_failure(self, slot: Slot, failure: Failure, accepted: bool) -> None:
        """Report a failure once it was written (``accepted``: its lease still held)."""
        record = failure.error
        if not accepted:
            self.emit(LEASE_LOST, slot, action="failure")
        elif failure.retry_after is None:
            self.emit(
                ATTEMPT_FAILED,
                slot,
                error_type=record.type,
                error_message=record.message,
                settled=True,
            )
        else:
            self.emit(
                ATTEMPT_RETRIED,
                slot,
                error_type=record.type,
                error_message=record.message,
                retry_in_s=failure.retry_after.total_seconds(),
            )
