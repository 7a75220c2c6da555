"""The worker's own threads for sync handlers: ``HandlerThreads``.

A plain ``def`` handler blocks, so it runs on a thread, never on the event loop, which
renews leases and runs the other slots meanwhile. The threads are the worker's own, not
the event loop's default executor (``asyncio.to_thread``): that one is shared with
whatever else the application sends there (DNS lookups, files), is sized by the CPU
count rather than the worker's slots, and could not be told that one of its threads was
given up on.

Python cannot stop a thread. A sync handler is stopped by asking it (``SyncAttempt``'s
cancellation); one that does not end ``abandon_after`` later is given up on as a
coroutine is (``_side.watchdog``), and its thread with it: the pool may then run one
thread more than its size for as long as that thread runs, so the slot freed for the
next job finds a thread to run on; the thread retires once its handler returns at last.
Threads are started as they are first needed and are daemon threads, so one that never
returns does not keep the process alive; ``close`` lets the idle ones end.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["HandlerThreads"]


class _Call:
    """One sync handler's run on a pool thread, reported to its future on the loop."""

    __slots__ = ("abandoned", "arg", "context", "fn", "future", "loop")

    def __init__(
        self,
        fn: Callable[[Any], Any],
        arg: Any,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[Any],
    ) -> None:
        self.fn = fn
        self.arg = arg
        self.loop = loop
        self.future = future
        # The caller's context variables (a tracing span, ``log_context``'s fields)
        # hold in the thread too, as ``asyncio.to_thread`` keeps them.
        self.context = contextvars.copy_context()
        self.abandoned = False

    def run(self) -> None:
        try:
            result = self.context.run(self.fn, self.arg)
        except BaseException as exc:
            self._report(None, exc)
        else:
            self._report(result, None)

    def _report(self, result: Any, error: BaseException | None) -> None:
        # A closed loop: an abandoned handler ended after its worker did.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self._settle, result, error)

    def _settle(self, result: Any, error: BaseException | None) -> None:
        future = self.future
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


class HandlerThreads:
    """Runs sync handlers on up to ``size`` threads of its own (named ``name-N``), plus
    one for each handler given up on that still runs (``abandon``).

    ``submit`` is called on the event loop and returns a future of that loop; the
    slots bound how many handlers run at once, so a submitted handler waits for a
    thread only when ``size`` is below the slots that may run one."""

    def __init__(self, *, size: int, name: str) -> None:
        self.size = size
        self.name = name
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._idle = 0  # threads waiting for a call and not yet promised one
        self._abandoned = 0  # calls given up on whose threads still run them
        self._running: dict[int, _Call] = {}  # by id() of each call's key
        self._started = 0
        self._closed = False

    @property
    def threads(self) -> int:
        """How many threads the pool has now (idle, running, or given up on)."""
        return len(self._threads)

    @property
    def abandoned(self) -> int:
        """Threads given up on that still run their handler."""
        return self._abandoned

    def submit(self, fn: Callable[[Any], Any], arg: Any, *, key: object) -> asyncio.Future[Any]:
        """Run ``fn(arg)`` on a pool thread; the future (of the running loop) gets what
        it returns or raises. ``key`` names the call for ``abandon`` (its attempt)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        call = _Call(fn, arg, loop, future)
        with self._lock:
            if self._closed:
                raise RuntimeError("the worker's sync handler threads were shut down")
            self._running[id(key)] = call
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self.size + self._abandoned:
                self._start_thread()
            self._queue.put(call)
        future.add_done_callback(lambda _: self._forget(key, call))
        return future

    def abandon(self, key: object) -> None:
        """The worker gave up on the handler submitted with ``key``: its thread no longer
        counts towards the pool's size (a new one is started for the next handler),
        and retires once the handler returns."""
        with self._lock:
            call = self._running.pop(id(key), None)
            if call is None or call.abandoned:
                return
            call.abandoned = True
            self._abandoned += 1

    def close(self) -> None:
        """Let the idle threads end (and each busy one once its handler returns); a
        handler given up on is not waited for (its thread is a daemon thread)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in range(len(self._threads) - self._abandoned):
                self._queue.put(None)

    def _forget(self, key: object, call: _Call) -> None:
        with self._lock:
            if self._running.get(id(key)) is call:
                del self._running[id(key)]

    def _start_thread(self) -> None:
        self._started += 1
        thread = threading.Thread(
            target=self._work, name=f"{self.name}-{self._started}", daemon=True
        )
        self._threads.add(thread)
        thread.start()

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            call = self._queue.get()
            if call is None:
                break
            call.run()
            with self._lock:
                if call.abandoned:
                    # Replaced while it ran: the pool is back to its size.
                    self._abandoned -= 1
                    break
                self._idle += 1
        with self._lock:
            self._threads.discard(me)
