"""The main loop's bell: whoever has news for the loop rings it.

A slot freed or let go, an acquire back, a notice heard, a stop asked for: each rings
the bell, and the loop, waiting between turns (``_loop.InProcessWorker._wait``), takes
its next turn. The news itself stays where it is (the slots, the fetcher's arrivals,
``Wakeups``); the bell only says to look. asyncio's event, not anyio's: it is rung
about twice per job, and anyio's wrapper cost more than the event.
"""

from __future__ import annotations

import asyncio

__all__ = ["Bell"]


class Bell:
    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def ring(self) -> None:
        self._event.set()

    @property
    def rung(self) -> bool:
        """Rung since the loop last ``clear``-ed it."""
        return self._event.is_set()

    def clear(self) -> None:
        """The loop is taking a turn: what rings from now on calls for another."""
        self._event.clear()

    async def wait(self) -> None:
        await self._event.wait()
