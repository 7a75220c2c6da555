"""Counting the acquiring calls a worker makes on its store: what ``--count-acquires``
reports (bench/_worker_process.py) and what the hint tests count
(tests/engine/test_wakeup_hints.py). An acquire that comes back empty counts too."""

from __future__ import annotations

import contextvars
from typing import Any

__all__ = ["ACQUIRING", "AcquireCount"]

# The store's operations that acquire jobs, each one statement.
ACQUIRING = ("acquire", "complete_and_acquire", "acquire_limited")


class AcquireCount:
    """Counts the acquiring calls made on the stores it wraps: each store's own methods
    are replaced, so the worker, which holds the same object, goes through them. One
    operation may call another of them on the same store (a turn without completions
    is a plain ``acquire``): only the outermost call of a task counts."""

    def __init__(self, *states: Any) -> None:
        self.calls = 0
        self._inside: contextvars.ContextVar[bool] = contextvars.ContextVar(
            "acquiring", default=False
        )
        for state in states:
            self.wrap(state)

    def wrap(self, state: Any) -> None:
        for name in ACQUIRING:
            original = getattr(state, name, None)
            if original is not None:
                setattr(state, name, self._counted(original))

    def _counted(self, original: Any) -> Any:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            if self._inside.get():
                return await original(*args, **kwargs)
            self.calls += 1
            token = self._inside.set(True)
            try:
                return await original(*args, **kwargs)
            finally:
                self._inside.reset(token)

        return counted
