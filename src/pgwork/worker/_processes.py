"""The worker's own processes for CPU-bound handlers: ``HandlerProcesses``.

A CPU-bound handler holds the GIL: on a thread it would slow the event loop (lease
renewals, the other slots) as much as on the loop itself. Its type's handler then runs
in a process of the worker's own, one call at a time per process, in ``size``
processes (``spawn``: a fresh interpreter, safe beside the worker's threads and event
loop), reused for the next calls.

The processes start with the worker, before it takes a job (``start``), and each one
loads the worker's handlers (imports their modules) before it says it is ready: an
attempt's timeout pays for neither an interpreter's start nor an import, its first
attempt's included, as a prefork pool's tasks do not. A process that ends (killed with
its attempt, dead while it computed, or killed from outside while idle) is replaced at
once, so its successor starts while no attempt waits for it. One that never got ready
is not: the next call that finds the pool short starts one, so a process that cannot
start is not started again and again for nothing.

Not ``concurrent.futures.ProcessPoolExecutor``: one process that dies breaks that
whole executor (``BrokenProcessPool``), every other call in it failing with it, and it
cannot end the one process that runs a given call. Here each call owns its process
while it runs: a process that dies fails that call only (``HandlerProcessDiedError``);
a call that is cancelled (its timeout, its job cancelled, its lease lost, the worker
stopping) kills its process, which is waited for, so nothing of the attempt runs on
after it ended. A call cancelled while its process was still starting leaves that
process to start: it ran nothing of the attempt.

The event loop waits for an answer on the pipe's file descriptor (``add_reader``),
never blocking on it: the loop renews the attempt's lease meanwhile, as for any
handler. What crosses the pipe is the call (the handler and the models, pickled by
reference) and the input and output as the JSON the database stores (``_child``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import multiprocessing
import multiprocessing.connection
from collections.abc import Sequence
from multiprocessing.process import BaseProcess

from pgwork.errors import HandlerProcessDiedError
from pgwork.worker._child import READY, serve

__all__ = ["HandlerProcesses"]

log = logging.getLogger("pgwork.worker")


class _Child:
    """One process of the pool and the parent's end of its pipe; ``ready`` once it
    has loaded the handlers."""

    __slots__ = ("conn", "process", "ready")

    def __init__(self, process: BaseProcess, conn: multiprocessing.connection.Connection) -> None:
        self.process = process
        self.conn = conn
        self.ready = False

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def kill(self) -> None:
        """End the process now (SIGKILL): a CPU-bound call cannot be asked to stop."""
        self.process.kill()


class HandlerProcesses:
    """Runs calls in ``size`` processes of its own (``name-N``), one call per process
    at a time; a call beyond them waits for one to be free. ``calls`` (``(type name,
    call)``, as ``_child.request`` takes them) are what each process loads as it
    starts."""

    def __init__(self, *, size: int, name: str, calls: Sequence[tuple[str, bytes]] = ()) -> None:
        self.size = size
        self.name = name
        self._calls = tuple(calls)
        self._context = multiprocessing.get_context("spawn")
        self._free: list[_Child] = []  # running no call: ready, or still starting
        self._children: set[_Child] = set()  # alive: free or running a call
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._started = 0
        self._closed = False

    @property
    def pids(self) -> list[int]:
        """The pids of the pool's processes now (idle, starting or running a call)."""
        return sorted(child.pid for child in self._children if child.pid is not None)

    async def start(self) -> None:
        """Start the pool's processes and return once each has loaded the handlers:
        the worker calls it before it takes a job. One that ends before it is ready is
        left out (the first call that finds the pool short starts another). Cancelled
        (the worker stopping meanwhile), it leaves the processes still starting to
        ``close``."""
        starting = [self._spawn() for _ in range(self.size - len(self._children))]
        try:
            while starting:
                child = starting[0]
                try:
                    await self._ready(child)
                except (EOFError, OSError):
                    starting.pop(0)
                    await self._end(child, replace=False)
                else:
                    self._add_free(starting.pop(0))
        finally:
            # Cancelled: free, still starting (not watched while waited for above: its
            # pipe may not be closed under that wait).
            for child in starting:
                self._add_free(child)

    async def run(self, request: bytes, *, type_name: str) -> bytes:
        """Send ``request`` to a free process and return its answer. A process that
        ends before it answers raises ``HandlerProcessDiedError`` (and is replaced);
        cancelled meanwhile, the process is killed and waited for before the
        cancellation goes on."""
        child = await self._take()
        try:
            if not child.ready:
                await self._ready(child)
        except (EOFError, OSError):
            await self._end(child, replace=False)
            raise HandlerProcessDiedError(type_name, child.pid, child.process.exitcode) from None
        except BaseException:
            self._give_back(child)  # it ran nothing of this call: let it start
            raise
        try:
            child.conn.send_bytes(request)
            await self._readable(child.conn.fileno())
            answer = child.conn.recv_bytes()
        except (EOFError, OSError):
            await self._end(child, replace=True)
            raise HandlerProcessDiedError(type_name, child.pid, child.process.exitcode) from None
        except BaseException:
            await self._end(child, replace=True)
            raise
        self._give_back(child)
        return answer

    async def close(self) -> None:
        """End every process: each is told to exit (its pipe closed), and killed if it
        has not within a second (one still starting included)."""
        self._closed = True
        for child in self._free:
            self._unwatch(child)
        children = list(self._children)
        for child in children:
            child.conn.close()
        for child in children:
            try:
                await asyncio.wait_for(self._ended(child), timeout=1.0)
            except TimeoutError:
                await self._end(child, replace=False)
        self._children.clear()
        self._free.clear()

    async def _take(self) -> _Child:
        while True:
            if self._closed:
                raise RuntimeError("the worker's handler processes were shut down")
            while self._free:
                # A ready process first; else one still starting (waited for).
                ready = [child for child in self._free if child.ready]
                child = ready[-1] if ready else self._free[-1]
                self._remove_free(child)
                if child.process.is_alive():
                    return child
                await self._end(child, replace=child.ready)  # died while free
            if len(self._children) < self.size:
                return self._spawn()
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

    def _spawn(self) -> _Child:
        """A new process, counted in the pool, loading the handlers."""
        self._started += 1
        parent_end, child_end = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=serve,
            args=(child_end, self._calls),
            name=f"{self.name}-{self._started}",
            daemon=True,
        )
        process.start()
        child_end.close()  # the child's copy is its own: EOF here once it exits
        child = _Child(process, parent_end)
        self._children.add(child)
        return child

    async def _ready(self, child: _Child) -> None:
        """Wait until ``child`` has loaded the handlers; EOFError if it ended first."""
        await self._readable(child.conn.fileno())
        said = child.conn.recv_bytes()
        if said != READY:
            raise OSError(f"a handler process said {said!r} as it started")
        child.ready = True

    def _give_back(self, child: _Child) -> None:
        self._add_free(child)

    def _add_free(self, child: _Child) -> None:
        self._free.append(child)
        self._watch(child)
        self._wake()

    def _remove_free(self, child: _Child) -> None:
        self._free.remove(child)
        self._unwatch(child)

    def _watch(self, child: _Child) -> None:
        """Notice at once a free process that ends (killed from outside)."""
        asyncio.get_running_loop().add_reader(child.process.sentinel, self._ended_free, child)

    def _unwatch(self, child: _Child) -> None:
        asyncio.get_running_loop().remove_reader(child.process.sentinel)

    def _ended_free(self, child: _Child) -> None:
        if child not in self._free:
            return
        self._remove_free(child)
        child.process.join()  # it ended: reaps it at once
        child.conn.close()
        self._discard(child)
        if child.ready:
            self._replace()

    def _replace(self) -> None:
        """Start a process in place of one that ended, unless the pool is closed."""
        if self._closed or len(self._children) >= self.size:
            return
        try:
            self._add_free(self._spawn())
        except OSError as exc:  # the next call that finds the pool short tries again
            log.warning("pgwork could not start a handler process (%r)", exc)

    def _discard(self, child: _Child) -> None:
        """The pool no longer counts ``child``: another may start."""
        self._children.discard(child)
        self._wake()

    def _wake(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _end(self, child: _Child, *, replace: bool) -> None:
        """Kill ``child`` (if it still runs), wait until it ended and reap it, then
        (``replace``) start another in its place. Cancelled meanwhile, it is replaced
        all the same (and reaped by ``multiprocessing`` later)."""
        try:
            if child.process.is_alive():
                child.kill()
            await self._ended(child)
        finally:
            child.conn.close()
            self._discard(child)
            if replace:
                self._replace()

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
