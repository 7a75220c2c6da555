"""What the wake-up tests share: workers that poll every 30 s, listeners made deaf to
chosen notices (the control builds), a handler that records when each attempt started.

A job that starts within a second or two of being made ready, under a 30 s poll, was
started by a notification or a due-time timer; the deaf control must then not start it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import psycopg
from pydantic import BaseModel

from pgwork import (
    Attempt,
    Client,
    InProcessWorker,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
)
from pgwork.adapters.notify import Listener, Notice

from .conftest import eventually

__all__ = [
    "LONG_POLL",
    "PROMPT",
    "DeafNotifyAdapter",
    "Num",
    "Starts",
    "client_factory",
    "enqueue",
    "no_due",
    "no_ready",
    "worker_starter",
]

LONG_POLL = 30.0
# A notification or a timer starts a job within milliseconds; this leaves room for a
# loaded CI machine while staying far below the poll interval.
PROMPT = 5.0


class Num(BaseModel):
    n: int


Drop = Callable[[Notice], bool]


def no_ready(notice: Notice) -> bool:
    return notice.kind == "ready"


def no_due(notice: Notice) -> bool:
    return notice.kind == "ready" and notice.at is not None


class _Deaf:
    def __init__(self, inner: Listener, drop: Drop) -> None:
        self._inner = inner
        self._drop = drop

    async def wait(self, timeout: float) -> list[Notice]:
        return [n for n in await self._inner.wait(timeout) if not self._drop(n)]


class DeafNotifyAdapter(PostgresNotifyAdapter):
    """The control build: publishes as usual, but its listeners never hear ``drop``."""

    def __init__(self, dsn: str, drop: Drop) -> None:
        super().__init__(dsn)
        self._drop = drop

    @asynccontextmanager
    async def listen(self) -> AsyncIterator[Listener]:
        async with super().listen() as listener:
            yield _Deaf(listener, self._drop)


@asynccontextmanager
async def client_factory(dsn: str) -> AsyncIterator[Callable[..., Awaitable[Client]]]:
    """Make clients on ``dsn``; ``drop``: their listeners are deaf to those notices."""
    made: list[Client] = []

    async def make(registry: JobTypeRegistry, drop: Drop | None = None) -> Client:
        notify = PostgresNotifyAdapter(dsn) if drop is None else None
        client = create_client(
            state_adapter=await PostgresStateAdapter.connect(dsn),
            notify_adapter=notify or DeafNotifyAdapter(dsn, drop or no_ready),
            registry=registry,
        )
        made.append(client)
        return client

    try:
        yield make
    finally:
        for client in made:
            await client.close()


@asynccontextmanager
async def worker_starter() -> AsyncIterator[Callable[..., Awaitable[InProcessWorker]]]:
    """Start workers (30 s poll unless told) and return once each found its queues
    drained and asked when the next job is due (the look-ahead): from then on only a
    notification or a timer sends it looking. Returning before the look-ahead came
    back would let it find a job the test makes ready meanwhile, and a deaf control
    would start the job."""
    started: list[InProcessWorker] = []

    async def start(**kwargs: Any) -> InProcessWorker:
        kwargs.setdefault("poll_interval", LONG_POLL)
        worker = create_in_process_worker(**kwargs)
        looked_ahead = _count_look_aheads(worker)
        await worker.start()
        started.append(worker)

        async def drained() -> bool:
            return looked_ahead.is_set() and not worker._wakeups.may_have_work

        await eventually(drained, timeout=PROMPT, what="the worker's first acquire")
        return worker

    try:
        yield start
    finally:
        for worker in started:
            await worker.stop(grace_period=0)


def _count_look_aheads(worker: InProcessWorker) -> anyio.Event:
    """An event set once the worker's state adapter has answered a ``next_due``."""
    answered = anyio.Event()
    asked = worker.state.next_due

    async def next_due(**kwargs: Any) -> float | None:
        try:
            return await asked(**kwargs)
        finally:
            answered.set()

    worker.state.next_due = next_due  # type: ignore[method-assign]
    return answered


class Starts:
    """A handler that records when each attempt of each job started."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._counted: dict[int, anyio.Event] = {}

    async def __call__(self, attempt: Attempt[Any, Any]) -> Any:
        self.times.append(time.monotonic())
        self._reached(len(self.times)).set()

    def _reached(self, count: int) -> anyio.Event:
        return self._counted.setdefault(count, anyio.Event())

    async def within(self, seconds: float, *, count: int = 1) -> bool:
        """Whether ``count`` attempts have started within ``seconds``."""
        with anyio.move_on_after(seconds):
            await self._reached(count).wait()
            return True
        return False


async def enqueue(dsn: str, client: Client, job_type: Any, **options: Any) -> Any:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        started = await client.start_chain(conn, job_type, Num(n=1), **options)
        await conn.commit()
    return started
