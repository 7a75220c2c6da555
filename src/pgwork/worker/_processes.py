"""The worker's own processes for CPU-bound handlers: ``HandlerProcesses``.

A CPU-bound handler holds the GIL: on a thread it would slow the event loop (lease
renewals, the other slots) as much as on the loop itself. Its type's handler then runs
in a process of the worker's own, one call at a time per process, up to ``size``
processes, each started (``spawn``: a fresh interpreter, safe beside the worker's
threads and event loop) when a call first needs it and reused for the next calls.

Not ``concurrent.futures.ProcessPoolExecutor``: one process that dies breaks that
whole executor (``BrokenProcessPool``), every other call in it failing with it, and it
cannot end the one process that runs a given call. Here each call owns its process
while it runs: a process that dies fails that call only (``HandlerProcessDiedError``)
and is replaced by the next call that needs one; a call that is cancelled (its
timeout, its job cancelled, its lease lost, the worker stopping) kills its process,
which is waited for, so nothing of the attempt runs on after it ended.

The event loop waits for an answer on the pipe's file descriptor (``add_reader``),
never blocking on it: the loop renews the attempt's lease meanwhile, as for any
handler. What crosses the pipe is the call (the handler and the models, pickled by
reference) and the input and output as the JSON the database stores (``_child``).
"""

from __future__ import annotations

import asyncio
import collections
import multiprocessing
import multiprocessing.connection
from multiprocessing.process import BaseProcess

from pgwork.errors import HandlerProcessDiedError
from pgwork.worker._child import serve

__all__ = ["HandlerProcesses"]


class _Child:
    """One process of the pool and the parent's end of its pipe."""

    __slots__ = ("conn", "process")

    def __init__(self, process: BaseProcess, conn: multiprocessing.connection.Connection) -> None:
        self.process = process
        self.conn = conn

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def kill(self) -> None:
        """End the process now (SIGKILL): a CPU-bound call cannot be asked to stop."""
        self.process.kill()


class HandlerProcesses:
    """Runs calls in up to ``size`` processes of its own (``name-N``), one call per
    process at a time; a call beyond them waits for one to be free."""

    def __init__(self, *, size: int, name: str) -> None:
        self.size = size
        self.name = name
        self._context = multiprocessing.get_context("spawn")
        self._idle: list[_Child] = []
        self._children: set[_Child] = set()  # alive: idle or running a call
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._started = 0
        self._closed = False

    @property
    def pids(self) -> list[int]:
        """The pids of the pool's processes now (idle or running a call)."""
        return sorted(child.pid for child in self._children if child.pid is not None)

    async def run(self, request: bytes, *, type_name: str) -> bytes:
        """Send ``request`` to a free process and return its answer. A process that
        ends before it answers raises ``HandlerProcessDiedError`` (and is replaced for
        the next call); cancelled meanwhile, the process is killed and waited for
        before the cancellation goes on."""
        child = await self._take()
        try:
            child.conn.send_bytes(request)
            await self._readable(child.conn.fileno())
            answer = child.conn.recv_bytes()
        except (EOFError, OSError):
            await self._end(child)
            raise HandlerProcessDiedError(type_name, child.pid, child.process.exitcode) from None
        except BaseException:
            await self._end(child)
            raise
        self._give_back(child)
        return answer

    async def close(self) -> None:
        """End every process: the idle ones are told to exit (their pipe closed), and
        each is killed if it has not within a second."""
        self._closed = True
        children = list(self._children)
        for child in children:
            child.conn.close()
        for child in children:
            try:
                await asyncio.wait_for(self._ended(child), timeout=1.0)
            except TimeoutError:
                await self._end(child)
        self._children.clear()
        self._idle.clear()

    async def _take(self) -> _Child:
        while True:
            if self._closed:
                raise RuntimeError("the worker's handler processes were shut down")
            while self._idle:
                child = self._idle.pop()
                if child.process.is_alive():
                    return child
                await self._end(child)  # died while idle (killed from outside)
            if len(self._children) < self.size:
                return self._start()
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, then cancelled: the turn goes to the next
                raise

    def _start(self) -> _Child:
        self._started += 1
        parent_end, child_end = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=serve, args=(child_end,), name=f"{self.name}-{self._started}", daemon=True
        )
        process.start()
        child_end.close()  # the child's copy is its own: EOF here once it exits
        child = _Child(process, parent_end)
        self._children.add(child)
        return child

    def _give_back(self, child: _Child) -> None:
        self._idle.append(child)
        self._wake()

    def _discard(self, child: _Child) -> None:
        """The pool no longer counts ``child``: the next call starts another."""
        self._children.discard(child)
        self._wake()

    def _wake(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _end(self, child: _Child) -> None:
        """Kill ``child`` (if it still runs), wait until it ended and reap it, then
        replace it. Cancelled meanwhile, it is replaced all the same (and reaped by
        ``multiprocessing`` later)."""
        try:
            if child.process.is_alive():
                child.kill()
            await self._ended(child)
        finally:
            child.conn.close()
            self._discard(child)

    async def _ended(self, child: _Child) -> None:
        await self._readable(child.process.sentinel)
        child.process.join()  # it ended: reaps it at once

    @staticmethod
    async def _readable(fd: int) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(fd, wake)
        try:
            await ready
        finally:
            loop.remove_reader(fd)
