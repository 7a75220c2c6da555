"""The one deadline of a stopping worker.

``stop()`` returns within ``grace_period + abandon_after`` and a moment for the last
writes (docs/workers.md), whatever the database does. Once the grace period is over
and the running attempts were aborted, the worker sets this deadline, and every wait
of its stop keeps it: for the slots to settle, for an acquire still in flight, for the
batcher's last writes, for the heartbeat's last beat.

Some of those waits are shielded, so that an ordinary cancellation does not cut a
write half-way (a completion the batcher is writing, say). A shield would also keep
the stop waiting on a statement the database never answers, up to the adapter's
``operation_timeout``; so the shields come from here, and the deadline cuts them too.
What is cut is left behind, as a killed worker leaves it: the lease lapses and a
reaper takes the job back.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import anyio

__all__ = ["StopDeadline"]


class StopDeadline:
    """When a stopping worker stops waiting (anyio's clock; none until it is set)."""

    __slots__ = ("_at", "_shields")

    def __init__(self) -> None:
        self._at = math.inf
        self._shields: set[anyio.CancelScope] = set()

    @property
    def is_set(self) -> bool:
        return self._at != math.inf

    def set_in(self, seconds: float) -> None:
        """The stop waits ``seconds`` more at most; the shields it cuts end then too."""
        self._at = min(self._at, anyio.current_time() + max(seconds, 0.0))
        for scope in self._shields:
            scope.deadline = min(scope.deadline, self._at)

    def left(self) -> float | None:
        """Seconds until the deadline (never negative); None while none is set."""
        if not self.is_set:
            return None
        return max(self._at - anyio.current_time(), 0.0)

    def cut(self, scope: anyio.CancelScope) -> None:
        """End ``scope`` (a task group's, say) at the deadline."""
        scope.deadline = min(scope.deadline, self._at)

    @contextmanager
    def shield(self) -> Iterator[anyio.CancelScope]:
        """A scope shielded from cancellation, but not from this deadline."""
        scope = anyio.CancelScope(shield=True, deadline=self._at)
        self._shields.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._shields.discard(scope)
