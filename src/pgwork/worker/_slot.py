"""One acquired job's bookkeeping while this worker holds it: ``Slot``.

What the lease renewer, the watchdog, admission and the attempt's runner
(``_runner``) all read and write about one attempt, and nothing that runs it, so every
one of them can import it without importing each other.

Stopping a handler (its timeout, an abort) is asyncio's own cancellation of the slot's
task, delivered once (``Slot.interrupt``), not an anyio cancel scope around the
handler. A cancelled anyio scope cancels its task again on every turn of the event
loop until the task leaves it, so a handler that swallowed the cancellation spun a
core, and the worker needed a second, shieldable scope inside the first to stop that
once it gave up on the handler; entering and leaving the two scopes was a quarter of
the worker's CPU per no-op job (`python -m bench --only drain`). The one thing a scope
gave that a plain ``Task.cancel`` does not, respecting an anyio ``CancelScope(shield=
True)`` the handler is inside, ``interrupt`` keeps by itself: it waits for the shield to
be left.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from datetime import timedelta
from typing import Any

from pgwork.adapters.state import AcquiredJob, Lease
from pgwork.job_types import JobType
from pgwork.records import AbortReason
from pgwork.worker._attempt import Attempt
from pgwork.worker._watchdog import Watchdog

_task_states: Any
try:  # where anyio keeps each task's innermost cancel scope (asyncio backend)
    from anyio._backends._asyncio import _task_states
except ImportError:  # pragma: no cover - a future anyio: shields are then not seen
    _task_states = None

__all__ = ["SHIELD_RECHECK_S", "Abandoned", "Slot", "in_anyio_shield"]

# How often an interruption waiting for a handler to leave an anyio shield looks again.
SHIELD_RECHECK_S = 0.005


def in_anyio_shield(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` is inside a shielded anyio cancel scope just now (which
    anyio's own cancellation would not reach, while ``Task.cancel`` would)."""
    if _task_states is None:
        return False
    state = _task_states.get(task)
    scope = state.cancel_scope if state is not None else None
    while scope is not None:
        if scope.shield:
            return True
        scope = getattr(scope, "_parent_scope", None)
    return False


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
        "handler_running",
        "handler_task",
        "interrupts",
        "job_type",
        "lease_deadline",
        "pending_abort",
        "recheck",
        "renewing",
        "settling",
        "settling_since",
        "started",
        "stop_at",
        "stopped_at",
        "task",
        "timed_out",
        "timeout",
        "watchdog",
    )

    def __init__(
        self,
        acquired: AcquiredJob,
        job_type: JobType[Any, Any],
        now: float | None = None,
        *,
        leased_at: float | None = None,
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
        self.settling_since = 0.0  # when ``settling`` was set (monotonic)
        # An atomic attempt whose handler runs (alone or in a group): its row is not
        # locked, so its lease is renewed like a staged attempt's.
        self.renewing = False
        # The database dates the lease from the acquire's transaction, which began
        # after the acquire was sent (``leased_at``) and maybe long before its answer
        # came (a server that hung, a stalled path): counted from the answer, a handler
        # could start on a lease another worker may already have reaped.
        self.lease_deadline = (now if leased_at is None else leased_at) + (
            job_type.lease.total_seconds()
        )
        self.started = now
        # Set while the handler runs, for the watchdog (see ``abandon_deadline``).
        self.handler_running = False
        self.timeout: timedelta | None = None
        self.abandon_after = 0.0
        self.stopped_at: float | None = None  # when the running handler was told to stop
        self.abandoned = False
        self.task: asyncio.Task[None] | None = None
        # The task the handler runs in (the slot's), and how often it was cancelled to
        # stop the handler and not yet taken back (at most once, see ``interrupt``).
        self.handler_task: asyncio.Task[Any] | None = None
        self.interrupts = 0
        self.timed_out = False  # the handler overran its timeout
        # When the running handler's timeout passes (monotonic; None: no timeout, or
        # not running): the watchdog stops it then (one timer per worker, not one per
        # attempt: uvloop's per-call timers were a tenth of a no-op atomic job's CPU).
        self.stop_at: float | None = None
        self.recheck: asyncio.TimerHandle | None = None  # see ``interrupt``
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

    def begin_settling(self) -> None:
        """The handler is done (returned, or given up on): its outcome is being
        written. Not renewed meanwhile, unless the write takes long (``Slots``)."""
        self.settling = True
        self.settling_since = time.monotonic()

    def stop_cancelling(self) -> None:
        """The handler ended, or was given up on: nothing is to stop it any more."""
        self.stop_at = None
        if self.recheck is not None:
            self.recheck.cancel()
            self.recheck = None

    def time_out(self) -> None:
        """The handler's timeout passed (told by the watchdog): stop it."""
        self.stop_at = None
        self.timed_out = True
        self._stop_requested()
        self.interrupt()

    def interrupt(self) -> None:
        """Cancel the running handler's task, once: asyncio's own cancellation, which
        a handler that swallows it is not given again (the watchdog gives up on it
        after ``abandon_after`` instead).

        Only while the handler runs, and so only while its task waits inside it
        (``handler_running`` is cleared, without a wait in between, as it returns):
        the worker's own code after the handler is never what is cancelled. From
        within the handler's own task, or while the handler is inside a shielded
        anyio scope, the cancellation waits (looked at again every
        ``SHIELD_RECHECK_S``) for the task to wait outside it.
        """
        self.recheck = None
        task = self.handler_task
        if not self.handler_running or self.abandoned or self.interrupts or task is None:
            return
        loop = task.get_loop()
        if in_anyio_shield(task) or task is asyncio.current_task(loop):
            self.recheck = loop.call_later(SHIELD_RECHECK_S, self.interrupt)
            return
        self.interrupts = 1
        task.cancel()

    def renewed(self, deadline: float) -> None:
        self.lease_deadline = deadline

    def abort(self, reason: AbortReason) -> None:
        if self.attempt is not None:
            self.attempt.abort(reason)
        elif self.pending_abort is None:
            self.pending_abort = reason
        if self.handler_running:
            self._stop_requested()
            self.interrupt()

    def _stop_requested(self) -> None:
        if self.stopped_at is None:
            self.stopped_at = time.monotonic()
            if self.watchdog is not None:
                self.watchdog.poke()

    def timeout_deadline(self) -> float | None:
        """When the running handler's timeout passes and it is to be stopped (None: no
        timeout, or it was stopped already)."""
        return self.stop_at if self.handler_running and not self.abandoned else None

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
