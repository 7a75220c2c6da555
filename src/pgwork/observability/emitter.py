"""The emitter: how the client's and the worker's events reach their observers.

Internal to pgwork (the client, the worker, the dashboard and the instrumented adapter
each hold one) and not re-exported by ``pgwork.observability``; the catalogue of
events and the ``Observer`` protocol it serves are in ``pgwork.observability``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from pgwork.observability._events import EnqueueTracer, Event, Observer

__all__ = ["Emitter"]

log = logging.getLogger("pgwork.observability")


class _NoTrace:
    """``Emitter.trace_enqueue`` without tracers: enters to None, swallows nothing."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_TRACE = _NoTrace()


class Emitter:
    """Fans events out to observers. Internal: the client and the worker each hold one."""

    __slots__ = ("_filters", "_observers", "_tracers")

    def __init__(self, observers: Iterable[Observer]) -> None:
        self._observers = tuple(observers)
        self._tracers = tuple(o for o in self._observers if isinstance(o, EnqueueTracer))
        # None: some observer takes every event.
        filters = [getattr(o, "wants", None) for o in self._observers]
        self._filters: tuple[Callable[[str], bool], ...] | None = (
            None if any(f is None for f in filters) else tuple(f for f in filters if f)
        )

    def wants(self, name: str) -> bool:
        """Whether any observer would receive an event called ``name`` now."""
        filters = self._filters
        if filters is None:
            return True
        if len(filters) == 1:
            # The usual case (the default logging observer alone), asked twice per
            # attempt: a generator for ``any`` cost more than the question.
            return filters[0](name)
        return any(wanted(name) for wanted in filters)

    @property
    def observers(self) -> tuple[Observer, ...]:
        return self._observers

    def __bool__(self) -> bool:
        return bool(self._observers)

    def emit(self, name: str, /, **fields: Any) -> None:
        if not self._observers or not self.wants(name):
            return
        event = Event(name, datetime.now(UTC), MappingProxyType(fields))
        for observer in self._observers:
            try:
                observer.on_event(event)
            except Exception:
                log.exception("pgwork observer %r failed on %s", observer, name)

    def trace_enqueue(
        self, job_types: Sequence[str]
    ) -> AbstractContextManager[Mapping[str, str] | None]:
        """Enter every tracer's enqueue span; yield their carriers merged (or None).

        Without a tracer (the default) a shared context manager that does nothing: a
        generator's set-up and tear-down on every ``start_chain`` cost more than the
        rest of the call's bookkeeping."""
        if not self._tracers:
            return _NO_TRACE
        return self._traced(job_types)

    @contextmanager
    def _traced(self, job_types: Sequence[str]) -> Iterator[Mapping[str, str] | None]:
        with ExitStack() as stack:
            carrier: dict[str, str] = {}
            for tracer in self._tracers:
                try:
                    entered = stack.enter_context(tracer.trace_enqueue(job_types))
                    carrier.update(entered or {})
                except Exception:
                    log.exception("pgwork tracer %r failed to open an enqueue span", tracer)
            yield carrier or None
