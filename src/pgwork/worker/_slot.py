"""One acquired job's bookkeeping while this worker holds it: ``Slot``.

What the lease renewer, the watchdog, admission and the attempt's runner
(``_runner``) all read and write about one attempt, and nothing that runs it, so every
one of them can import it without importing each other.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from datetime import timedelta
from typing import Any

import anyio

from pgwork.adapters.state import AcquiredJob, Lease
from pgwork.job_types import JobType
from pgwork.records import AbortReason
from pgwork.worker._attempt import Attempt
from pgwork.worker._watchdog import Watchdog

__all__ = ["Abandoned", "Slot", "scope_type"]


def scope_type() -> type[anyio.CancelScope]:
    """The class of anyio's cancel scopes on the running event loop.

    ``anyio.CancelScope()`` looks the event loop's library up (sniffio) every time it
    builds one; the worker builds two per job, and the lookup cost more than entering
    and leaving the scope. The class found once builds the same scope directly."""
    return type(anyio.CancelScope())


class Abandoned(Exception):
    """Ends the task of a handler the worker gave up on, once the handler ends: the
    attempt was settled without it (see ``_watchdog``)."""


class Slot:
    """One running attempt's bookkeeping; also the renewer's LeaseHolder."""

    __slots__ = (
        "abandon_after",
        "abandoned",
        "acquired",
        "attempt",
        "context",
        "guard",
        "handler_running",
        "job_type",
        "lease_deadline",
        "pending_abort",
        "settling",
        "started",
        "stopped_at",
        "task",
        "timeout",
        "watchdog",
    )

    def __init__(
        self,
        acquired: AcquiredJob,
        job_type: JobType[Any, Any],
        guard: anyio.CancelScope | None = None,
        now: float | None = None,
    ) -> None:
        if now is None:
            now = time.monotonic()
        self.acquired = acquired
        self.job_type = job_type
        self.attempt: Attempt[Any, Any] | None = None
        self.pending_abort: AbortReason | None = None
        # The handler returned and its outcome is being written: renewing the lease now
        # could only race the write (and misread the completed job as a lost lease).
        self.settling = False
        self.lease_deadline = now + job_type.lease.total_seconds()
        self.started = now
        # Set while the handler runs, for the watchdog (see ``abandon_deadline``).
        self.handler_running = False
        self.timeout: timedelta | None = None
        self.abandon_after = 0.0
        self.stopped_at: float | None = None  # when the running handler was told to stop
        self.abandoned = False
        # The scope right around the handler: shielded once the handler is given up
        # on, so that the cancelled scopes around it stop cancelling it again on every
        # turn of the event loop (a handler that swallows CancelledError otherwise
        # spins a whole core for as long as it lives).
        self.guard = anyio.CancelScope() if guard is None else guard
        self.task: asyncio.Task[None] | None = None
        # The context the slot's task runs in, kept so that what is reported after
        # the task ended (a completion the batcher wrote later) is reported in it too:
        # an observer that set a context variable at the attempt's start (a tracing
        # span made current) resets it in the same context at its end.
        self.context: contextvars.Context | None = None
        self.watchdog: Watchdog[Slot] | None = None

    @property
    def lease(self) -> Lease:
        return self.acquired.lease

    @property
    def lease_duration(self) -> timedelta:
        return self.job_type.lease

    @property
    def staged(self) -> bool:
        return self.job_type.mode == "staged"

    def stop_cancelling(self) -> None:
        """The handler was given up on: it was told to stop; stop telling it."""
        self.guard.shield = True

    def renewed(self, deadline: float) -> None:
        self.lease_deadline = deadline

    def abort(self, reason: AbortReason) -> None:
        if self.attempt is not None:
            self.attempt.abort(reason)
        elif self.pending_abort is None:
            self.pending_abort = reason
        if self.handler_running:
            self._stop_requested()

    def _stop_requested(self) -> None:
        if self.stopped_at is None:
            self.stopped_at = time.monotonic()
            if self.watchdog is not None:
                self.watchdog.poke()

    def abandon_deadline(self) -> float | None:
        """When the watchdog gives up on this handler: ``abandon_after`` after it was
        told to stop, or after its timeout; None while it may run on."""
        if not self.handler_running or self.abandoned:
            return None
        if self.stopped_at is not None:
            return self.stopped_at + self.abandon_after
        if self.timeout is not None:
            return self.started + self.timeout.total_seconds() + self.abandon_after
        return None
