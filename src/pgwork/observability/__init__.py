"""Observing pgwork: the event catalogue, observers, and an instrumented state adapter.

The client and the worker emit the events named in the catalogue (``JOB_ENQUEUED``,
``ATTEMPT_STARTED``, ...) to every observer given as ``observers=`` to
``create_client`` / ``create_in_process_worker``. Without ``observers=`` a
``LoggingObserver`` is used; ``observers=[]`` turns events off. See
docs/observability.md for every event's fields.
"""

from pgwork.observability._adapter import InstrumentedStateAdapter
from pgwork.observability._events import (
    ADAPTER_CALL_ERROR,
    ADAPTER_CALL_START,
    ADAPTER_CALL_STOP,
    ATTEMPT_ABANDONED,
    ATTEMPT_ABORTED,
    ATTEMPT_COMPLETED,
    ATTEMPT_FAILED,
    ATTEMPT_RETRIED,
    ATTEMPT_STARTED,
    DASHBOARD_ACTION,
    DASHBOARD_AUTH_FAILED,
    EVENT_NAMES,
    HANDLER_ENDED_LATE,
    JOB_ENQUEUED,
    JOB_REAPED,
    LEASE_LOST,
    LISTENER_RECONNECTED,
    WORKER_STARTED,
    WORKER_STOPPED,
    EnqueueTracer,
    Event,
    Observer,
)
from pgwork.observability._logging import DEFAULT_LEVELS, LoggingObserver, default_observers
from pgwork.observability._otel import OpenTelemetryObserver

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
    "DEFAULT_LEVELS",
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
    "InstrumentedStateAdapter",
    "LoggingObserver",
    "Observer",
    "OpenTelemetryObserver",
    "default_observers",
]
