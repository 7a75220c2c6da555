"""Telling async handlers from sync ones, and refusing what the worker cannot run, when
the worker is built."""

from __future__ import annotations

import collections.abc
import functools
import inspect
import typing
from typing import Literal

from pgwork.errors import SyncHandlerError

__all__ = ["handler_kind", "is_async_callable", "require_async"]

# Return annotations that say a plain ``def`` hands back something to await.
_AWAITABLE_ORIGINS = (collections.abc.Awaitable, collections.abc.Coroutine)
_AWAITABLE_NAMES = ("Awaitable", "Coroutine", "Future", "Task")


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
    """SyncHandlerError unless ``value`` is an async callable (what a middleware must be:
    it wraps the attempt on the event loop)."""
    if not is_async_callable(value):
        raise SyncHandlerError(type_name, value, role)


def handler_kind(handler: object, type_name: str) -> Literal["async", "sync"]:
    """``"async"`` for an async callable, ``"sync"`` for a plain one (run on the
    worker's threads); SyncHandlerError for what neither can be.

    Refused: what is not callable, a generator or async generator function, and a
    plain ``def`` whose return annotation says it returns something to await (a
    ``Coroutine``, ``Awaitable``, ``Future`` or ``Task``): run on a thread, what it
    returns would never be awaited. A ``def`` that returns a coroutine without saying
    so cannot be told from a sync function without calling it: it is run as a sync
    handler, and its attempt fails with SyncHandlerError (the coroutine closed, never
    run)."""
    if is_async_callable(handler):
        return "async"
    if not callable(handler):
        raise SyncHandlerError(
            type_name, handler, reason="is not callable: give a function (`def` or `async def`)"
        )
    target: object = handler
    while isinstance(target, functools.partial):
        target = target.func
    if not (inspect.isfunction(target) or inspect.ismethod(target)):
        target = getattr(type(target), "__call__", target)  # noqa: B004 - as a call does
    if inspect.isasyncgenfunction(target) or inspect.isgeneratorfunction(target):
        raise SyncHandlerError(
            type_name,
            handler,
            reason="is a generator function: a handler returns its output (or raises)",
        )
    if _returns_awaitable(target):
        raise SyncHandlerError(
            type_name,
            handler,
            reason=(
                "is a plain `def` annotated to return something to await: the worker runs "
                "a plain `def` handler on a thread and does not await what it returns. "
                "Declare it with `async def`"
            ),
        )
    return "sync"


def _returns_awaitable(function: object) -> bool:
    try:
        annotation = inspect.signature(function).return_annotation  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    if annotation is inspect.Signature.empty:
        return False
    if isinstance(annotation, str):  # ``from __future__ import annotations``
        head = annotation.split("[", 1)[0].rsplit(".", 1)[-1].strip()
        return head in _AWAITABLE_NAMES
    origin = typing.get_origin(annotation) or annotation
    return isinstance(origin, type) and issubclass(origin, _AWAITABLE_ORIGINS)
