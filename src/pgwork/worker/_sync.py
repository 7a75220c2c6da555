"""Sync handlers: ``SyncAttempt``, and the awaitable the worker calls in their place.

A plain ``def`` handler (Django's ORM, requests, boto3) runs on one of the worker's own
threads (``_threads``). To the rest of the worker it is an async handler like any
other: ``on_threads`` turns it into one, so the middlewares, the steps of an attempt,
its timeout, its lease renewal and the watchdog are the same code for both.

The handler gets a ``SyncAttempt``: the ``Attempt`` behind it, with blocking methods.
Each method runs the ``Attempt``'s own on the event loop and waits for it
(``run_coroutine_threadsafe``), so the outcome a sync handler sets is validated,
encoded and written exactly as an async handler's.

Stopping: an async handler is stopped by cancelling its task; a thread cannot be. When
the worker interrupts the slot's task, the awaitable here sets the sync attempt's
cancellation (``SyncAttempt.cancelled``; every later call raises
``AttemptCancelledError``) and goes on waiting for the thread: the slot stays taken
while the handler runs, as it would for a coroutine that ignored its cancellation,
until the handler returns (the attempt then ends as the interruption says: a timeout
fails it, a stop hands the job back) or the watchdog gives up on it, which also gives
its thread up to the pool (``HandlerThreads.abandon``).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar, Unpack, overload

from pgwork.adapters.state import TransactionLending, TransactionLoan
from pgwork.client import StartedChain
from pgwork.errors import (
    AttemptCancelledError,
    SyncHandlerError,
    WorkerStateError,
)
from pgwork.fan_out import ChildOptions
from pgwork.job_types import Continuation, JobType
from pgwork.records import AbortReason, Job
from pgwork.signals import Signalled, SignalType, TimedOut
from pgwork.worker._attempt import Attempt
from pgwork.worker._threads import HandlerThreads
from pgwork.worker.middleware import CallNext

__all__ = ["SyncAttempt", "SyncHandler", "on_threads"]

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741
P = TypeVar("P")
T = TypeVar("T")
CI = TypeVar("CI")
CO = TypeVar("CO")

SyncHandler = Callable[["SyncAttempt[Any, Any]"], Any]


class SyncAttempt(Generic[I, O]):
    """Handed to a plain ``def handler(attempt)``, which runs on one of the worker's
    threads: what ``Attempt`` gives an async handler, with blocking methods.

    ``job`` is the typed job (``job.input`` is an ``I``); return an ``O`` (or a
    ``Continue``) to complete the job, raise to fail the attempt (retried with
    backoff), or call ``complete`` / ``reschedule`` / ``throttle``.

    A thread cannot be interrupted: when the worker asks the attempt to stop (its
    timeout passed, the job was cancelled, the lease was lost, the worker is
    stopping) it sets ``cancelled``, and every later call here raises
    ``AttemptCancelledError``. A long handler looks at ``cancelled`` (or calls
    ``raise_if_cancelled()``) between steps and returns; once cancelled, what it
    returns or raises no longer decides the outcome (a timeout fails the attempt, a
    stop hands the job back). One that has not returned ``abandon_after`` later is
    given up on, as an async handler is, and its thread replaced.

    Call its methods from the handler's own thread (or any thread but the event
    loop's): each waits for the event loop to run the ``Attempt``'s own.
    """

    __slots__ = ("_attempt", "_cancelled", "_connection", "_loop")

    def __init__(self, attempt: Attempt[I, O], loop: asyncio.AbstractEventLoop) -> None:
        self._attempt = attempt
        self._loop = loop
        self._cancelled = threading.Event()
        self._connection: Any = None

    @property
    def connection(self) -> Any:
        """An *atomic* attempt's blocking connection (a ``psycopg.Connection`` on
        PostgreSQL), in the job's transaction: what the handler writes through it
        commits with the job's completion, or not at all (``None`` in staged mode).
        Its ``commit`` keeps what the handler wrote so far, ``rollback`` undoes what it
        wrote since; the transaction itself is the worker's. Usable by psycopg code and
        as SQLAlchemy's DB-API connection (docs/sync.md), from the handler's thread,
        while the handler runs."""
        return self._connection

    @property
    def job(self) -> Job[I]:
        return self._attempt.job

    @property
    def job_type(self) -> JobType[I, O]:
        return self._attempt.job_type

    @property
    def worker_id(self) -> str:
        return self._attempt.worker_id

    @property
    def limit_key(self) -> str | None:
        """The job's limit key, None for none (``Attempt.limit_key``)."""
        return self._attempt.limit_key

    @property
    def deadline(self) -> float | None:
        """When the attempt times out, in the event loop's clock (``Attempt.deadline``),
        None without a timeout."""
        return self._attempt.deadline

    @property
    def abort_reason(self) -> AbortReason | None:
        """Why the worker aborted the attempt (lease lost, job cancelled, worker
        stopping), None while it was not (a timeout is not an abort: see
        ``cancel_reason``)."""
        return self._attempt.abort_reason

    @property
    def cancelled(self) -> bool:
        """Whether the worker asked this attempt to stop: return soon."""
        return self._cancelled.is_set() or self._attempt.abort_reason is not None

    @property
    def cancel_reason(self) -> AbortReason | None:
        """Why it was asked to stop (``AbortReason.TIMEOUT`` for its timeout), None
        while it was not."""
        reason = self._attempt.abort_reason
        if reason is None and self._cancelled.is_set():
            return AbortReason.TIMEOUT
        return reason

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Block until the attempt is asked to stop or ``timeout`` seconds passed;
        whether it was: a sleep between polls that ends as soon as it should."""
        return self._cancelled.wait(timeout)

    def raise_if_cancelled(self, action: str = "the handler") -> None:
        """``AttemptCancelledError`` once the worker asked the attempt to stop."""
        reason = self.cancel_reason
        if reason is not None:
            job = self._attempt.job
            raise AttemptCancelledError(job.id, job.attempt, reason.value, action)

    def complete(
        self, output: O | None = None, *, continue_with: Continuation | None = None
    ) -> None:
        """Complete the job with ``output`` (``Attempt.complete``)."""
        self._run("complete()", self._attempt.complete(output, continue_with=continue_with))

    def reschedule(self, *, at: datetime | None = None, after: timedelta | None = None) -> None:
        """Run the job again later without counting this attempt (``Attempt.reschedule``)."""
        self._run("reschedule()", self._attempt.reschedule(at=at, after=after))

    def pause_limit_key(
        self, *, until: datetime | None = None, after: timedelta | None = None
    ) -> None:
        """Pause the job's limit key on every worker (``Attempt.pause_limit_key``)."""
        self._run("pause_limit_key()", self._attempt.pause_limit_key(until=until, after=after))

    def throttle(self, *, until: datetime | None = None, after: timedelta | None = None) -> None:
        """``pause_limit_key`` then ``reschedule`` to the same time (``Attempt.throttle``)."""
        self._run("throttle()", self._attempt.throttle(until=until, after=after))

    def start_chain(
        self, job_type: JobType[CI, CO], input: CI, **options: Unpack[ChildOptions]
    ) -> StartedChain[CI, CO]:
        """Start a child chain, written with this job's completion
        (``Attempt.start_chain``, which checks and records it: the options go there as
        they are). Nothing waits: the child is only recorded here."""
        self.raise_if_cancelled("start_chain()")
        return self._attempt.start_chain(job_type, input, **options)

    @overload
    def blocker_outputs(self) -> list[Any]: ...

    @overload
    def blocker_outputs(self, job_type: JobType[Any, CO]) -> list[CO | None]: ...

    def blocker_outputs(self, job_type: JobType[Any, Any] | None = None) -> list[Any]:
        """Outputs of the chains this job was blocked on (``Attempt.blocker_outputs``)."""
        if job_type is None:
            return self._run("blocker_outputs()", self._attempt.blocker_outputs())
        return self._run("blocker_outputs()", self._attempt.blocker_outputs(job_type))

    def received(self, signal_type: SignalType[P]) -> Signalled[P] | TimedOut:
        """The signal this step waited for, or ``TimedOut`` (``Attempt.received``)."""
        return self._run("received()", self._attempt.received(signal_type))

    def _run(self, action: str, coro: Coroutine[Any, Any, T]) -> T:
        try:
            self.raise_if_cancelled(action)
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is self._loop:
                raise WorkerStateError(
                    f"SyncAttempt.{action} was called on the event loop's thread, where it "
                    "would wait for itself: call it from the sync handler, or use the "
                    "async Attempt's methods in async code"
                )
        except BaseException:
            coro.close()
            raise
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _cancel(self) -> None:
        self._cancelled.set()

    def __repr__(self) -> str:
        job = self._attempt.job
        return f"SyncAttempt({job.type_name} {job.id} #{job.attempt})"


def _drop_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def on_threads(
    handler: SyncHandler,
    threads: HandlerThreads,
    type_name: str,
    *,
    lending: TransactionLending | None = None,
) -> CallNext:
    """The awaitable the worker calls for the sync ``handler``: it runs the handler on
    ``threads`` with a ``SyncAttempt`` and returns (or raises) what the handler did.
    ``lending`` (the store, for an atomic type): the attempt's transaction is lent to
    the handler's thread as ``SyncAttempt.connection`` for as long as the handler runs
    (``_lent``). A worker on a store that cannot lend refuses such a handler when it
    is built.

    Interrupted (the slot's task cancelled), it sets the attempt's cancellation (and
    has the server cancel the atomic handler's statement in progress) and waits on for
    the thread, then lets the cancellation go on, so the attempt ends as an
    interrupted async handler's does. Cancelled once more meanwhile (the worker itself
    cancelled), it gives the thread up and lets that go on at once."""

    async def call(attempt: Attempt[Any, Any]) -> Any:
        sync = SyncAttempt(attempt, asyncio.get_running_loop())
        loan = None
        if lending is not None:
            tx = attempt.transaction
            assert tx is not None  # an atomic attempt runs in its transaction
            loan = lending.lend_transaction(tx, check=sync.raise_if_cancelled)
        run = handler if loan is None else _lent(handler, loan)
        future = threads.submit(run, sync, key=attempt)
        try:
            await asyncio.wait((future,))
        except asyncio.CancelledError:
            # The attempt ends as an interrupted one, whatever the handler then does:
            # what it raises is read here so that asyncio does not report it as never
            # retrieved.
            future.add_done_callback(_drop_outcome)
            sync._cancel()
            try:
                if loan is not None:
                    await loan.interrupt()
                await asyncio.wait((future,))
            except asyncio.CancelledError:
                threads.abandon(attempt)
                raise
            raise
        result = future.result()
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()
            raise SyncHandlerError(
                type_name,
                handler,
                reason=(
                    "is a plain `def` that returned an awaitable: the worker runs a plain "
                    "`def` handler on a thread and does not await what it returns. "
                    "Declare it with `async def`"
                ),
            )
        return result

    return call


def _lent(handler: SyncHandler, loan: TransactionLoan) -> SyncHandler:
    """``handler``, run (on its thread) with the transaction lent as its connection."""

    def run(sync: SyncAttempt[Any, Any]) -> Any:
        try:
            sync._connection = loan.open()
            return handler(sync)
        finally:
            loan.close()

    return run
