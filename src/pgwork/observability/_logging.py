"""The observer that is on by default: events as stdlib ``logging`` records.

Each event becomes one record on the ``pgwork.events`` logger, at a level chosen by what
it means to an operator (a failed job is an ERROR, a completed one DEBUG), with the
event's fields as record attributes (``record.job_id``, ``record.event`` ...), so a JSON
formatter or a log shipper gets them structured without parsing the message.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

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
    HANDLER_ENDED_LATE,
    JOB_ENQUEUED,
    JOB_REAPED,
    LEASE_LOST,
    LISTENER_RECONNECTED,
    WORKER_STARTED,
    WORKER_STOPPED,
    Event,
    Observer,
)

__all__ = ["DEFAULT_LEVELS", "LoggingObserver", "default_observers"]

DEFAULT_LEVELS: Mapping[str, int] = {
    JOB_ENQUEUED: logging.DEBUG,
    ATTEMPT_STARTED: logging.DEBUG,
    ATTEMPT_COMPLETED: logging.DEBUG,
    ATTEMPT_RETRIED: logging.INFO,
    ATTEMPT_FAILED: logging.ERROR,
    ATTEMPT_ABORTED: logging.WARNING,
    ATTEMPT_ABANDONED: logging.ERROR,
    HANDLER_ENDED_LATE: logging.WARNING,
    JOB_REAPED: logging.WARNING,
    LEASE_LOST: logging.WARNING,
    WORKER_STARTED: logging.INFO,
    WORKER_STOPPED: logging.INFO,
    LISTENER_RECONNECTED: logging.INFO,
    ADAPTER_CALL_START: logging.DEBUG,
    ADAPTER_CALL_STOP: logging.DEBUG,
    ADAPTER_CALL_ERROR: logging.WARNING,
    DASHBOARD_ACTION: logging.INFO,
    DASHBOARD_AUTH_FAILED: logging.WARNING,
}
"""The level of each event's record; unknown names log at DEBUG."""

# Bulky or nested fields stay on the record but out of the one-line message.
_NOT_IN_MESSAGE = frozenset({"trace_context", "lease_token", "chain_id"})
# LogRecord's own attributes: a field with one of these names is stored as pgwork_<name>.
_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
}


class LoggingObserver:
    """Log every event on ``logger`` (default ``pgwork.events``).

    ``levels`` overrides the level per event name. An aborted attempt that was handed
    back on a worker stop is logged at INFO: stopping is not a problem.
    """

    def __init__(
        self,
        logger: logging.Logger | str = "pgwork.events",
        *,
        levels: Mapping[str, int] | None = None,
    ) -> None:
        self.logger = logging.getLogger(logger) if isinstance(logger, str) else logger
        self.levels = {**DEFAULT_LEVELS, **(levels or {})}

    def wants(self, name: str) -> bool:
        level = self.levels.get(name, logging.DEBUG)
        if name == ATTEMPT_ABORTED:
            level = min(level, logging.INFO)
        return self.logger.isEnabledFor(level)

    def on_event(self, event: Event) -> None:
        level = self.levels.get(event.name, logging.DEBUG)
        if event.name == ATTEMPT_ABORTED and event.fields.get("released"):
            level = min(level, logging.INFO)
        if not self.logger.isEnabledFor(level):
            return
        extra: dict[str, Any] = {"event": event.name}
        for key, value in event.fields.items():
            extra[f"pgwork_{key}" if key in _RESERVED else key] = value
        self.logger.log(level, "%s", _message(event), extra=extra)

    def __repr__(self) -> str:
        return f"LoggingObserver({self.logger.name!r})"


def _message(event: Event) -> str:
    parts = [f"pgwork {event.name}"]
    for key, value in event.fields.items():
        if key in _NOT_IN_MESSAGE or value is None:
            continue
        if isinstance(value, float):
            value = f"{value:.3f}"
        elif isinstance(value, tuple | list):
            value = ",".join(str(v) for v in value)
        parts.append(f"{key}={value}")
    return " ".join(parts)


def default_observers() -> tuple[Observer, ...]:
    """What ``observers=None`` means: one ``LoggingObserver`` on ``pgwork.events``."""
    return (LoggingObserver(),)
