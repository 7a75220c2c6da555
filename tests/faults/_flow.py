"""The flow-limit scenario's oracle and its racing callers.

The oracle reads the intervals the ``limited`` and ``keyed`` handlers record
(``faults_intervals``, by the database's clock) and counts, outside pgwork, the most
attempts that ran at once: per type, and per limit group (the key, or ``''`` for the
jobs enqueued without one, which share a group).

An attempt whose process was killed has a start and no end. The contract is that a
killed worker's jobs count against the limit until they are reaped or taken back from
the dead worker, and no longer, so such an attempt's interval ends when its job was
reaped: the reap's entry for that attempt in the job's history (``LeaseExpired``, at
the reap transaction's start, so a little before the job left ``running``). An
attempt that outlived its lease ends at its reap as well, though its handler ran on:
the job no longer counted. Each interval is then inside the time its job counted as
running (the handler begins after the acquire committed, and records its end before
its completion is sent), so a correct build never shows more than the limit, and any
excess the oracle shows ran in the database too.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from tests._starts import Start, windows
from tests.faults._jobs import (
    FLOW_CONCURRENCY,
    FLOW_KEY_CONCURRENCY,
    FLOW_KEY_RATE,
    FLOW_RATE,
    Spec,
    registry,
)

from pgwork import ChainStart, PostgresNotifyAdapter, PostgresStateAdapter, create_client

__all__ = [
    "FLOW_TYPES",
    "Densest",
    "Overlaps",
    "densest",
    "flow_jobs",
    "overlaps",
    "racing_callers",
]

FLOW_TYPES = ("limited", "keyed", "rated")
# The keyed type's limit keys; None: enqueued without a key (one group of its own).
KEYS: tuple[str | None, ...] = ("k1", "k2", "k3", "k4", None)
# The rated type's, half of its jobs on ``r1``: while every group has jobs the type's
# rate binds (five groups could start ten a window, the type six); once only ``r1``
# has, its key rate does.
RATED_KEYS: tuple[str | None, ...] = ("r1", "r1", "r1", "r1", "r2", "r3", "r4", None)

_INTERVALS = """
SELECT j.type_name, i.limit_key, i.started_at,
    -- least() skips NULLs: the handler's end, or the reap's, whichever came first.
    least(i.ended_at, reap.at) AS ended_at,
    i.ended_at IS NULL AS killed,
    reap.at IS NOT NULL AS reaped
FROM faults_intervals AS i
JOIN pgwork.jobs AS j ON j.id = i.job_id
LEFT JOIN LATERAL (
    SELECT min((h ->> 'at')::timestamptz) AS at
    FROM jsonb_array_elements(COALESCE(j.attempt_history, '[]'::jsonb)) AS h
    WHERE (h ->> 'attempt')::int = i.attempt AND h -> 'error' ->> 'type' = 'LeaseExpired'
) AS reap ON true
"""


@dataclass(slots=True)
class Overlaps:
    """The most attempts running at once, by type and by (type, group)."""

    attempts: int = 0
    # Killed mid-attempt (no end written): each ends at its job's reap.
    killed: int = 0
    # Attempts whose job was reaped from under them.
    reaped: int = 0
    # Attempts with neither an end nor a reap: counted as running to the end of time.
    unended: int = 0
    by_type: Counter[str] = field(default_factory=Counter)
    by_group: Counter[tuple[str, str]] = field(default_factory=Counter)
    # (type, group or '*' for the type, when, how many): the first instants past a limit.
    excess: list[tuple[str, str, str, int]] = field(default_factory=list)

    def most_keyed(self) -> int:
        return max((n for (t, _), n in self.by_group.items() if t == "keyed"), default=0)

    def within_limits(self) -> bool:
        return (
            self.by_type["limited"] <= FLOW_CONCURRENCY
            and self.most_keyed() <= FLOW_KEY_CONCURRENCY
        )

    def as_notes(self) -> dict[str, Any]:
        return {
            "most_running_limited": self.by_type["limited"],
            "most_running_keyed_per_key": {
                group or "(no key)": n
                for (t, group), n in sorted(self.by_group.items())
                if t == "keyed"
            },
            "most_running_keyed": self.by_type["keyed"],
            "attempts": self.attempts,
            "killed_attempts": self.killed,
            "reaped_attempts": self.reaped,
            "unended_attempts": self.unended,
            **({"excess": self.excess[:6]} if self.excess else {}),
        }


def _most(
    spans: Sequence[tuple[datetime, datetime | None]], limit: int | None, label: tuple[str, str]
) -> tuple[int, list[tuple[str, str, str, int]]]:
    """The most spans open at one instant, and the first instants past ``limit`` (if
    any); an end sorts before a start at the same instant, and a span without an end
    never closes."""
    events = sorted(
        [(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans if end is not None]
    )
    running = most = 0
    excess: list[tuple[str, str, str, int]] = []
    for at, step in events:
        running += step
        most = max(most, running)
        if limit is not None and step > 0 and running > limit and len(excess) < 3:
            excess.append((*label, at.isoformat(), running))
    return most, excess


def overlaps(dsn: str) -> Overlaps:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(_INTERVALS).fetchall()
    found = Overlaps(attempts=len(rows))
    by_type: dict[str, list[tuple[datetime, datetime | None]]] = {}
    by_group: dict[tuple[str, str], list[tuple[datetime, datetime | None]]] = {}
    for type_name, key, started, ended, killed, reaped in rows:
        found.killed += bool(killed)
        found.reaped += bool(reaped)
        found.unended += ended is None
        by_type.setdefault(type_name, []).append((started, ended))
        by_group.setdefault((type_name, key or ""), []).append((started, ended))
    # Each against the limit it declares: ``limited`` as a whole, ``keyed`` per group.
    for type_name, spans in by_type.items():
        limit = FLOW_CONCURRENCY if type_name == "limited" else None
        found.by_type[type_name], excess = _most(spans, limit, (type_name, "*"))
        found.excess += excess
    for (type_name, group), spans in by_group.items():
        limit = FLOW_KEY_CONCURRENCY if type_name == "keyed" else None
        found.by_group[(type_name, group)], excess = _most(spans, limit, (type_name, group))
        found.excess += excess
    return found


def flow_jobs(
    limited: int,
    keyed: int,
    rated: int = 0,
    *,
    rng: random.Random,
    ms: tuple[int, int] = (50, 200),
) -> tuple[list[tuple[str, Spec]], list[str | None]]:
    """``limited`` jobs of the type limited as a whole, ``keyed`` of the keyed type
    spread over ``KEYS`` and ``rated`` of the rated type over ``RATED_KEYS``,
    interleaved, each held ``ms`` (a range); and their keys."""
    jobs: list[tuple[str, Spec]] = []
    keys: list[str | None] = []
    kinds = ["limited"] * limited + ["keyed"] * keyed + ["rated"] * rated
    rng.shuffle(kinds)
    choices = {"keyed": KEYS, "rated": RATED_KEYS}
    for n, kind in enumerate(kinds):
        jobs.append((kind, Spec(n=n, ms=rng.randint(*ms))))
        keys.append(rng.choice(choices[kind]) if kind in choices else None)
    return jobs, keys


# The rated type's attempts: each started (was counted by its acquire) at a moment
# between its acquire's transaction start and its handler's first statement.
_STARTS = """
SELECT i.limit_key, i.leased_at, i.started_at
FROM faults_intervals AS i
JOIN pgwork.jobs AS j ON j.id = i.job_id
WHERE j.type_name = 'rated'
"""


@dataclass(slots=True)
class Densest:
    """The most ``rated`` attempts certainly started within one window of the rate's
    length (``tests/_starts.py`` says how): for the type, and for each group (the
    key, or ``''``). A correct build never shows more than its rate, and an excess is
    one the database allowed. Attempts whose worker was stopped between their acquire
    and their handler's first statement have wide bounds and are seldom counted,
    which only lowers the figure."""

    attempts: int = 0
    by_type: int = 0
    by_group: Counter[str] = field(default_factory=Counter)
    # (group or '*' for the type, window start, how many): the first windows past a rate.
    excess: list[tuple[str, str, int]] = field(default_factory=list)
    # The widest bounds seen (seconds), for the notes.
    widest_s: float = 0.0

    def most_keyed(self) -> int:
        return max(self.by_group.values(), default=0)

    def within_rates(self) -> bool:
        return self.by_type <= FLOW_RATE.n and self.most_keyed() <= FLOW_KEY_RATE.n

    def as_notes(self) -> dict[str, Any]:
        return {
            "rated_attempts": self.attempts,
            "most_started_in_a_window": self.by_type,
            "most_started_in_a_window_per_key": {
                group or "(no key)": n for group, n in sorted(self.by_group.items())
            },
            "widest_start_bounds_s": round(self.widest_s, 3),
            **({"rate_excess": self.excess[:6]} if self.excess else {}),
        }


def _densest(
    starts: Sequence[Start], window: timedelta, limit: int, label: str
) -> tuple[int, list[tuple[str, str, int]]]:
    """The most starts certainly inside one window, and the first windows holding
    more than ``limit``."""
    found = windows(starts, window)
    excess = [(label, at.isoformat(), n) for at, n in found if n > limit][:3]
    return max((n for _, n in found), default=0), excess


def densest(dsn: str) -> Densest:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(_STARTS).fetchall()
    found = Densest(attempts=len(rows))
    spans: list[Start] = []
    by_group: dict[str, list[Start]] = {}
    for key, leased_at, started_at in rows:
        assert leased_at is not None
        assert leased_at <= started_at, (leased_at, started_at)
        found.widest_s = max(found.widest_s, (started_at - leased_at).total_seconds())
        spans.append((leased_at, started_at))
        by_group.setdefault(key or "", []).append((leased_at, started_at))
    found.by_type, found.excess = _densest(spans, FLOW_RATE.per, FLOW_RATE.n, "*")
    for group, group_spans in by_group.items():
        found.by_group[group], excess = _densest(
            group_spans, FLOW_KEY_RATE.per, FLOW_KEY_RATE.n, group
        )
        found.excess += excess
    return found


@dataclass(slots=True)
class Callers:
    """What the racing callers did."""

    enqueued: int = 0
    transactions: int = 0
    locks: int = 0
    rows_locked: Counter[str] = field(default_factory=Counter)
    # A caller that failed: the scenario did not race as meant.
    errors: list[str] = field(default_factory=list)


def _enqueuer(dsn: str, stop: threading.Event, rng: random.Random, callers: Callers) -> None:
    """Enqueue a few jobs of both types in a transaction held open a random moment
    (0-300 ms), again and again until ``stop``; the last commits too."""

    async def go() -> None:
        reg = registry()
        state = await PostgresStateAdapter.connect(dsn, min_size=1, max_size=1)
        client = create_client(
            state_adapter=state, notify_adapter=PostgresNotifyAdapter(dsn), registry=reg
        )
        try:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                while not stop.is_set():
                    jobs, keys = flow_jobs(2, 4, 1, rng=rng)
                    items = [
                        ChainStart(reg.get(name), spec, limit_key=key)
                        for (name, spec), key in zip(jobs, keys, strict=True)
                    ]
                    await client.start_chains(conn, items)
                    await asyncio.sleep(rng.uniform(0.0, 0.3))
                    await conn.commit()
                    callers.enqueued += len(items)
                    callers.transactions += 1
                    await asyncio.sleep(rng.uniform(0.0, 0.1))
        finally:
            await client.close()

    asyncio.run(go())


_LOCK_SOME = """
SELECT status::text FROM pgwork.jobs
WHERE status IN ('pending', 'running') AND type_name = ANY(%s)
ORDER BY random() LIMIT 4
FOR NO KEY UPDATE SKIP LOCKED
"""


def _locker(dsn: str, stop: threading.Event, rng: random.Random, callers: Callers) -> None:
    """Lock a few pending or running jobs of both types (as a caller's cancel or update
    would) and hold them 0.2-0.6 s, changing nothing, again and again until ``stop``."""
    with psycopg.connect(dsn) as conn:
        while not stop.is_set():
            rows = conn.execute(_LOCK_SOME, (list(FLOW_TYPES),)).fetchall()
            callers.locks += 1
            callers.rows_locked.update(status for (status,) in rows)
            stop.wait(rng.uniform(0.2, 0.6))
            conn.rollback()
            stop.wait(rng.uniform(0.0, 0.2))


@contextmanager
def racing_callers(dsn: str, *, seed: int) -> Iterator[Callers]:
    """Two callers racing the workers for the block's length: one enqueueing in open
    transactions committed at random moments, one holding row locks on jobs."""
    stop = threading.Event()
    callers = Callers()

    def run(role: Any, rng: random.Random) -> None:
        try:
            role(dsn, stop, rng, callers)
        except Exception as exc:
            callers.errors.append(repr(exc))

    threads = [
        threading.Thread(target=run, args=(role, random.Random(seed + n)))
        for n, role in enumerate((_enqueuer, _locker))
    ]
    for thread in threads:
        thread.start()
    try:
        yield callers
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
