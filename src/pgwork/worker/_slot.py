"""One acquired job's bookkeeping while this worker holds it: ``Slot``.

What the lease renewer, the watchdog, admission and the attempt's runner and steps
(``_runner``, ``_steps``) all read and write about one attempt, and nothing that runs
it, so every one of them can import it without importing each other.

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

A slot's life is ``SlotState``: one enum, one table of the moves allowed
(``TRANSITIONS``), applied by ``Slot.move`` and nowhere else. The table also says what
a move means to the rest of the worker: leaving a state that holds one of the
worker's ``max_slots`` places (``OCCUPYING``) for one that does not gives the place to
the next job (``SlotOwner.freed``), and the states a lease is renewed in are
``lease_renewed``'s. docs/design/slots.md draws it.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import time
from collections.abc import Coroutine, Mapping
from datetime import timedelta
from typing import Any, Protocol

from pgwork.adapters.state import AcquiredJob, Lease
from pgwork.job_types import JobType
from pgwork.records import AbortReason
from pgwork.worker._attempt import Attempt
from pgwork.worker._side.watchdog import Watchdog

_task_states: Any
try:  # where anyio keeps each task's innermost cancel scope (asyncio backend)
    from anyio._backends._asyncio import _task_states
except ImportError:  # pragma: no cover - a future anyio: shields are then not seen
    _task_states = None

__all__ = [
    "OCCUPYING",
    "SHIELD_RECHECK_S",
    "TRANSITIONS",
    "Abandoned",
    "Slot",
    "SlotOwner",
    "SlotState",
    "SlotStateError",
    "in_anyio_shield",
]

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


class SlotState(enum.Enum):
    """Where one acquired job is in its life on this worker."""

    WAITING = "waiting"
    """Acquired and leased, waiting for a free slot (prefetched). Renewed."""
    STARTING = "starting"
    """Given a slot: its lease is checked (renewed first when little is left), its
    transaction opened. Not renewed meanwhile: this takes a moment, and a staged start
    renews a short lease itself."""
    JOINING = "joining"
    """A grouped atomic attempt waiting for its lane and entering its group (which can
    take a group's commit). Renewed."""
    RUNNING = "running"
    """Its handler runs. Renewed; watched for its timeout and, once told to stop, for
    giving up on it."""
    FINISHING = "finishing"
    """The handler is done and the outcome is written while the slot stays taken (an
    atomic attempt writes in its own transaction; a refused or failed start settles).
    Renewed once the write has waited a sixth of the lease."""
    SETTLING = "settling"
    """The slot went to the next job; the outcome is still being written (the batcher's
    next statement, a group's commit, a failure). Renewed as ``FINISHING`` is."""
    ABANDONED = "abandoned"
    """The handler ignored being stopped and was given up on: the slot went to the next
    job, the attempt is settled without it, and its task runs on detached until it
    ends. Final: the handler's end must still tell that it was given up on."""
    DONE = "done"
    """Settled; the worker lets the job go. Final."""


_S = SlotState

TRANSITIONS: Mapping[SlotState, frozenset[SlotState]] = {
    _S.WAITING: frozenset({_S.STARTING, _S.DONE}),  # DONE: handed back, the worker stopping
    _S.STARTING: frozenset({_S.JOINING, _S.RUNNING, _S.FINISHING, _S.SETTLING, _S.DONE}),
    _S.JOINING: frozenset({_S.RUNNING, _S.FINISHING, _S.DONE}),
    _S.RUNNING: frozenset({_S.FINISHING, _S.SETTLING, _S.ABANDONED}),
    _S.FINISHING: frozenset({_S.SETTLING, _S.DONE}),
    _S.SETTLING: frozenset({_S.DONE}),
    _S.ABANDONED: frozenset(),
    _S.DONE: frozenset(),
}
"""The moves a slot may make. STARTING (or JOINING) goes to FINISHING or SETTLING
without running its handler when the attempt was aborted before it could start, and
to DONE when nothing is left to write (refused, or the start failed)."""

OCCUPYING = frozenset({_S.STARTING, _S.JOINING, _S.RUNNING, _S.FINISHING})
"""The states that hold one of the worker's ``max_slots`` places."""

# Renewed once the outcome has waited this share of its lease to be written: the
# renewer ticks every third of a lease, so the lease is renewed at least a sixth of it
# before it could lapse, while an outcome written at once never meets a renewal.
_SETTLING_SHARE = 1 / 6

_RENEWED = frozenset({_S.WAITING, _S.JOINING, _S.RUNNING})
_RENEWED_IF_LONG = frozenset({_S.FINISHING, _S.SETTLING, _S.ABANDONED})


class SlotStateError(RuntimeError):
    """A slot was moved in a way its life does not allow: a bug in the worker."""


class SlotOwner(Protocol):
    """Who holds the slots (``_slots.Slots``): told when a move gives a slot's place to
    the next job, and when an attempt settled after its task ended is done."""

    def freed(self, slot: Slot) -> None: ...

    def settled(self, slot: Slot, then: Coroutine[Any, Any, None] | None) -> None: ...


class Abandoned(Exception):
    """Ends the task of a handler the worker gave up on, once the handler ends: the
    attempt was settled without it (see ``_watchdog``)."""


class Slot:
    """One running attempt's bookkeeping; also the renewer's LeaseHolder."""

    __slots__ = (
        "abandon_after",
        "acquired",
        "attempt",
        "context",
        "handler_task",
        "interrupts",
        "job_type",
        "lease_deadline",
        "owner",
        "pending_abort",
        "recheck",
        "since",
        "started",
        "state",
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
        owner: SlotOwner,
        watchdog: Watchdog[Slot] | None = None,
    ) -> None:
        if now is None:
            now = time.monotonic()
        self.acquired = acquired
        self.job_type = job_type
        self.owner = owner
        self.watchdog = watchdog
        self.state = SlotState.WAITING
        self.since = now  # when it entered ``state`` (monotonic), for the states that ask
        self.attempt: Attempt[Any, Any] | None = None
        self.pending_abort: AbortReason | None = None
        # The database dates the lease from the acquire's transaction, which began
        # after the acquire was sent (``leased_at``) and maybe long before its answer
        # came (a server that hung, a stalled path): counted from the answer, a handler
        # could start on a lease another worker may already have reaped.
        self.lease_deadline = (now if leased_at is None else leased_at) + (
            job_type.lease.total_seconds()
        )
        self.started = now
        self.timeout: timedelta | None = None
        self.abandon_after = 0.0
        self.stopped_at: float | None = None  # when the running handler was told to stop
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

    def move(self, to: SlotState) -> None:
        """Move to state ``to``, as ``TRANSITIONS`` allows (else ``SlotStateError``);
        leaving a place-holding state for one that holds none gives the place to the
        next job (``SlotOwner.freed``)."""
        was = self.state
        if to not in TRANSITIONS[was]:
            raise SlotStateError(
                f"job {self.acquired.id}'s slot cannot go from {was.value} to {to.value}"
            )
        self.state = to
        if to in _RENEWED_IF_LONG:
            self.since = time.monotonic()
        if was in OCCUPYING and to not in OCCUPYING:
            self.owner.freed(self)

    @property
    def running(self) -> bool:
        """Whether its handler runs (and may be stopped, or given up on)."""
        return self.state is SlotState.RUNNING

    @property
    def abandoned(self) -> bool:
        return self.state is SlotState.ABANDONED

    @property
    def settling(self) -> bool:
        """Its outcome is being written (or was): a lease not renewed now is no loss to
        report, as the write tells what came of the attempt."""
        return self.state in _RENEWED_IF_LONG or self.state is SlotState.DONE

    def lease_renewed(self, now: float) -> bool:
        """Whether the renewer keeps this lease alive now: while it waits for a slot,
        joins a group or runs its handler, and once its outcome has waited a sixth of
        the lease to be written (the pool refilling after an outage, say); an outcome
        written at once is not renewed meanwhile, as that renewal would only race the
        write."""
        state = self.state
        if state in _RENEWED:
            return True
        return (
            state in _RENEWED_IF_LONG
            and now - self.since > self.job_type.lease.total_seconds() * _SETTLING_SHARE
        )

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

        Only while the handler runs, and so only while its task waits inside it (the
        slot leaves ``RUNNING``, without a wait in between, as it returns):
        the worker's own code after the handler is never what is cancelled. From
        within the handler's own task, or while the handler is inside a shielded
        anyio scope, the cancellation waits (looked at again every
        ``SHIELD_RECHECK_S``) for the task to wait outside it.
        """
        self.recheck = None
        task = self.handler_task
        if self.state is not SlotState.RUNNING or self.interrupts or task is None:
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
        if self.state is SlotState.RUNNING:
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
        return self.stop_at if self.state is SlotState.RUNNING else None

    def abandon_deadline(self) -> float | None:
        """When the watchdog gives up on this handler: ``abandon_after`` after it was
        told to stop, or after its timeout; None while it may run on."""
        if self.state is not SlotState.RUNNING:
            return None
        if self.stopped_at is not None:
            return self.stopped_at + self.abandon_after
        if self.timeout is not None:
            return self.started + self.timeout.total_seconds() + self.abandon_after
        return None
