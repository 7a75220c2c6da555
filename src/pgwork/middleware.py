"""Attempt middlewares: ``async def mw(attempt, call_next)`` onions around a handler.

The public name of ``pgwork.worker.middleware``, where the worker defines them; this
module only re-exports. ``CallNext`` (the type of ``call_next``) is here for typing a
middleware of your own; the rest is also exported by ``pgwork``.
"""

from pgwork.worker.middleware import (
    CallNext,
    LogContextFilter,
    Middleware,
    compose,
    current_log_context,
    log_context,
)

__all__ = [
    "CallNext",
    "LogContextFilter",
    "Middleware",
    "compose",
    "current_log_context",
    "log_context",
]
