"""Enqueueing a scenario's jobs, and running a fleet under a repeated fault."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from uuid import UUID

import psycopg
from tests.faults._fleet import Fleet, Options
from tests.faults._jobs import Spec, registry
from tests.faults._oracle import Figures, measure, wait_settled

from pgwork import ChainStart, PostgresNotifyAdapter, PostgresStateAdapter, create_client

__all__ = ["Load", "enqueue", "mixed_jobs", "run_under_faults", "saturating_jobs"]


def enqueue(
    dsn: str,
    jobs: Sequence[tuple[str, Spec]],
    *,
    chunk: int = 1000,
    keys: Sequence[str | None] | None = None,
) -> list[UUID]:
    """Start one chain per (type name, spec) through pgwork's client, each with its
    limit key from ``keys`` (default: none); return job ids."""
    limit_keys = list(keys) if keys is not None else [None] * len(jobs)
    assert len(limit_keys) == len(jobs)

    async def go() -> list[UUID]:
        reg = registry()
        state = await PostgresStateAdapter.connect(dsn, min_size=1, max_size=2)
        client = create_client(
            state_adapter=state, notify_adapter=PostgresNotifyAdapter(dsn), registry=reg
        )
        ids: list[UUID] = []
        try:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                for start in range(0, len(jobs), chunk):
                    items = [
                        ChainStart(reg.get(name), spec, limit_key=key)
                        for (name, spec), key in zip(
                            jobs[start : start + chunk],
                            limit_keys[start : start + chunk],
                            strict=True,
                        )
                    ]
                    started = await client.start_chains(conn, items)
                    await conn.commit()
                    ids.extend(s.job_id for s in started)
        finally:
            await client.close()
        return ids

    return asyncio.run(go())


def mixed_jobs(count: int, *, lease: float, rng: random.Random) -> list[tuple[str, Spec]]:
    """Half staged, half atomic; one atomic job in ten outlives its lease (its lease is
    renewed while it runs)."""
    jobs: list[tuple[str, Spec]] = []
    for n in range(count):
        roll = rng.random()
        if roll < 0.5:
            jobs.append(("work", Spec(n=n, ms=rng.randint(50, 300))))
        elif roll < 0.9:
            jobs.append(("effect", Spec(n=n, ms=rng.randint(50, 300))))
        else:
            jobs.append(("effect", Spec(n=n, ms=int(lease * 1500))))
    return jobs


# How long each job of a saturating batch runs.
SATURATING_MS = 2000


def saturating_jobs(load: Load) -> list[tuple[str, Spec]]:
    """More staged jobs than all workers but one can hold at once (each holds up to
    ``slots`` running and as many prefetched), each running longer than a worker
    takes to acquire: enqueued after a fault, some of them reach every worker that
    takes up work again, and none reach one that does not."""
    count = load.workers * 2 * load.slots + load.slots
    return [("work", Spec(n=100_000 + n, ms=SATURATING_MS)) for n in range(count)]


@dataclass(frozen=True, slots=True)
class Load:
    """Size and pace of one load scenario."""

    jobs: int
    workers: int = 3
    slots: int = 8
    lease: float = 1.0
    poll: float = 0.5
    faults: int = 4
    fault_every: float = 1.5
    drain_timeout: float = 60.0
    # How long the workers' final stop lets attempts still in flight finish.
    grace: float = 0.2
    # Atomic attempts per transaction (the worker's ``atomic_group``) and its wait.
    atomic_group: int = 1
    atomic_group_wait: float = 0.005
    # Run the workers at the library's default max_slots and pool size (``slots`` is
    # then only what the bounds assume: set it to the default, 10).
    defaults: bool = False
    # The state adapter's operation_timeout in seconds (None: the library's default).
    operation_timeout: float | None = None


Inject = Callable[[Fleet, Figures], None]


def _remaining(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pgwork.jobs WHERE status NOT IN ('completed', 'failed')"
        ).fetchone()
    return int(row[0]) if row else 0


def run_under_faults(
    dsn: str,
    scenario: str,
    load: Load,
    inject: Inject,
    *,
    env: dict[str, str] | None = None,
    seed: int = 5,
    jobs: Sequence[tuple[str, Spec]] | None = None,
    route: Callable[[int], str] | None = None,
    then: Sequence[tuple[str, Spec]] = (),
    types: str = "work,effect,quiet",
) -> tuple[Figures, Fleet]:
    """Enqueue ``jobs`` (default: ``load.jobs`` mixed jobs), start the fleet, call
    ``inject`` every ``fault_every`` seconds (at most ``faults`` times, while work
    remains), enqueue ``then`` once the last fault is over, then wait for every job to
    end and measure. ``route`` gives worker ``index`` a DSN of its own (default:
    ``dsn``); ``types``: the job types the workers run."""
    figures = Figures(scenario)
    if jobs is None:
        jobs = mixed_jobs(load.jobs, lease=load.lease, rng=random.Random(seed))
    enqueue(dsn, jobs)
    options = Options(
        types=types,
        slots=load.slots,
        lease=load.lease,
        poll=load.poll,
        grace=load.grace,
        atomic_group=load.atomic_group,
        atomic_group_wait=load.atomic_group_wait,
        defaults=load.defaults,
        operation_timeout=None if load.operation_timeout is None else str(load.operation_timeout),
        env=env or {},
    )
    started = time.monotonic()
    fleet = Fleet(dsn, load.workers, options, route=route)
    try:
        fleet.start()
        next_fault = time.monotonic() + load.fault_every
        while figures.faults < load.faults and _remaining(dsn) > 0:
            time.sleep(max(0.0, next_fault - time.monotonic()))
            inject(fleet, figures)
            next_fault = time.monotonic() + load.fault_every
        if then:
            enqueue(dsn, then)
        wait_settled(dsn, load.drain_timeout)
        figures.elapsed_s = time.monotonic() - started
        figures.notes["restarts"] = fleet.restarts
        figures.notes["unexpected_exits"] = [
            (e.worker_id, e.returncode, e.tail[-3:]) for e in fleet.unexpected_exits()
        ]
    finally:
        fleet.close()
    return measure(dsn, figures), fleet
