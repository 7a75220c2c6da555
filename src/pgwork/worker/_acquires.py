"""The acquires a worker has out, and the main loop's decisions to send them.

The fetcher (``_fetch``) sends acquires and records each going out and coming back;
the batcher (``_batch``) asks, before writing completions with a statement of its
own, whether an acquire will take them along instead (``hold_completions``). Both are
given this one record when they are made, so neither needs the other.
"""

from __future__ import annotations

import asyncio

__all__ = ["Acquires"]


class Acquires:
    """How many acquires are in flight and whether the loop has decided since the last
    came back; ``filling`` ends when the worker stops taking jobs."""

    __slots__ = ("_decided_after", "_filled", "_idle", "filling", "finished", "in_flight")

    def __init__(self) -> None:
        self.in_flight = 0
        self.finished = 0  # acquires that came back (or failed) so far
        self.filling = True
        self._idle = asyncio.Event()
        self._idle.set()
        # Set (and replaced) each time the loop decided whether to acquire, with how
        # many acquires had come back then.
        self._filled = asyncio.Event()
        self._decided_after = 0

    def sent(self) -> None:
        self.in_flight += 1
        if self._idle.is_set():
            self._idle = asyncio.Event()

    def came_back(self) -> None:
        self.finished += 1
        self.in_flight -= 1
        if not self.in_flight:
            self._idle.set()

    def decided(self) -> None:
        """The loop decided whether to send an acquire (it may have sent none)."""
        self._decided_after = self.finished
        self._filled.set()
        self._filled = asyncio.Event()

    def stop_filling(self) -> None:
        self.filling = False
        self._filled.set()

    async def idle(self) -> None:
        """Return once no acquire is in flight."""
        await self._idle.wait()

    async def hold_completions(self) -> None:
        """Return once no acquire will take the waiting completions along: none is in
        flight, and the loop has decided (not) to send one since the last came back."""
        while self.filling:
            if self.in_flight:
                await self.idle()
            elif self._decided_after >= self.finished:
                return
            else:
                await self._filled.wait()
