"""Idle pickup latency: jobs enqueued one by one to an idle worker, commit to handler start.

The clock is ``time.time()`` right after the enqueuing commit returned, to handler
start, both in one process (the same clock the peers' runners use).
"""

from __future__ import annotations

import dataclasses
import inspect
import time

import anyio
import psycopg

from bench._context import LIB, Context, follow
from bench._pgwork_app import Counter, Item, open_client
from bench._plan import percentile, row_latency
from bench._report import Measurement
from pgwork import create_in_process_worker

__all__ = ["QUIET_POLL", "latency"]

# The worker's own default, read from its signature so the note cannot go stale.
DEFAULT_POLL: float = (
    inspect.signature(create_in_process_worker).parameters["poll_interval"].default
)
# A poll this slow cannot explain a pickup within the run (200 jobs 20 ms apart take 4 s):
# every such pickup was woken by a notification.
QUIET_POLL = 30.0


async def latency(ctx: Context) -> list[Measurement]:
    """Pickup latency with the default poll interval, then with a 30 s one."""
    default, _, _ = await _latency(ctx, None)
    default[0] = dataclasses.replace(
        default[0],
        note=f"the worker's default poll_interval ({DEFAULT_POLL:g} s): a pickup is woken "
        "by the job's notification or by a poll, whichever comes first",
    )
    quiet, slowest, run = await _latency(ctx, QUIET_POLL)
    # The worker's last poll before the run was its first acquire at start.
    if run < QUIET_POLL:
        why = (
            f"the run took {run:.1f} s from the worker's start, so no poll fell inside it: "
            "every pickup was woken by the job's notification (or by the worker's own "
            "next acquire after a job)"
        )
    else:
        why = f"the run took {run:.1f} s, longer than the poll: a pickup may be a poll's"
    quiet[0] = dataclasses.replace(
        quiet[0],
        note=f"poll_interval={QUIET_POLL:.0f} s; {why}; slowest pickup {slowest:.1f} ms",
    )
    return default + quiet


async def _latency(
    ctx: Context, poll_interval: float | None
) -> tuple[list[Measurement], float, float]:
    """The p50/p95/p99 rows, the slowest pickup (ms), and the seconds from the worker's
    start to the last pickup."""
    n = ctx.sizes.latency
    label = "" if poll_interval is None else f", {poll_interval:.0f} s poll"
    bar = ctx.bars.bar(f"pgwork: idle pickup latency{label}", n)
    commits: dict[int, float] = {}
    with ctx.dbs.fresh() as dsn:
        async with open_client(dsn) as client:
            counter = Counter(n, record_starts=True)
            worker = create_in_process_worker(
                client=client,
                processors={"noop": counter.handler()},
                max_slots=ctx.sizes.slots,
                poll_interval=DEFAULT_POLL if poll_interval is None else poll_interval,
            )
            stop = await worker.start()
            started = time.time()
            try:
                await anyio.sleep(0.5)  # let the worker go idle
                noop = client.registry.get("noop")
                async with await psycopg.AsyncConnection.connect(dsn) as conn:
                    next_at = time.monotonic()
                    for i in range(n):
                        await client.start_chain(conn, noop, Item(n=i))
                        await conn.commit()
                        commits[i] = time.time()
                        bar.set(counter.count)
                        next_at += ctx.sizes.latency_interval
                        await anyio.sleep(max(0.0, next_at - time.monotonic()))
                await follow(counter, bar)
            finally:
                await stop()
    samples = [(counter.starts[i] - commits[i]) * 1000 for i in range(n)]
    p50 = percentile(samples, 50)
    bar.finish(f"p50 {p50:.1f} ms")
    rows = [
        Measurement(
            row_latency(p, poll_interval), LIB, percentile(samples, p), "ms", higher_is_better=False
        )
        for p in (50, 95, 99)
    ]
    return rows, max(samples), max(counter.starts.values()) - started
