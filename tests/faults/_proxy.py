"""A TCP proxy on 127.0.0.1 that can slow a network path down or stall it.

It stands between worker processes and the private server and fails the way a network
path can without a reset: it adds latency to every chunk in both directions, and it
can *stall*, forwarding nothing (and reading nothing) while every connection stays
open, until it is resumed. Neither side sees an error; the kernel still acknowledges
what was sent, so TCP keepalives and ``tcp_user_timeout`` cannot notice a stall
either: only a timeout in the application can. (A stalled peer is what a frozen
server, a hung middlebox or a full send buffer look like from the client.)

The proxy runs an asyncio loop in a daemon thread; the test calls its methods from
its own thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable

__all__ = ["Proxy", "via"]

CHUNK = 65536


def via(dsn: str, port: int) -> str:
    """``dsn`` (a 127.0.0.1 URI, as the private cluster's) pointed at ``port``."""
    head, sep, tail = dsn.partition("@127.0.0.1:")
    if not sep:
        raise ValueError(f"expected a postgresql://...@127.0.0.1:port/... DSN, got {dsn!r}")
    _, slash, rest = tail.partition("/")
    return f"{head}@127.0.0.1:{port}{slash}{rest}"


class Proxy:
    """Forward 127.0.0.1:``port`` to 127.0.0.1:``upstream``; see the module docstring."""

    def __init__(self, upstream: int, *, latency: float = 0.0) -> None:
        self.upstream = upstream
        self.latency = latency
        self.connections = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._flowing: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._gates: list[asyncio.Event] = []
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> Proxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def _call(self, fn: Callable[[], object]) -> None:
        done = threading.Event()

        def run() -> None:
            fn()
            done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(10)

    def stall(self) -> None:
        """Stop forwarding in both directions; every connection stays open."""
        assert self._flowing is not None
        self._call(self._flowing.clear)

    def resume(self) -> None:
        """Forward again, including what waited while stalled."""
        assert self._flowing is not None
        self._call(self._flowing.set)

    def blackhole(self) -> None:
        """Stop forwarding on every connection open now, for good, without closing any;
        new connections flow. What a network path that lost its state (a NAT or a load
        balancer dropping idle flows) does to the connections it carried."""
        self._call(lambda: [gate.clear() for gate in self._gates])

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        assert self._server is not None
        assert self._flowing is not None
        self._server.close()
        self._flowing.set()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        self.connections += 1
        await self._flowing.wait()  # a stalled path accepts but does not connect onwards
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            client_w.close()
            return
        self._writers.update((client_w, server_w))
        gate = asyncio.Event()
        gate.set()
        self._gates.append(gate)
        pumps = [
            asyncio.ensure_future(self._pump(client_r, server_w, gate)),
            asyncio.ensure_future(self._pump(server_r, client_w, gate)),
        ]
        self._tasks.update(pumps)
        try:
            # Either side closing ends the pair, as a plain TCP path would.
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pumps:
                task.cancel()
            for writer in (client_w, server_w):
                writer.close()
                self._writers.discard(writer)
            self._tasks.difference_update(pumps)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gate: asyncio.Event
    ) -> None:
        """Copy ``reader`` to ``writer``, each chunk ``latency`` late, nothing while
        stalled (or once ``gate`` is shut). Chunks in transit keep their order and their
        own due time, so latency delays a path without capping its throughput."""
        assert self._flowing is not None
        path = self._flowing

        async def flowing() -> None:
            await path.wait()
            await gate.wait()

        queue: deque[tuple[float, bytes]] = deque()
        arrived = asyncio.Event()
        eof = False

        async def read() -> None:
            nonlocal eof
            try:
                while True:
                    await flowing()
                    data = await reader.read(CHUNK)
                    if not data:
                        break
                    queue.append((time.monotonic() + self.latency, data))
                    arrived.set()
            except (ConnectionError, OSError):
                pass
            eof = True
            arrived.set()

        reading = asyncio.ensure_future(read())
        try:
            while True:
                if not queue:
                    if eof:
                        return
                    arrived.clear()
                    await arrived.wait()
                    continue
                due, data = queue[0]
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await flowing()
                queue.popleft()
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            return
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await reading
