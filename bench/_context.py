"""What every pgwork workload gets, and how it waits for a counter."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from bench._env import PgworkDatabases
from bench._pgwork_app import Counter
from bench._plan import Sizes
from bench._progress import Bar, Bars

__all__ = ["LIB", "WAIT_LIMIT", "Context", "follow"]

LIB = "pgwork"
WAIT_LIMIT = 900.0


@dataclass
class Context:
    """What a workload gets. ``isolated``: run enqueue and drain in a process of pgwork's
    own (as peers run), not in the harness's."""

    dbs: PgworkDatabases
    bars: Bars
    sizes: Sizes
    isolated: bool = False

    @property
    def where(self) -> str:
        return (
            "a process of its own (garbage collector tuned as `pgwork worker` does)"
            if self.isolated
            else "the harness's process"
        )


async def follow(counter: Counter, bar: Bar, count: Callable[[], int] | None = None) -> None:
    """Move ``bar`` along with ``counter`` until it reaches its target."""
    deadline = time.monotonic() + WAIT_LIMIT
    while not counter.done.is_set():
        with anyio.move_on_after(0.1):
            await counter.done.wait()
        bar.set(count() if count else counter.count)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{counter.count}/{counter.target} jobs after {WAIT_LIMIT:.0f}s")
