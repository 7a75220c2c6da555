"""pgwork's workloads. Each returns the measurements it made. (Latency and idle cost
have modules of their own: bench/_latency.py, bench/_idle.py.)

Clocks: throughput runs from the first handler start to the moment the database shows
no job pending or running (so acknowledgements still in flight are counted); latency
is ``time.time()`` after the enqueuing commit returned to handler start, both taken in
one process. Loading the jobs to drain is never timed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import statistics
import time
from collections.abc import Awaitable, Callable

import anyio
import psycopg

from bench._context import LIB, WAIT_LIMIT, Context, follow
from bench._idle import idle
from bench._latency import latency
from bench._pgwork_app import (
    Counter,
    Item,
    bulk_load,
    enqueue_jobs,
    open_client,
    settle,
    wait_drained,
)
from bench._plan import (
    BEST_SETTINGS,
    ROW_DRAIN_BEST,
    ROW_DRAIN_BEST_ATOMIC,
    row_backlog,
    row_chains,
    row_drain,
    row_enqueue,
    row_fleet,
    row_rss,
)
from bench._progress import Bar
from bench._report import Measurement
from bench._worker_process import WorkerProcess
from pgwork import ChainStart, Notice, PostgresNotifyAdapter, create_in_process_worker

__all__ = ["PGWORK_WORKLOADS"]


def _rate(jobs: int, started: float | None, finished: float) -> float:
    if started is None or finished <= started:
        return float("nan")
    return jobs / (finished - started)


# --- 1. enqueue ----------------------------------------------------------------------


async def enqueue(ctx: Context) -> list[Measurement]:
    out = []
    n = ctx.sizes.enqueue
    for batch in (None, 100, 1000):
        row = row_enqueue(batch)
        bar = ctx.bars.bar(f"pgwork: {row}", n)
        with ctx.dbs.fresh() as dsn:
            cost = None
            if ctx.isolated:
                child = await WorkerProcess.enqueuer(dsn, jobs=n, batch=batch)
                try:
                    await child.start_metering(dsn, ctx.dbs.admin_dsn)
                    await child.go()
                    finished = asyncio.ensure_future(child.finished(WAIT_LIMIT))
                    while not finished.done():
                        bar.set(child.count)
                        await asyncio.wait([finished], timeout=0.1)
                    seconds = finished.result()
                    cost = await child.cost(n)
                finally:
                    await child.stop()
            else:
                async with (
                    open_client(dsn, pool_size=2) as client,
                    await psycopg.AsyncConnection.connect(dsn) as conn,
                ):
                    seconds = await enqueue_jobs(client, conn, n, batch, bar.set)
        rate = n / seconds
        bar.finish(f"{rate:,.0f} jobs/s")
        note = _where_note(ctx, batch is None)
        out.append(Measurement(row, LIB, rate, "jobs/s", note=note, cost=cost))
    return out


def _where_note(ctx: Context, first: bool) -> str:
    return f"pgwork ran in {ctx.where}" if first and ctx.isolated else ""


# --- 2. drain ------------------------------------------------------------------------

# The atomic drain's second row: attempts committed in groups of this many.
ATOMIC_GROUP = 32


async def _drain_in_process(
    ctx: Context, type_name: str, row: str, *, atomic_group: int = 1
) -> Measurement:
    n = ctx.sizes.drain
    bar = ctx.bars.bar(f"pgwork: {row}", n)
    with ctx.dbs.fresh() as dsn:
        await bulk_load(dsn, n, type_name=type_name)
        async with open_client(dsn) as client:
            counter = Counter(n)
            worker = create_in_process_worker(
                client=client,
                processors={type_name: counter.handler()},
                max_slots=ctx.sizes.slots,
                atomic_group=atomic_group,
            )
            stop = await worker.start()
            try:
                await follow(counter, bar)
                finished = await wait_drained(dsn)
            finally:
                await stop()
    rate = _rate(n, counter.first, finished)
    bar.finish(f"{rate:,.0f} jobs/s")
    return Measurement(row, LIB, rate, "jobs/s")


async def _drain_processes(
    ctx: Context,
    processes: int,
    type_name: str = "noop",
    row: str | None = None,
    *,
    slots: int | None = None,
    atomic_group: int = 1,
    connections: list[int] | None = None,
) -> Measurement:
    """Drain with ``processes`` worker processes (pgwork, none of the harness, in them)
    of ``slots`` slots each (default: the run's). ``connections``, when given, gets
    the number of server connections to the database, sampled while they drain."""
    next_sample = 0.0
    n = ctx.sizes.drain
    slots = slots or ctx.sizes.slots
    row = row or row_drain(slots, "2 processes")
    bar = ctx.bars.bar(f"pgwork: {row}", n)
    with ctx.dbs.fresh() as dsn:
        await bulk_load(dsn, n, type_name=type_name)
        children = [
            await WorkerProcess.start(
                dsn,
                type_name=type_name,
                slots=slots,
                atomic_group=atomic_group,
                # One process runs every job: it says so the moment its last handler
                # starts, as the peers' runners learn it from their own counter.
                target=n if processes == 1 else None,
            )
            for _ in range(processes)
        ]
        try:
            if processes == 1:  # one process: what its jobs cost is its own
                await children[0].start_metering(dsn, ctx.dbs.admin_dsn)
            for child in children:
                await child.go()
            deadline = time.monotonic() + WAIT_LIMIT
            while sum(c.count for c in children) < n:
                bar.set(sum(c.count for c in children))
                if time.monotonic() > deadline:
                    raise TimeoutError("worker processes did not drain the queue")
                if connections is not None and time.monotonic() >= next_sample:
                    connections.append(await _connections(ctx.dbs.admin_dsn, dsn))
                    next_sample = time.monotonic() + 0.25
                # The counts arrive over pipes; looking at them is no database query.
                # (At 0.05 s this loop, with the children's 0.1 s reports, took up to
                # 0.15 s, 75 ms on average, to see the last handler start: a tenth of
                # a 10,000-job drain at 13,000 jobs/s.)
                await anyio.sleep(0.005)
            finished = await wait_drained(dsn)
            cost = await children[0].cost(n)
        finally:
            for child in children:
                await child.stop()
    firsts = [c.first for c in children if c.first is not None]
    rate = _rate(n, min(firsts) if firsts else None, finished)
    bar.finish(f"{rate:,.0f} jobs/s")
    return Measurement(row, LIB, rate, "jobs/s", cost=cost)


async def drain(ctx: Context) -> list[Measurement]:
    staged, atomic = row_drain(ctx.sizes.slots), row_drain(ctx.sizes.slots, "atomic")
    if ctx.isolated:
        first = await _drain_processes(ctx, 1, "noop", staged)
        first = dataclasses.replace(first, note=_where_note(ctx, True))
        rows = [first, await _drain_processes(ctx, 1, "noop_atomic", atomic)]
    else:
        rows = [
            await _drain_in_process(ctx, "noop", staged),
            await _drain_in_process(ctx, "noop_atomic", atomic),
        ]
    grouped = await _drain_in_process(
        ctx, "noop_atomic", f"{atomic}, groups of {ATOMIC_GROUP}", atomic_group=ATOMIC_GROUP
    )
    return [*rows, grouped, await _drain_processes(ctx, 2)]


async def best(ctx: Context) -> list[Measurement]:
    """The staged drain at each of ``BEST_SETTINGS`` slots (one worker process each, as
    the peers run); the fastest is the row's figure, its note says which it was. Then
    the same for the atomic drain in groups of ``ATOMIC_GROUP``."""
    staged = [
        (slots, await _drain_processes(ctx, 1, row=row_drain(slots), slots=slots))
        for slots in BEST_SETTINGS
    ]
    grouped = [
        (
            slots,
            await _drain_processes(
                ctx,
                1,
                "noop_atomic",
                row=f"{row_drain(slots, 'atomic')}, groups of {ATOMIC_GROUP}",
                slots=slots,
                atomic_group=ATOMIC_GROUP,
            ),
        )
        for slots in BEST_SETTINGS
    ]
    return [_fastest(staged, ROW_DRAIN_BEST), _fastest(grouped, ROW_DRAIN_BEST_ATOMIC)]


def _fastest(tried: list[tuple[int, Measurement]], row: str) -> Measurement:
    slots, fastest = max(tried, key=lambda t: t[1].value)
    rates = ", ".join(f"{s}: {m.value:,.0f}" for s, m in tried)
    note = f"max_slots={slots}, the best of max_slots {rates} jobs/s"
    return dataclasses.replace(fastest, row=row, note=note)


# --- 3. drain rate vs backlog --------------------------------------------------------


async def backlog(ctx: Context) -> list[Measurement]:
    """Drain rate with a deep and a shallow queue, each the median of a few windows.

    Before each window the table is vacuumed (``settle``), and the window starts after
    the worker's first jobs (its start-up: pool, prefetch not yet on), so each measures
    the same thing at either depth: a freshly started worker on a settled queue. The
    deep backlog is loaded once (a window takes 1 % of it), the shallow one for each
    window, which fits in it with a tenth to spare.

    The two depths take turns, window by window (deep, shallow, deep, ...), so that
    both rows are measured in the same minutes: run one depth after the other and, on a
    machine whose other load changes from minute to minute, the comparison is of two
    different minutes, not two depths (the CPU a job costs the worker and the server
    is the same at both depths).
    """
    sizes = ctx.sizes
    skip, window, count = sizes.backlog_skip, sizes.backlog_window, sizes.backlog_windows
    depths = (sizes.backlog_big, sizes.backlog_small)
    bars = {d: ctx.bars.bar(f"pgwork: {row_backlog(d)}", count * (skip + window)) for d in depths}
    rates: dict[int, list[float]] = {d: [] for d in depths}
    with ctx.dbs.fresh() as deep_dsn:
        load = ctx.bars.bar(
            f"pgwork: loading a {sizes.backlog_big:,}-job backlog", sizes.backlog_big
        )
        await bulk_load(deep_dsn, sizes.backlog_big, on_chunk=load.advance)
        load.finish()
        for _ in range(count):
            for depth in depths:
                with contextlib.ExitStack() as stack:
                    dsn = deep_dsn
                    if depth != sizes.backlog_big:
                        dsn = stack.enter_context(ctx.dbs.fresh())
                        await bulk_load(dsn, depth)
                    await settle(dsn)
                    rates[depth].append(await _backlog_window(ctx, dsn, skip, window, bars[depth]))
    out = []
    for depth in depths:
        rate = statistics.median(rates[depth])
        bars[depth].finish(f"{rate:,.0f} jobs/s")
        note = (
            f"median of {count} windows of {window:,} jobs, each after the first "
            f"{skip:,} of a worker started on a vacuumed table, the two depths taking "
            "turns: " + ", ".join(f"{r:,.0f}" for r in rates[depth])
        )
        out.append(Measurement(row_backlog(depth), LIB, rate, "jobs/s", note=note))
    return out


async def _backlog_window(ctx: Context, dsn: str, skip: int, window: int, bar: Bar) -> float:
    """The rate of handler starts ``skip`` to ``skip + window`` of a new worker (starts,
    not completions: the queue never empties, so it never drains)."""
    counter = Counter(skip + window, marks=frozenset((skip, skip + window)))
    done = bar.completed
    async with open_client(dsn) as client:
        worker = create_in_process_worker(
            client=client, processors={"noop": counter.handler()}, max_slots=ctx.sizes.slots
        )
        stop = await worker.start()
        try:
            await follow(counter, bar, lambda: done + counter.count)
        finally:
            await stop()
    return window / (counter.marked[skip + window] - counter.marked[skip])


# --- 4. worker memory ----------------------------------------------------------------


async def _wake(dsn: str) -> None:
    notify = PostgresNotifyAdapter(dsn)
    try:
        await notify.publish(None, notices=[Notice(kind="ready", queue="default")])
    finally:
        await notify.close()


async def rss(ctx: Context) -> list[Measurement]:
    checkpoints = ctx.sizes.rss_checkpoints
    bar = ctx.bars.bar("pgwork: worker RSS", checkpoints[-1])
    out = []
    with ctx.dbs.fresh() as dsn:
        child = await WorkerProcess.start(dsn, slots=ctx.sizes.slots)
        try:
            await child.go()
            await anyio.sleep(1.0)
            out.append(Measurement(row_rss("at start"), LIB, child.rss_mib(), "MiB", False))
            loaded = 0
            for index, checkpoint in enumerate(checkpoints):
                while loaded < checkpoint:
                    chunk = min(100_000, checkpoint - loaded)
                    await bulk_load(dsn, chunk, first=loaded)
                    await _wake(dsn)
                    loaded += chunk
                    bar.set(child.count)
                await _until(lambda c=checkpoint: child.count >= c, bar, lambda: child.count)
                await wait_drained(dsn)
                label = ctx.sizes.rss_label(index)
                out.append(Measurement(row_rss(label), LIB, child.rss_mib(), "MiB", False))
        finally:
            await child.stop()
    bar.finish(f"{out[-1].value:.0f} MiB")
    return out


async def _until(done: Callable[[], bool], bar: Bar, count: Callable[[], int]) -> None:
    deadline = time.monotonic() + WAIT_LIMIT
    while not done():
        bar.set(count())
        if time.monotonic() > deadline:
            raise TimeoutError("the worker process did not finish its jobs")
        await anyio.sleep(0.1)
    bar.set(count())


# --- 5. chains -----------------------------------------------------------------------


async def chains(ctx: Context) -> list[Measurement]:
    n = ctx.sizes.chains
    row = row_chains(ctx.sizes.slots)
    bar = ctx.bars.bar(f"pgwork: {row}", n)
    with ctx.dbs.fresh() as dsn:
        async with open_client(dsn) as client:
            step1 = client.registry.get("step1")
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                for first in range(0, n, 1000):
                    numbers = range(first, min(n, first + 1000))
                    await client.start_chains(conn, [ChainStart(step1, Item(n=i)) for i in numbers])
                    await conn.commit()
            counter = Counter(n)
            worker = create_in_process_worker(
                client=client,
                processors=counter.chain_handlers(client.registry),
                max_slots=ctx.sizes.slots,
            )
            stop = await worker.start()
            try:
                await follow(counter, bar)
                finished = await wait_drained(dsn)
            finally:
                await stop()
    rate = _rate(n, counter.first, finished)
    bar.finish(f"{rate:,.0f} chains/s ({3 * rate:,.0f} jobs/s)")
    return [Measurement(row, LIB, rate, "chains/s")]


async def _connections(admin_dsn: str, dsn: str) -> int:
    """How many server connections the database ``dsn`` has (the harness's own aside)."""
    dbname = psycopg.conninfo.conninfo_to_dict(dsn).get("dbname")
    async with await psycopg.AsyncConnection.connect(admin_dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND backend_type = "
            "'client backend'",
            [dbname],
        )
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def fleet(ctx: Context) -> list[Measurement]:
    """The same drain with more and more worker processes of the run's slots: the rate
    one server gives a fleet, and the connections the fleet holds."""
    rows: list[Measurement] = []
    for processes in ctx.sizes.fleet:
        seen: list[int] = []
        rate = await _drain_processes(
            ctx, processes, row=row_fleet(processes, ctx.sizes.slots), connections=seen
        )
        rows.append(rate)
        rows.append(
            Measurement(
                row_fleet(processes, ctx.sizes.slots, "server connections, most"),
                LIB,
                float(max(seen, default=0)),
                "connections",
            )
        )
    return rows


PGWORK_WORKLOADS: dict[str, Callable[[Context], Awaitable[list[Measurement]]]] = {
    "enqueue": enqueue,
    "drain": drain,
    "best": best,
    "latency": latency,
    "backlog": backlog,
    "rss": rss,
    "chains": chains,
    "idle": idle,
    "fleet": fleet,
}
