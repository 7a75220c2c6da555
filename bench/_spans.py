"""The flow bench's oracle: when each handler ran, per limit key, read outside pgwork.

A worker process of ``python -m bench.flow`` runs a handler that notes the wall clock
(``time.time()``) as it begins and as it returns, and writes the spans into
``bench_spans`` (one ``COPY``) as it stops. From those rows alone the oracle counts
the most handlers of one key that ran at once, and how long a key with jobs waiting
left a freed place empty.

Each span lies inside the time its job counted as running (the handler begins after
the acquire that leased it committed, and returns before its completion is sent), so
a correct build never shows more than the key's limit, and any excess the oracle
shows ran in the database too. The worker processes share this machine's clock, so
their spans compare. The clock is read in the handler, not from the database
(``clock_timestamp()``, as the fault suite's oracle does, where a killed process must
leave its start behind): two statements per job would add their own cost to the CPU
per job the bench reports, and no process is killed here.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import psycopg

from bench._pgwork_app import Counter

__all__ = ["SPANS_TABLE", "Oracle", "Spans", "densest_window", "oracle", "read_spans"]

SPANS_TABLE = """
CREATE TABLE bench_spans (
    job_id uuid NOT NULL,
    limit_key text,
    started double precision NOT NULL,
    ended double precision NOT NULL
)
"""

Span = tuple[str | None, float, float]  # limit key, start, end (seconds since the epoch)


class Spans:
    """A handler that holds each attempt ``hold`` seconds and notes its span."""

    def __init__(self, counter: Counter, hold: float) -> None:
        self.counter = counter
        self.hold = hold
        self.rows: list[tuple[Any, str | None, float, float]] = []

    def handler(self) -> Callable[[Any], Any]:
        async def held(attempt: Any) -> None:
            started = time.time()
            self.counter.hit(attempt.job.input.n)
            await anyio.sleep(self.hold)
            self.rows.append((attempt.job.id, attempt.limit_key, started, time.time()))

        return held

    async def write(self, dsn: str) -> None:
        """Write the spans noted so far into ``bench_spans``."""
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cur = conn.cursor()
            async with cur.copy(
                "COPY bench_spans (job_id, limit_key, started, ended) FROM STDIN"
            ) as copy:
                for row in self.rows:
                    await copy.write_row(row)


def read_spans(dsn: str) -> list[Span]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT limit_key, started, ended FROM bench_spans").fetchall()
    return [(key, float(started), float(ended)) for key, started, ended in rows]


@dataclass(frozen=True)
class Oracle:
    """What the spans show: ``most`` handlers of one key at once (on key ``busiest``),
    and ``waits``, the seconds from each place freed while its key had jobs waiting to
    the next start of that key."""

    spans: int
    most: int
    busiest: str | None
    waits: tuple[float, ...]

    def wait_ms(self) -> tuple[float, float, float]:
        """Median, 95th percentile and maximum of ``waits``, in milliseconds."""
        if not self.waits:
            return (float("nan"),) * 3
        ordered = sorted(self.waits)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        return statistics.median(ordered) * 1e3, p95 * 1e3, ordered[-1] * 1e3


def _key_events(spans: Iterable[tuple[float, float]]) -> list[tuple[float, int]]:
    """Starts (+1) and ends (-1) in time order; at one instant an end comes first."""
    return sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])


def oracle(spans: Iterable[Span]) -> Oracle:
    """Count, per key, the most spans open at one instant, and time each freed place.

    Every job was enqueued before the first handler began, so a key has jobs waiting
    whenever starts of it are still to come. A span's end frees a place that a job is
    waiting for when more starts are to come than places already freed and not yet
    taken; the next start of the key takes the place freed first, and its wait is the
    time between. A start while no place waits filled one never taken before (the
    first jobs of each key)."""
    by_key: dict[str | None, list[tuple[float, float]]] = {}
    count = 0
    for key, started, ended in spans:
        by_key.setdefault(key, []).append((started, ended))
        count += 1
    most, busiest = 0, None
    waits: list[float] = []
    for key, key_spans in by_key.items():
        events = _key_events(key_spans)
        running = 0
        to_start = len(key_spans)
        freed: deque[float] = deque()
        for at, step in events:
            running += step
            if running > most:
                most, busiest = running, key
            if step > 0:
                to_start -= 1
                if freed:
                    waits.append(at - freed.popleft())
            elif to_start > len(freed):
                freed.append(at)
    return Oracle(spans=count, most=most, busiest=busiest, waits=tuple(waits))


def densest_window(starts: Sequence[float], width: float) -> int:
    """The most of ``starts`` (sorted) within any window of ``width`` seconds."""
    most, first = 0, 0
    for last, at in enumerate(starts):
        while at - starts[first] >= width:
            first += 1
        most = max(most, last - first + 1)
    return most
