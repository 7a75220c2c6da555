"""Attempt middlewares: ``async def mw(attempt, call_next)`` onions around a handler.

The first middleware declared is the outermost: it sees the attempt first and the
result (or exception) last. ``compose`` is the one place that defines that order.
The shipped ``log_context`` middleware puts the attempt's identity into context
variables that ``LogContextFilter`` copies onto every stdlib ``logging`` record
emitted while the handler runs, so handler logs need no extra arguments.

Users import these names from ``pgwork`` or ``pgwork.middleware``, which re-export them.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgwork.worker._attempt import Attempt

__all__ = [
    "CallNext",
    "LogContextFilter",
    "Middleware",
    "compose",
    "current_log_context",
    "log_context",
]

CallNext = Callable[["Attempt[Any, Any]"], Awaitable[Any]]
Middleware = Callable[["Attempt[Any, Any]", CallNext], Awaitable[Any]]


def compose(middlewares: Sequence[Middleware], handler: CallNext) -> CallNext:
    """Wrap ``handler`` so ``middlewares[0]`` runs outermost."""
    call: CallNext = handler
    for middleware in reversed(middlewares):
        call = _bind(middleware, call)
    return call


def _bind(middleware: Middleware, call_next: CallNext) -> CallNext:
    async def call(attempt: Attempt[Any, Any]) -> Any:
        return await middleware(attempt, call_next)

    return call


_LOG_CONTEXT: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "pgwork_log_context", default=None
)


def current_log_context() -> dict[str, Any]:
    """The attempt fields bound by ``log_context`` in this task (empty outside one)."""
    return dict(_LOG_CONTEXT.get() or {})


async def log_context(attempt: Attempt[Any, Any], call_next: CallNext) -> Any:
    """Bind job id, type, chain, attempt number, worker id and the job's ``context``
    (given at enqueue, ``{}`` when none) for the handler's logs."""
    token = _LOG_CONTEXT.set(
        {
            "job_id": str(attempt.job.id),
            "job_type": attempt.job.type_name,
            "chain_id": str(attempt.job.chain_id),
            "attempt": attempt.job.attempt,
            "worker_id": attempt.worker_id,
            "context": dict(attempt.job.context or {}),
        }
    )
    try:
        return await call_next(attempt)
    finally:
        _LOG_CONTEXT.reset(token)


class LogContextFilter(logging.Filter):
    """Copy the bound attempt fields onto each record (``record.job_id`` etc.).

    ``record.context`` is the job's enqueue context (a dict); each of its keys is also
    set as an attribute of its own (``%(request_id)s``) unless the record already has
    one by that name. Outside an attempt a field the record does not carry already
    (pgwork's event records carry their own) is set to ``"-"``, so format strings that
    name them never fail.
    """

    FIELDS = ("job_id", "job_type", "chain_id", "attempt", "worker_id", "context")

    def filter(self, record: logging.LogRecord) -> bool:
        bound = _LOG_CONTEXT.get() or {}
        for name in self.FIELDS:
            if name in bound:
                setattr(record, name, bound[name])
            elif not hasattr(record, name):
                setattr(record, name, "-")
        for key, value in (bound.get("context") or {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True
