"""A seeded, randomized fault schedule over a fleet of worker processes.

``schedule(seed, seconds, kinds)`` draws, from the seed alone, a sequence of steps: a
batch of jobs to enqueue, a pause, then one fault. ``run`` plays it against a fleet
whose every worker reaches the server through a proxy of its own, then lets the work
drain; ``tests/faults/_contract.py`` checks the contract.

The same seed, length and kinds give the same schedule: a failing seed is a
reproducible bug report (the failure says how to replay it).
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID, uuid4

import psycopg
from tests.faults._cluster import PrivateCluster
from tests.faults._contract import unexplained
from tests.faults._fleet import Fleet, Options
from tests.faults._inject import (
    _kill,
    _probe,
    _union,
    hang_server,
    outage,
    recovery_bound,
    terminate_backends,
)
from tests.faults._jobs import Spec, registry
from tests.faults._load import Load, enqueue
from tests.faults._oracle import Figures, held_leases, measure, wait_settled
from tests.faults._proxy import Proxy, via

from pgwork import PostgresNotifyAdapter, PostgresStateAdapter, create_client

__all__ = ["ALL_KINDS", "ON_KINDS", "Chaos", "Schedule", "drain_bound", "run", "schedule"]

# Faults of the worker's processes, the server and the network.
ON_KINDS = ("kill", "pause", "outage", "blackhole", "terminate", "hang")
# Faults a caller or a handler brings:
#   caller-lock     a caller's transaction holds a running job's row for a while
#   hostile-notice  malformed and unknown notices on the worker's channel
#   unwritable      atomic jobs whose outcome can never be committed (in the job mix)
#   cancel-race     chains cancelled while their atomic job runs and hands on
GATED_KINDS = ("caller-lock", "hostile-notice", "unwritable", "cancel-race")
# A run draws from all of them unless ``--faults-random-kinds`` narrows it down.
ALL_KINDS = ON_KINDS + GATED_KINDS
# Kinds that are jobs in the mix rather than faults of their own.
_JOB_KINDS = {"unwritable"}

LOAD = Load(jobs=0, workers=3, slots=4, lease=1.0, poll=0.5, grace=0.2)
TYPES = "work,effect,quiet,boom,unwritable,relay"


def drain_bound(load: Load = LOAD) -> float:
    """How long after the last fault every job must have reached a final state:
    reaping what the fault left behind, a retry's backoff and a long job.

    An atomic attempt holds no job row while its handler runs (its lease is renewed);
    a hand-on's write holds its row until the COMMIT right behind it, so a fault that
    stops the worker in between (a pause, a black-holed path, both shorter than the
    server's bound on the transaction) holds the row as long as the fault lasts, over
    before the drain begins."""
    return recovery_bound(load) + 0.9 + 2 * load.lease + 5


@dataclass(frozen=True, slots=True)
class Step:
    jobs: tuple[tuple[str, Spec], ...]
    wait: float
    kind: str
    seconds: float  # how long the fault lasts (where it lasts)
    target: int  # which worker or job it picks (modulo what there is)


@dataclass(frozen=True, slots=True)
class Schedule:
    seed: int
    seconds: float
    kinds: tuple[str, ...]
    steps: tuple[Step, ...]

    def describe(self) -> str:
        return ", ".join(f"{s.kind}({s.seconds:.1f}s)" for s in self.steps)


def _job(rng: random.Random, n: int, kinds: Sequence[str]) -> tuple[str, Spec]:
    roll = rng.random()
    if "unwritable" in kinds and roll < 0.04:
        return ("unwritable", Spec(n=n, ms=rng.randint(10, 100)))
    if "cancel-race" in kinds and roll < 0.10:
        return ("relay", Spec(n=n, ms=rng.randint(300, 900)))
    if roll < 0.15:
        return ("boom", Spec(n=n))
    if roll < 0.20:
        # Outlives its lease: held by renewals.
        return ("work", Spec(n=n, ms=int(LOAD.lease * 2500)))
    if roll < 0.55:
        return ("work", Spec(n=n, ms=rng.randint(50, 300)))
    if roll < 0.90:
        return ("effect", Spec(n=n, ms=rng.randint(50, 300)))
    # Outlives its lease: held by its row lock, not by renewals.
    return ("effect", Spec(n=n, ms=int(LOAD.lease * 1500)))


# Roughly what a step costs beyond its wait and the fault itself (reads, the probe).
_STEP_OVERHEAD = 1.5


def schedule(seed: int, seconds: float, kinds: Sequence[str]) -> Schedule:
    """The steps for ``seconds`` of faults drawn from ``kinds``, from ``seed`` alone."""
    rng = random.Random(seed)
    faults = [k for k in kinds if k not in _JOB_KINDS] or ["kill"]
    steps: list[Step] = []
    spent, n = 0.0, 0
    while spent < seconds:
        jobs = []
        for _ in range(rng.randint(20, 50)):
            jobs.append(_job(rng, n, kinds))
            n += 1
        kind = rng.choice(faults)
        lasts = rng.uniform(2.0, 4.0) if kind in ("pause", "outage", "blackhole", "hang") else 0
        if kind == "caller-lock":
            lasts = rng.uniform(2.0, 5.0)
        step = Step(tuple(jobs), rng.uniform(0.3, 1.5), kind, lasts, rng.randrange(1 << 30))
        steps.append(step)
        spent += step.wait + step.seconds + _STEP_OVERHEAD
    return Schedule(seed, seconds, tuple(kinds), tuple(steps))


@dataclass
class Chaos:
    """What a run did, for the oracle."""

    schedule: Schedule
    figures: Figures
    fleet: Fleet
    settled: bool = False
    # The jobs still not final at the drain bound, as the database had them then.
    late: list[Any] = field(default_factory=list)
    # (chain id, the database's clock when its cancel had committed, each of the
    # chain's jobs then with the attempts it had begun)
    cancels: list[tuple[UUID, Any, dict[UUID, int]]] = field(default_factory=list)
    # (fault kind, the database's clock as it began)
    faults_at: list[tuple[str, Any]] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)


def _pause(dsn: str, fleet: Fleet, index: int, seconds: float, figures: Figures) -> None:
    """SIGSTOP a worker longer than its lease, then SIGCONT it. Its leases are read
    while it is stopped (it changes nothing then), and again a moment later: a
    statement it sent just before may commit meanwhile."""
    victim = fleet.each()[index]
    victim.send(signal.SIGSTOP)
    at = time.monotonic()
    try:
        held = held_leases(dsn, worker=victim.worker_id)
        time.sleep(0.2)
        held = _union(held, held_leases(dsn, worker=victim.worker_id))
        time.sleep(max(0.0, at + seconds - time.monotonic()))
    finally:
        victim.send(signal.SIGCONT)
    _probe(dsn, figures, held, at, 0.5)


def _blackhole(
    dsn: str, fleet: Fleet, proxies: Sequence[Proxy], index: int, seconds: float, figures: Figures
) -> None:
    """One worker's every connection stops answering (sockets open) for ``seconds``."""
    victim = fleet.each()[index]
    before = held_leases(dsn, worker=victim.worker_id)
    proxies[index].stall()
    at = time.monotonic()
    try:
        time.sleep(0.2)  # a statement sent just before may still commit
        held = _union(before, held_leases(dsn, worker=victim.worker_id))
        time.sleep(max(0.0, at + seconds - time.monotonic()))
    finally:
        proxies[index].resume()
    _probe(dsn, figures, held, at, 0.5)


def _running(dsn: str, type_names: Sequence[str]) -> list[UUID]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id FROM pgwork.jobs WHERE status = 'running' AND type_name = ANY(%s)"
            " ORDER BY id",
            (list(type_names),),
        ).fetchall()
    return [r[0] for r in rows]


def _caller_lock(dsn: str, target: int, seconds: float, figures: Figures) -> None:
    """A caller's transaction locks one running job's row (as its ``cancel`` or
    ``complete_job`` would) and commits ``seconds`` later, changing nothing. The
    contract lets that delay this one job, and nothing else."""
    running = _running(dsn, ["work", "effect", "quiet"])
    if not running:
        figures.notes["caller_lock_missed"] = figures.notes.get("caller_lock_missed", 0) + 1
        return
    job = running[target % len(running)]
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT id, lease_token FROM pgwork.jobs WHERE id = %s FOR NO KEY UPDATE", (job,)
        ).fetchone()
        time.sleep(seconds)
        conn.rollback()
    figures.faults += 1
    if row is not None:
        figures.in_flight_at_faults += 1
        figures.held_jobs.update([job])


def _hostile_notices(dsn: str, figures: Figures) -> None:
    """Notices no pgwork version sends, or one a newer version might: each must be
    logged and ignored."""
    payloads = [
        f"abort|{uuid4()}||preempted||",
        "ready||||nan|default",
        "ready||||inf|default",
        f"abort|{uuid4()}|not-a-uuid|cancelled||",
        "chain_done|||||",
        "|||||",
        "ready|" + "x" * 200,
        "\x7f|garbage",
    ]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for payload in payloads:
            conn.execute("SELECT pg_notify('pgwork_events', %s)", (payload,))
    figures.faults += 1


def _cancel_race(dsn: str, target: int, chaos: Chaos) -> None:
    """Cancel the chain of a running ``relay`` job (atomic, hands on to ``work``)."""
    running = _running(dsn, ["relay"])
    chaos.figures.faults += 1
    if not running:
        chaos.figures.notes["cancel_missed"] = chaos.figures.notes.get("cancel_missed", 0) + 1
        return
    job = running[target % len(running)]

    async def go() -> tuple[list[UUID], Any, dict[UUID, int]]:
        state = await PostgresStateAdapter.connect(dsn, min_size=1, max_size=2)
        client = create_client(
            state_adapter=state, notify_adapter=PostgresNotifyAdapter(dsn), registry=registry()
        )
        try:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                try:
                    cancelled = await client.cancel(conn, [job])
                except Exception as exc:  # the chain ended meanwhile: nothing to check
                    chaos.figures.notes.setdefault("cancel_refused", []).append(repr(exc))
                    await conn.rollback()
                    return [], None, {}
                await conn.commit()
                cur = await conn.execute("SELECT clock_timestamp()")
                row = await cur.fetchone()
                cur = await conn.execute(
                    "SELECT id, attempt FROM pgwork.jobs WHERE chain_id = ANY(%s)", (cancelled,)
                )
                begun = {job: attempt for job, attempt in await cur.fetchall()}
                await conn.commit()
                return cancelled, row[0] if row else None, begun
        finally:
            await client.close()

    cancelled, at, begun = asyncio.run(go())
    chaos.cancels.extend((chain, at, begun) for chain in cancelled)


def _not_final(dsn: str) -> list[Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT id, type_name, status::text, attempt, leased_by,"
            " to_char(leased_until, 'HH24:MI:SS.MS'), to_char(scheduled_at, 'HH24:MI:SS.MS'),"
            " last_attempt_error->>'type' FROM pgwork.jobs"
            " WHERE status NOT IN ('completed', 'failed', 'cancelled') ORDER BY id"
        ).fetchall()


def _db_now(dsn: str) -> Any:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
    return row[0] if row else None


def _server_wide(dsn: str, figures: Figures, fault: Callable[[], None]) -> None:
    """Run a fault that hits every worker (outage, hang, terminated backends), then
    count as held, once, every job whose handler started in the second after the
    injector's first read of the running jobs, the moment the fault begins: one
    acquired just after that read and started before the fault is in neither of the
    injector's reads if its attempt ended, unsettled, while the fault lasted."""
    counted = figures.held_jobs.copy()
    since = _db_now(dsn)
    fault()
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT DISTINCT job_id FROM faults_ledger"
            " WHERE at BETWEEN %s AND %s + interval '1 second'",
            (since, since),
        ).fetchall()
    this_fault = figures.held_jobs - counted
    figures.held_jobs.update(job for (job,) in rows if job not in this_fault)


def _step(
    chaos: Chaos, step: Step, dsn: str, cluster: PrivateCluster, proxies: Sequence[Proxy]
) -> None:
    fleet, figures = chaos.fleet, chaos.figures
    index = step.target % len(fleet.workers)
    quick = recovery_bound(LOAD) + 0.5
    if step.kind == "kill":
        _kill(dsn, fleet, index, figures, quick)
    elif step.kind == "pause":
        _pause(dsn, fleet, index, step.seconds, figures)
    elif step.kind == "blackhole":
        _blackhole(dsn, fleet, proxies, index, step.seconds, figures)
    elif step.kind == "outage":
        inject = outage(dsn, LOAD, cluster, step.seconds, probe_timeout=0.5)
        _server_wide(dsn, figures, lambda: inject(fleet, figures))
    elif step.kind == "hang":
        inject = hang_server(dsn, LOAD, cluster, step.seconds, probe_timeout=quick)
        _server_wide(dsn, figures, lambda: inject(fleet, figures))
    elif step.kind == "terminate":
        inject = terminate_backends(dsn, LOAD, probe_timeout=quick)
        _server_wide(dsn, figures, lambda: inject(fleet, figures))
    elif step.kind == "caller-lock":
        _caller_lock(dsn, step.target, step.seconds, figures)
    elif step.kind == "hostile-notice":
        _hostile_notices(dsn, figures)
    elif step.kind == "cancel-race":
        _cancel_race(dsn, step.target, chaos)
    else:  # pragma: no cover - schedule() draws only known kinds
        raise AssertionError(f"unknown fault kind {step.kind!r}")


def run(
    dsn: str,
    cluster: PrivateCluster,
    plan: Schedule,
    *,
    env: dict[str, str] | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> Chaos:
    """Play ``plan`` against three workers (each through its own proxy), then wait up
    to ``drain_bound`` for every job to end, and measure."""
    proxies = [Proxy(cluster.port).start() for _ in range(LOAD.workers)]
    options = Options(
        types=TYPES,
        slots=LOAD.slots,
        lease=LOAD.lease,
        poll=LOAD.poll,
        grace=LOAD.grace,
        env=env or {},
    )
    started = time.monotonic()
    fleet = Fleet(dsn, LOAD.workers, options, route=lambda i: via(dsn, proxies[i].port))
    chaos = Chaos(plan, Figures(f"randomized faults, seed {plan.seed}"), fleet)
    try:
        fleet.start()
        for number, step in enumerate(plan.steps):
            enqueue(dsn, step.jobs)
            time.sleep(step.wait)
            progress(f"step {number}: {step.kind} {step.seconds:.1f}s")
            chaos.faults_at.append((step.kind, _db_now(dsn)))
            _step(chaos, step, dsn, cluster, proxies)
        cluster.wait_ready()
        drained_from = time.monotonic()
        chaos.settled = wait_settled(dsn, drain_bound())
        chaos.figures.notes["drain_s"] = round(time.monotonic() - drained_from, 2)
        if not chaos.settled:
            chaos.late = _not_final(dsn)
        chaos.figures.elapsed_s = time.monotonic() - started
        chaos.figures.notes["restarts"] = fleet.restarts
    finally:
        fleet.close()
        for proxy in proxies:
            proxy.close()
    measure(dsn, chaos.figures)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pgwork.jobs WHERE status = 'cancelled'").fetchone()
    # A cancelled chain's jobs ended as they should: not lost.
    chaos.figures.lost -= row[0] if row else 0
    # Handlers that fail by themselves run up to max_attempts times, faults or not.
    chaos.figures.unexplained_duplicates = unexplained(dsn, chaos.figures)
    return chaos
