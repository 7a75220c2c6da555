"""What every peer runner shares. Runs inside the peers' virtualenv: stdlib and psycopg
only, never pgwork.

A runner is called as ``python run_<peer>.py --dsn DSN --workload W --jobs N ...`` on a
fresh empty database, installs its library's schema, and prints JSON lines:
``{"progress": n}`` while it works and ``{"result": {...}}`` at the end, and
``{"mark": "first"}`` the moment its timed interval starts (the first handler start,
or the enqueuing loop's start), so that the harness reads what the run costs from
then on (bench/_cost.py).

The clocks are pgwork's (see bench/_pgwork_workloads.py): enqueue is timed around the
enqueuing loop; a drain runs from the first handler start until the database shows no
unfinished job; latency is ``time.time()`` after the enqueuing commit to handler start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

WAIT_LIMIT = 900.0


def emit(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


LOOPS = ("asyncio", "uvloop")


def run_on_loop(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``main()`` on the event loop ``--loop`` names: the one the library's own
    command line runs its worker on (``bench.peers.PEERS``)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--loop", choices=LOOPS, default="asyncio")
    loop = pre.parse_known_args()[0].loop
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())


def parse_args(
    argv: Sequence[str] | None = None, *, drivers: Sequence[str] = ()
) -> argparse.Namespace:
    """The runner's arguments; ``drivers``: the choices of ``--driver`` (first is the
    default), for a library that runs on more than one."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--workload", choices=("enqueue", "drain", "latency"), required=True)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--batch", type=int, default=0, help="0: one job per transaction")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--interval", type=float, default=0.02)
    parser.add_argument("--loop", choices=LOOPS, default="asyncio")
    if drivers:
        parser.add_argument("--driver", choices=drivers, default=drivers[0])
    return parser.parse_args(argv)


@dataclass
class Counter:
    """Handler starts; ``starts[n]`` is when job ``n``'s handler began."""

    target: int
    count: int = 0
    first: float | None = None
    starts: dict[int, float] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def hit(self, n: int) -> None:
        now = time.time()
        if self.first is None:
            self.first = now
            emit(mark="first")
        self.starts[n] = now
        self.count += 1
        if self.count >= self.target:
            self.done.set()


async def follow(counter: Counter, worker: asyncio.Task[Any] | None = None) -> None:
    """Report progress until every job's handler has started; raise if ``worker`` (the
    task running the library's worker, if it has one) ends first."""
    deadline = time.monotonic() + WAIT_LIMIT
    while not counter.done.is_set():
        if worker is not None and worker.done():
            worker.result()
            raise RuntimeError("the worker stopped before the jobs were done")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(counter.done.wait(), timeout=0.1)
        emit(progress=counter.count)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{counter.count}/{counter.target} jobs after {WAIT_LIMIT:.0f}s")


async def wait_empty(dsn: str, query: str, interval: float = 0.01) -> float:
    """Poll ``query`` (a count of unfinished jobs) until it is 0; return ``time.time()``."""
    deadline = time.monotonic() + WAIT_LIMIT
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while True:
            row = await (await conn.execute(query)).fetchone()
            if row is not None and row[0] == 0:
                return time.time()
            if time.monotonic() > deadline:
                raise TimeoutError("jobs still unfinished")
            await asyncio.sleep(interval)


async def timed_enqueue(
    jobs: int, batch: int, enqueue: Callable[[list[int]], Awaitable[None]]
) -> None:
    """Call ``enqueue`` with batches of job numbers (one number when batch is 0); emit the
    elapsed seconds."""
    size = batch or 1
    emit(mark="first")
    started = time.perf_counter()
    for first in range(0, jobs, size):
        await enqueue(list(range(first, min(jobs, first + size))))
        if first % 500 < size:
            emit(progress=first + size)
    emit(result={"seconds": time.perf_counter() - started})


async def paced_enqueue(
    jobs: int,
    interval: float,
    enqueue_one: Callable[[int], Awaitable[None]],
    counter: Counter,
    worker: asyncio.Task[Any] | None = None,
) -> None:
    """Enqueue one job (own transaction) every ``interval`` seconds to an idle worker, then
    emit each job's commit-to-handler-start latency in milliseconds."""
    commits: dict[int, float] = {}
    next_at = time.monotonic()
    for i in range(jobs):
        await enqueue_one(i)
        commits[i] = time.time()
        emit(progress=counter.count)
        next_at += interval
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    await follow(counter, worker)
    emit(result={"latencies_ms": [(counter.starts[i] - commits[i]) * 1000 for i in range(jobs)]})


# The row pgwork's ``start_chains`` writes for a plain job (the first of its own chain,
# runnable now), for a bare ``INSERT`` into pgwork's own table: the same columns given,
# the same values, defaults and indexes, without pgwork's code, its array parameters
# or its ready notice. Parameters: the job's id, its chain's (the same), its input.
PGWORK_ROW = "(%s, 'noop', %s, 'noop', 0, %s, 'pending', 'default', 0, 5, 'active')"


def pgwork_rows_insert(count: int, schema: str = "pgwork") -> str:
    """A multi-row ``INSERT`` of ``count`` pgwork rows (``PGWORK_ROW``) into
    ``schema``'s jobs table."""
    return (
        f"INSERT INTO {schema}.jobs (id, type_name, chain_id, chain_type_name, chain_index,"
        " input, status, queue, priority, max_attempts, chain_status) VALUES "
        + ", ".join([PGWORK_ROW] * count)
    )


def pgwork_rows_params(numbers: Iterable[int]) -> list[Any]:
    """The parameters of ``pgwork_rows_insert`` for the jobs of inputs ``numbers``,
    with time-ordered ids as pgwork makes them (random ones would scatter the primary
    key's inserts over the index, which pgwork's do not)."""
    params: list[Any] = []
    for n in numbers:
        job_id = time_ordered_uuid()
        params += (job_id, job_id, f'{{"n": {n}}}')
    return params


_last_id = 0


def time_ordered_uuid() -> uuid.UUID:
    """A version 7 UUID: the Unix time in milliseconds, then random bits; each greater
    than the last one (as pgwork's are), so inserts land at the primary key's end."""
    global _last_id
    value = (time.time_ns() // 1_000_000) << 80 | random.getrandbits(80)
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # the RFC 9562 variant
    if value <= _last_id:
        value = _last_id + 1  # (the random bits of a millisecond cannot run out here)
    _last_id = value
    return uuid.UUID(int=value)


def drained(counter: Counter, finished: float) -> None:
    emit(result={"first": counter.first, "finished": finished})
