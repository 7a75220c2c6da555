"""One attempt at one job, as its handler sees it.

The handler decides the outcome — ``complete`` (optionally continuing the chain) or
``reschedule`` — or returns a value (completes with it) or raises (retried with
backoff). The outcome is validated and encoded here, inside the handler's call, so a
wrong output or a continuation the registry forbids raises *in the handler*, where the
stack trace points at the bug. The worker writes the outcome after the handler returns
(in atomic mode: in the attempt's own transaction).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar, Unpack, overload
from uuid import UUID

from pgwork._continuations import child_job, continuation_job, split_schedule
from pgwork._limits import check_pause
from pgwork.adapters.limits import LimitChange
from pgwork.adapters.state import (
    AcquiredJob,
    ChainBlockers,
    ChainSignals,
    LimitControl,
    NewJob,
)
from pgwork.client import StartedChain
from pgwork.errors import (
    AttemptAlreadyFinishedError,
    CapabilityMissingError,
    ConfigurationError,
    LeaseLostError,
    LimitNotDeclaredError,
    WaitNotDeclaredError,
)
from pgwork.fan_out import ChildOptions, Children
from pgwork.job_types import Continuation, JobType, JobTypeRegistry
from pgwork.records import AbortReason, AttemptError, ChainStatus, Job, JobStatus
from pgwork.signals import Signalled, SignalType, TimedOut

__all__ = ["Attempt", "Completed", "Outcome", "Rescheduled", "error_record"]

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741
P = TypeVar("P")
CI = TypeVar("CI")
CO = TypeVar("CO")

TRACEBACK_LIMIT = 8000
MESSAGE_LIMIT = 2000

# The aborts after which the job is no longer this worker's: an outcome set then is
# never written (a stopping worker or a timeout still holds the job).
_LOST = frozenset(
    {AbortReason.OWNERSHIP_LOST, AbortReason.CANCELLED, AbortReason.COMPLETED_ELSEWHERE}
)


@dataclass(frozen=True, slots=True)
class Completed:
    output_json: str
    continuation: NewJob | None
    # The chains the attempt started (``Attempt.start_chain``), written with it.
    children: tuple[NewJob, ...] = ()

    @property
    def plain(self) -> bool:
        """Nothing to write but the job's own completion (the batched staged path)."""
        return self.continuation is None and not self.children


@dataclass(frozen=True, slots=True)
class Rescheduled:
    run_at: datetime | None
    run_after: timedelta | None


Outcome = Completed | Rescheduled


class Attempt(Generic[I, O]):
    """Handed to ``async def handler(attempt)``.

    ``job`` is the typed job (``job.input`` is an ``I``). ``deadline`` is when the
    handler is cancelled for overrunning its job type's timeout (an atomic attempt's,
    else its lease), in the event loop's clock (``loop.time()``,
    ``anyio.current_time()``), or None without a timeout: past it the attempt fails
    with ``TimeoutError``. When the worker aborts the attempt (lease lost, job
    cancelled, worker stopping) it sets ``abort_reason`` and cancels the handler.
    Either cancellation is asyncio's own ``CancelledError``, raised once where the
    handler waits (not inside a shielded anyio scope: once it has left it). Once the
    job is no longer this worker's (its lease lost, the job cancelled or completed
    elsewhere), ``complete`` and ``reschedule`` raise ``LeaseLostError``: nothing the
    handler finishes then would be written.
    ``connection`` is the open database connection of an *atomic* attempt: rows the
    handler writes through it commit together with the job's completion (``None`` in
    staged mode).
    """

    def __init__(
        self,
        *,
        job: Job[I],
        job_type: JobType[I, O],
        acquired: AcquiredJob,
        worker_id: str,
        registry: JobTypeRegistry,
        max_payload_bytes: int,
        transaction: Any | None,
        blockers: ChainBlockers | None,
        limit_control: LimitControl | None = None,
        signals: ChainSignals | None = None,
    ) -> None:
        self.job = job
        self.job_type = job_type
        self.worker_id = worker_id
        self.deadline: float | None = None
        self.abort_reason: AbortReason | None = None
        self.transaction = transaction
        self.connection: Any = getattr(transaction, "connection", None)
        self._acquired = acquired
        self._registry = registry
        # The store, when it offers blockers; without them no job has any.
        self._blockers = blockers
        # The store, when it keeps run-time limits (``pause_limit_key``).
        self._limit_control = limit_control
        # The store, when it offers signals; without them no job waits for one.
        self._signals = signals
        self._max_payload_bytes = max_payload_bytes
        self.outcome: Outcome | None = None
        # The chains ``start_chain`` recorded, in order, and their ids.
        self._children: list[NewJob] = []
        self._child_ids: set[UUID] = set()

    @property
    def limit_key(self) -> str | None:
        """The job's limit key (``start_chain(limit_key=...)``, kept by its chain's
        continuations), None for none."""
        return self.job.limit_key

    @property
    def aborted(self) -> bool:
        return self.abort_reason is not None

    def abort(self, reason: AbortReason) -> None:
        """Record why the attempt was aborted (first reason wins). Called by the
        worker, which then cancels the handler."""
        if self.abort_reason is None:
            self.abort_reason = reason

    async def complete(
        self, output: O | None = None, *, continue_with: Continuation | None = None
    ) -> None:
        """Complete the job with ``output``; with ``continue_with``, the chain goes on
        with that job, inserted in the transaction that completes this one."""
        self._ensure_held("complete()")
        self._complete(output, continue_with)

    def _complete(self, output: O | None, continue_with: Continuation | None) -> None:
        self._ensure_open("complete")
        if output is None and continue_with is not None:
            # A job that hands its chain on need not produce an output of its own.
            output_json = "null"
        else:
            output_json = self.job_type.output_codec.encode(
                output, max_bytes=self._max_payload_bytes
            )
        continuation = self._continuation(continue_with) if continue_with is not None else None
        self.outcome = Completed(output_json, continuation, tuple(self._children))

    async def reschedule(
        self, *, at: datetime | None = None, after: timedelta | None = None
    ) -> None:
        """Put the job back to run later without counting this attempt (e.g. polling
        something that is not ready yet). Give ``at`` (aware datetime) or ``after``."""
        self._ensure_held("reschedule()")
        self._ensure_open("reschedule")
        if (at is None) == (after is None):
            raise ConfigurationError("reschedule() takes exactly one of at= or after=")
        run_at, run_after = split_schedule(at if at is not None else after)
        self.outcome = Rescheduled(run_at, run_after)

    async def pause_limit_key(
        self, *, until: datetime | None = None, after: timedelta | None = None
    ) -> None:
        """Start no attempt of this job's limit key before ``until`` (an aware
        datetime) or for ``after`` (a timedelta, from now on the database's clock), on
        any worker: what a handler does when the service its key stands for answers
        "429, retry after 30 s". Running attempts go on, this one included.

        The key paused is the job's limit group: its limit key for a keyed type; for a
        type limited as a whole, or a keyed type's job enqueued without a key, the
        type as a whole (those jobs share the type's own row). A pause already longer
        is kept. It is written and committed at once in a transaction of its own, so
        it holds whatever becomes of this attempt (an atomic attempt's transaction
        rolling back included). The job itself is not rescheduled: call
        ``reschedule`` too, or ``throttle`` for both. A type that declares no limit
        raises ``LimitNotDeclaredError``, before any statement."""
        pause = check_pause(until, after, where="pause_limit_key")
        self._ensure_held("pause_limit_key()")
        job_type = self.job_type
        if not job_type.limited:
            raise LimitNotDeclaredError(job_type.name, "unlimited")
        if self._limit_control is None:
            raise CapabilityMissingError(
                "LimitControl", "Attempt.pause_limit_key", "the worker's state adapter"
            )
        key = self.job.limit_key if job_type.keyed else None
        await self._limit_control.change_limits(
            None,
            type_name=job_type.name,
            limit_key=key or "",
            change=LimitChange(paused_until=pause, extend_pause=True),
        )

    async def throttle(
        self, *, until: datetime | None = None, after: timedelta | None = None
    ) -> None:
        """``pause_limit_key`` then ``reschedule`` to the same time: the key waits, and
        this job runs again when the pause ends, without counting this attempt."""
        self._ensure_held("throttle()")
        self._ensure_open("throttle")
        await self.pause_limit_key(until=until, after=after)
        await self.reschedule(at=until, after=after)

    def start_chain(
        self, job_type: JobType[CI, CO], input: CI, **options: Unpack[ChildOptions]
    ) -> StartedChain[CI, CO]:
        """Start a child chain with ``job_type``: recorded now (its id is made at once,
        so it can be handed to ``Children``), written in the transaction that completes
        this job, and only if it completes. A failed, retried, rescheduled or aborted
        attempt writes none of its children: the next attempt starts its own.

        Checked here as ``client.start_chain`` checks an enqueue (an entry type, its
        input, the options: ``queue``, ``priority``, ``max_attempts``, ``context``,
        ``limit_key``, see ``ChildOptions``), before anything is written. The child
        keeps this job's logging context and limit key unless given its own, and its
        trace. A child that no ``Children`` waits for is started and left to run (fire
        and forget).
        Starting children after ``complete``/``reschedule`` raises
        ``AttemptAlreadyFinishedError``; on a store without ``ChainBlockers``,
        ``CapabilityMissingError``."""
        self._ensure_held("start_chain()")
        self._ensure_open("start_chain")
        if self._blockers is None:
            raise CapabilityMissingError(
                "ChainBlockers", "Attempt.start_chain", "the worker's state adapter"
            )
        unknown = options.keys() - ChildOptions.__optional_keys__
        if unknown:
            raise TypeError(
                f"start_chain() got unexpected keyword arguments {sorted(unknown)}: a child "
                f"takes {sorted(ChildOptions.__optional_keys__)}"
            )
        child = child_job(
            self._registry,
            job_type,
            input,
            self.job,
            max_bytes=self._max_payload_bytes,
            trace_context=self._acquired.trace_context,
            **options,
        )
        self._children.append(child)
        self._child_ids.add(child.id)
        # Positional, as the client builds it.
        return StartedChain(child.id, child.id, job_type, False, JobStatus.PENDING)

    def _ensure_held(self, action: str) -> None:
        if self.abort_reason in _LOST:
            raise LeaseLostError(self.job.id, self.job.attempt, action)

    def _ensure_open(self, action: str) -> None:
        if self.outcome is not None:
            kind = "complete" if isinstance(self.outcome, Completed) else "reschedule"
            raise AttemptAlreadyFinishedError(self.job.id, kind)

    def _continuation(self, spec: Continuation) -> NewJob:
        wait = getattr(spec, "wait", None)
        if isinstance(wait, Children):
            if self._blockers is None:
                raise CapabilityMissingError(
                    "ChainBlockers",
                    "Continue(..., wait_for=Children(...))",
                    "the worker's state adapter",
                )
        elif wait is not None and self._signals is None:
            raise CapabilityMissingError(
                "ChainSignals", "Continue(..., wait_for=...)", "the worker's state adapter"
            )
        job = continuation_job(
            self._registry,
            self.job_type,
            self.job,
            spec,
            max_bytes=self._max_payload_bytes,
            started=self._child_ids,
        )
        # The chain stays in the trace its first job was enqueued in.
        return replace(job, trace_context=self._acquired.trace_context)

    @overload
    async def blocker_outputs(self) -> list[Any]: ...

    @overload
    async def blocker_outputs(self, job_type: JobType[Any, CO]) -> list[CO | None]: ...

    async def blocker_outputs(self, job_type: JobType[Any, Any] | None = None) -> list[Any]:
        """Outputs of the chains this job was blocked on (its ``blockers``, or the
        children it waited for), one per chain in the order they were given, each
        decoded with the output model of the job that ended that chain. ``None`` for a
        chain that was not met when this job was released: one that failed or was
        cancelled and let it run anyway (``blocker_failure="unblock"``), and, for a
        step released by ``Children(..., need=n)``, each chain that had not completed
        by then, and of chains that completed together, those past the first ``n`` in
        the order given (every attempt of the step reads the same list). Empty for a job
        without blockers, as every job is on a store without ``ChainBlockers``.

        ``job_type``: decode every output with that type's output model instead, for a
        list mypy knows the type of (``list[O | None]``); the chains must have ended
        with a job of that type (``ConfigurationError`` names one that did not)."""
        outputs: list[Any] = []
        if self._blockers is None:
            return outputs
        for blocker in await self._blockers.blocker_outputs(self.transaction, job_id=self.job.id):
            if (
                not blocker.met
                or blocker.status is not ChainStatus.COMPLETED
                or blocker.type_name is None
            ):
                outputs.append(None)
            elif job_type is not None:
                if blocker.type_name != job_type.name:
                    raise ConfigurationError(
                        f"blocker chain {blocker.chain_id} of job {self.job.id} ended with a "
                        f"job of type {blocker.type_name!r}, not {job_type.name!r}: read it "
                        "with blocker_outputs() (each output decoded with its own type)"
                    )
                outputs.append(job_type.output_codec.decode(blocker.output))
            elif blocker.type_name in self._registry:
                codec = self._registry.get(blocker.type_name).output_codec
                outputs.append(codec.decode(blocker.output))
            else:
                outputs.append(blocker.output)
        return outputs

    async def received(self, signal_type: SignalType[P]) -> Signalled[P] | TimedOut:
        """The signal this step waited for (its job type's ``waits_for``): ``Signalled``
        with the payload decoded to the signal type's model, or ``TimedOut`` when the
        step started without one (its timeout passed first). Every attempt of the step
        reads the same signal. ``WaitNotDeclaredError`` for a signal type its job type
        does not wait for, before any statement."""
        declared = self.job_type.waits_for
        if declared is not signal_type:
            raise WaitNotDeclaredError(
                self.job_type.name,
                getattr(signal_type, "name", repr(signal_type)),
                None if declared is None else declared.name,
                self.job.id,
            )
        if self._signals is None:
            return TimedOut()
        # Outside the attempt's transaction: the match that handed it over committed
        # before the step could start.
        got = await self._signals.received_signal(None, job_id=self.job.id)
        if got is None:
            return TimedOut()
        payload = signal_type.payload_codec.decode(got.payload)
        return Signalled(payload=payload, name=got.name, sent_at=got.sent_at)

    def _finish_with(self, result: Any) -> None:
        """Turn a handler's return value into the outcome when it set none itself (not a
        coroutine: nothing here awaits, and building one cost a coroutine per job)."""
        if self.outcome is not None:
            return
        # Not through ``complete``: a coroutine fewer per job.
        if isinstance(result, Continuation):
            self._complete(None, result)
        else:
            self._complete(result, None)

    def __repr__(self) -> str:
        return f"Attempt({self.job.type_name} {self.job.id} #{self.job.attempt})"


def error_record(exc: BaseException) -> AttemptError:
    """The stored form of an exception: type, message and a truncated traceback."""
    tb = "".join(traceback.format_exception(exc))
    if len(tb) > TRACEBACK_LIMIT:
        tb = "…" + tb[-TRACEBACK_LIMIT:]
    message = str(exc)
    if len(message) > MESSAGE_LIMIT:
        message = message[:MESSAGE_LIMIT] + "…"
    return AttemptError(
        type=f"{type(exc).__module__}.{type(exc).__qualname__}", message=message, traceback=tb
    )
