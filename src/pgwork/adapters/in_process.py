"""A notify adapter for one process: workers and clients sharing an event loop.

It cannot see the caller's transaction, so a notice is delivered at once, even if the
enqueueing transaction later rolls back, unless a ``notify_after_commit`` block holds
it until the transaction inside the block committed. A notice delivered early is
harmless (notices are hints: a woken worker finds nothing and waits again) but the
PostgreSQL adapter is the one to use when clients and workers live in different
processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pgwork.adapters.after_commit import held_notices
from pgwork.adapters.notify import Listener, Notice

__all__ = ["InProcessNotifyAdapter"]


class _InProcessListener:
    def __init__(self, receive: MemoryObjectReceiveStream[Notice]) -> None:
        self._receive = receive

    async def wait(self, timeout: float) -> list[Notice]:
        notices: list[Notice] = []
        with anyio.move_on_after(timeout):
            notices.append(await self._receive.receive())
        while True:
            try:
                notices.append(self._receive.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream):
                return notices


class InProcessNotifyAdapter:
    """Fan notices out to every open listener in this process."""

    def __init__(self, buffer: int = 1024) -> None:
        self._buffer = buffer
        self._subscribers: set[MemoryObjectSendStream[Notice]] = set()

    async def publish(self, tx: object | None, *, notices: Sequence[Notice]) -> None:
        held = held_notices() if tx is not None else None
        if held is not None:
            held.hold(self, notices)
            return
        await self.send_held(notices)

    async def send_held(self, notices: Sequence[Notice]) -> None:
        """Deliver ``notices`` now (what a ``notify_after_commit`` block held)."""
        for send in list(self._subscribers):
            for notice in notices:
                try:
                    send.send_nowait(notice)
                except anyio.WouldBlock:
                    break  # a full buffer already guarantees the listener wakes
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    self._subscribers.discard(send)
                    break

    @asynccontextmanager
    async def listen(self) -> AsyncIterator[Listener]:
        send, receive = anyio.create_memory_object_stream[Notice](self._buffer)
        self._subscribers.add(send)
        try:
            yield _InProcessListener(receive)
        finally:
            self._subscribers.discard(send)
            send.close()
            receive.close()

    async def close(self) -> None:
        for send in list(self._subscribers):
            send.close()
        self._subscribers.clear()
