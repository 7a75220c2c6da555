"""The catalogue of events pgwork emits, and how they reach observers.

Every name below is emitted from the layer its docstring names (client, worker, the
instrumented state adapter, or the dashboard; ``job.enqueued`` from the client and the
worker) with the fields its docstring lists. Fields common to
attempt events: ``job_id``, ``chain_id``, ``job_type``, ``queue``, ``attempt``,
``max_attempts``, ``worker_id``, ``lease_token``; settlement events add ``duration_s``
(seconds since the attempt started, on the worker's monotonic clock). Names are stable:
renaming one is a breaking change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "ADAPTER_CALL_ERROR",
    "ADAPTER_CALL_START",
    "ADAPTER_CALL_STOP",
    "ATTEMPT_ABANDONED",
    "ATTEMPT_ABORTED",
    "ATTEMPT_COMPLETED",
    "ATTEMPT_FAILED",
    "ATTEMPT_RETRIED",
    "ATTEMPT_STARTED",
    "DASHBOARD_ACTION",
    "DASHBOARD_AUTH_FAILED",
    "EVENT_NAMES",
    "HANDLER_ENDED_LATE",
    "JOB_ENQUEUED",
    "JOB_REAPED",
    "LEASE_LOST",
    "LISTENER_RECONNECTED",
    "WORKER_STARTED",
    "WORKER_STOPPED",
    "EnqueueTracer",
    "Event",
    "Observer",
]

# --- the catalogue -------------------------------------------------------------------

JOB_ENQUEUED = "job.enqueued"
"""A chain was started (client, worker). One event per chain. By ``start_chain(s)``
(client): emitted after the insert and before the caller commits, so the job exists
only once the caller's transaction commits. By a handler's ``attempt.start_chain``
(worker): emitted once the attempt's completion, which writes the child, committed;
never for an attempt that failed, was rolled back or lost its lease. Fields:
``job_id``, ``chain_id``, ``job_type``, ``queue``, ``deduplicated`` (an existing chain
was returned), ``scheduled`` (not runnable now)."""

ATTEMPT_STARTED = "attempt.started"
"""A worker is about to run a handler (worker). Fields: the attempt fields, ``mode``
(``staged``/``atomic``), ``queued_s`` (from the job's ``scheduled_at`` to its acquisition,
both on the database clock) and ``trace_context`` (the carrier stored at enqueue, or
None)."""

ATTEMPT_COMPLETED = "attempt.completed"
"""The attempt's outcome was written (worker; in atomic mode after the commit).
Fields: the attempt fields, ``duration_s``, ``outcome`` (``completed``, ``continued``
or ``rescheduled``) and ``continued_with`` (the next job type, or None)."""

ATTEMPT_FAILED = "attempt.failed"
"""The job failed for good: its last attempt raised, or its input could not be decoded
(worker). Fields: the attempt fields, ``duration_s``, ``error_type``,
``error_message``, and ``settled`` (False when the failure could not be recorded: the
lease then expires and the job is reaped)."""

ATTEMPT_RETRIED = "attempt.retried"
"""The attempt raised, or its outcome could not be written, and the job will run again
(worker). Also for a grouped atomic attempt whose group was lost before its commit:
the job goes back to its queue without the attempt counting (``retry_in_s`` 0).
Fields: the attempt fields, ``duration_s``, ``error_type``, ``error_message``,
``retry_in_s``."""

ATTEMPT_ABORTED = "attempt.aborted"
"""The handler was stopped before it returned (worker). Fields: the attempt fields,
``duration_s``, ``reason`` (an ``AbortReason`` value) and ``released`` (True when the
job went back to the queue without burning the attempt, on a worker stop)."""

ATTEMPT_ABANDONED = "attempt.abandoned"
"""A handler did not end within ``abandon_after`` of being told to stop (its timeout
fired, or it was aborted) and the worker stopped waiting for it (worker): its slot is
freed and its lease no longer renewed; after a timeout or a stop the attempt is
failed with ``HandlerAbandonedError`` (retried or failed for good as usual). The
coroutine may still run; what it does later is discarded. Fields: the attempt fields,
``duration_s``, ``cause`` (``timeout after ...`` or an ``AbortReason`` value) and
``waited_s`` (from the timeout or abort until it was abandoned)."""

HANDLER_ENDED_LATE = "handler.ended_late"
"""A handler abandoned earlier (see ``attempt.abandoned``) ended at last (worker); what
it returned or raised was discarded. Until then it counted among the worker's
``abandoned_handlers`` (heartbeat, ``pgwork workers``, the OpenTelemetry up-down
counter ``pgwork.worker.abandoned_handlers``). Fields: ``job_id``, ``worker_id``,
``late_s`` (from being abandoned until it ended), ``outcome``."""

JOB_REAPED = "job.reaped"
"""A worker took back a job whose lease had expired on another worker (worker).
Fields: ``job_id``, ``job_type``, ``attempt``, ``status`` (now ``pending`` or
``failed``), ``previous_worker``, ``worker_id``."""

LEASE_LOST = "lease.lost"
"""This worker no longer holds a job it was running: a fenced write was refused or the
attempt was aborted for lost ownership (worker). Nothing was written. Fields: the
attempt fields, ``action`` (``completion``, ``failure`` or ``renewal``)."""

WORKER_STARTED = "worker.started"
"""A worker is listening and about to take jobs (worker). Fields: ``worker_id``,
``job_types``, ``queues``, ``max_slots``."""

WORKER_STOPPED = "worker.stopped"
"""A worker's main loop ended and its in-flight attempts are settled (worker).
Fields: ``worker_id``, ``error`` (what stopped it, or None after ``stop()``)."""

LISTENER_RECONNECTED = "listener.reconnected"
"""The notification listener reconnected after losing its connection; the worker
fetches at once instead of trusting the gap (worker). Fields: ``worker_id``."""

ADAPTER_CALL_START = "adapter.call.start"
"""An instrumented state adapter operation began (``InstrumentedStateAdapter``).
Fields: ``operation`` (the method name)."""

ADAPTER_CALL_STOP = "adapter.call.stop"
"""An instrumented state adapter operation returned. Fields: ``operation``,
``duration_s``."""

ADAPTER_CALL_ERROR = "adapter.call.error"
"""An instrumented state adapter operation raised. Fields: ``operation``,
``duration_s``, ``error_type``, ``error_message``."""

DASHBOARD_ACTION = "dashboard.action"
"""An operator tried an action from the dashboard (dashboard), whatever came of it.
Fields: ``action`` (``retry``, ``cancel``, ``delete``, ``pause``, ``resume``),
``user`` (the Basic user name, ``bearer``, or None without credentials), ``client``
(the address the request came from), ``ids`` (the job or chain ids, or the queue
name, as given), ``outcome`` (``done``; ``refused`` when the client refused it, with
its reason in ``message``; ``forbidden`` when the request was not allowed to act:
read-only, a bad CSRF token, or another site's page) and ``message``."""

DASHBOARD_AUTH_FAILED = "dashboard.auth_failed"
"""A request to the dashboard carried credentials that were refused, or came from a
client locked out after too many such failures (dashboard). Fields: ``user`` (the user
name it claimed, ``bearer``, or None), ``client``, ``path``, ``locked`` (True when this
failure, or an earlier one, keeps the client out for ``retry_after_s`` seconds) and
``retry_after_s``."""

EVENT_NAMES: frozenset[str] = frozenset(
    {
        JOB_ENQUEUED,
        ATTEMPT_STARTED,
        ATTEMPT_COMPLETED,
        ATTEMPT_FAILED,
        ATTEMPT_RETRIED,
        ATTEMPT_ABORTED,
        ATTEMPT_ABANDONED,
        HANDLER_ENDED_LATE,
        JOB_REAPED,
        LEASE_LOST,
        WORKER_STARTED,
        WORKER_STOPPED,
        LISTENER_RECONNECTED,
        ADAPTER_CALL_START,
        ADAPTER_CALL_STOP,
        ADAPTER_CALL_ERROR,
        DASHBOARD_ACTION,
        DASHBOARD_AUTH_FAILED,
    }
)
"""Every name in the catalogue."""

# --- events and observers ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened: a catalogue ``name``, the wall-clock ``time`` (UTC) it
    was emitted, and its ``fields`` (read-only)."""

    name: str
    time: datetime
    fields: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]


@runtime_checkable
class Observer(Protocol):
    """Receives every event. ``on_event`` runs synchronously in the emitting task, so it
    must be quick and must not block; an exception it raises is logged and ignored.

    An observer may also define ``wants(name) -> bool``: when every observer says no
    to an event, it is not even built (a worker emits several per job, and building
    one costs more than running a no-op job's handler)."""

    def on_event(self, event: Event) -> None: ...


@runtime_checkable
class EnqueueTracer(Protocol):
    """An observer that also traces enqueues (the OpenTelemetry observer does).

    The client enters ``trace_enqueue`` around each ``start_chain(s)`` call; the mapping
    it yields (a propagation carrier, or None) is stored in every new job's row and
    handed back in ``attempt.started`` as ``trace_context``.
    """

    def trace_enqueue(
        self, job_types: Sequence[str]
    ) -> AbstractContextManager[Mapping[str, str] | None]: ...
