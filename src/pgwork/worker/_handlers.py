"""Refusing handlers and middlewares the worker cannot await, when the worker is built."""

from __future__ import annotations

import functools
import inspect

from pgwork.errors import SyncHandlerError

__all__ = ["require_async"]


def is_async_callable(value: object) -> bool:
    """Whether calling ``value`` gives a coroutine, as far as can be told without calling it:
    an ``async def`` (also behind ``functools.partial`` or marked with
    ``inspect.markcoroutinefunction``), or an object whose ``__call__`` is one."""
    while isinstance(value, functools.partial):
        value = value.func
    if inspect.iscoroutinefunction(value):
        return True
    if inspect.isfunction(value) or inspect.ismethod(value) or inspect.isbuiltin(value):
        return False
    call = getattr(type(value), "__call__", None)  # noqa: B004 - the type's, as a call does
    return call is not None and inspect.iscoroutinefunction(call)


def require_async(value: object, type_name: str, role: str = "handler") -> None:
    """SyncHandlerError unless ``value`` is an async callable.

    A plain ``def`` would run its side effects on every attempt before the worker
    failed to await its result, so it is refused before any job is taken. A ``def``
    that returns a coroutine is refused too: nothing tells it from a sync function
    without calling it."""
    if not is_async_callable(value):
        raise SyncHandlerError(type_name, value, role)
