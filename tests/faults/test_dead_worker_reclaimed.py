"""A worker killed mid-job is found dead by its silent heartbeat, and another worker
takes back every job it held at once, long before their leases would expire.

The leases here are far longer than the dead-worker limit, so only the heartbeat path
(``find_dead_workers``, then ``reap`` of the dead worker's jobs) can bring the jobs
back in time; lease expiry cannot."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from tests.faults._db import fetch
from tests.faults._fleet import WorkerProcess, start_worker
from tests.faults._jobs import Spec
from tests.faults._load import enqueue
from tests.faults._oracle import Figures, RecoveryProbe, held_leases, measure, wait_settled
from tests.faults._worker import BROKEN_ENV

pytestmark = pytest.mark.timeout(120)

LEASE = 30.0
HEARTBEAT = 0.2
DEAD_AFTER = 1.5
# Found dead once its last heartbeat is DEAD_AFTER old, looked for every DEAD_AFTER / 3
# (at least a heartbeat), plus a heartbeat's delay and a second of slack.
RECLAIM_BOUND = DEAD_AFTER + max(HEARTBEAT, DEAD_AFTER / 3) + HEARTBEAT + 1.0
JOBS = [("work", Spec(n=n, first_ms=600_000, ms=10, slow_on="victim")) for n in range(3)] + [
    ("effect", Spec(n=3, first_ms=600_000, ms=10, slow_on="victim"))
]


@dataclass
class Reclaim:
    held: int
    recovery_s: float | None
    survivor: WorkerProcess
    figures: Figures


def run_reclaim(dsn: str, *, broken: str = "") -> Reclaim:
    """The victim takes every job, the survivor starts, the victim is SIGKILLed (frozen
    first while its leases are read), and the survivor is left to take them back."""
    options = {
        "types": "work,effect",
        "slots": 4,
        "lease": LEASE,
        "poll": 0.2,
        "heartbeat": HEARTBEAT,
        "dead_after": DEAD_AFTER,
    }
    victim = start_worker(dsn, "victim", **options)
    survivor: WorkerProcess | None = None
    try:
        ids = enqueue(dsn, JOBS)
        for job in ids:
            victim.wait_for(rf"^started {job} 1$")
        # Started once the victim holds every job: it cannot take one of them first.
        survivor = start_worker(dsn, "survivor", **options, env={BROKEN_ENV: broken})
        victim.send(signal.SIGSTOP)
        held = held_leases(dsn, worker="victim")
        victim.send(signal.SIGKILL)
        victim.proc.wait(10)
        killed_at = time.monotonic()
        recovery = RecoveryProbe(dsn, held, killed_at).wait(RECLAIM_BOUND)
        settled = recovery is not None and wait_settled(dsn, 10)
        figures = Figures(f"a killed worker's jobs reclaimed by heartbeat ({broken or 'correct'})")
        figures.faults, figures.in_flight_at_faults = 1, len(held)
        figures.held_jobs.update(job for job, _ in held)
        figures.recovery_s = [recovery if recovery is not None else float("inf")]
        figures.notes["settled"] = settled
        return Reclaim(len(held), recovery, survivor, measure(dsn, figures))
    finally:
        victim.close()
        if survivor is not None:
            survivor.close()


def check_reclaim(dsn: str, reclaim: Reclaim) -> None:
    """The scenario's oracle: every job the dead worker held came back within the
    heartbeat's bound (not its 30 s lease), through the dead-worker path, and ran to
    completion once more on the survivor, its atomic effect once."""
    assert reclaim.held == len(JOBS)
    assert reclaim.recovery_s is not None, "the dead worker's jobs were not taken back"
    assert reclaim.recovery_s <= RECLAIM_BOUND
    assert reclaim.survivor.matching(
        rf"^log WARNING pgwork\.worker .*found dead worker\(s\) victim and took back "
        rf"{len(JOBS)} running job"
    )
    rows = fetch(dsn, "SELECT status::text, output #>> '{}', attempt FROM pgwork.jobs")
    assert sorted(rows) == [("completed", "survivor", 2)] * len(JOBS)
    figures = reclaim.figures
    assert (figures.lost, figures.duplicate_effects) == (0, 0)
    assert figures.unexplained_duplicates == []


def test_killed_workers_jobs_are_reclaimed_through_its_silent_heartbeat(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    reclaim = run_reclaim(fault_dsn)
    report(reclaim.figures)
    check_reclaim(fault_dsn, reclaim)


def test_build_that_never_finds_dead_workers_fails_the_reclaim_oracle(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    """The control: without the dead-worker path the jobs wait for their leases."""
    reclaim = run_reclaim(fault_dsn, broken="no-dead-reclaim")
    report(reclaim.figures)
    with pytest.raises(AssertionError):
        check_reclaim(fault_dsn, reclaim)
    assert reclaim.recovery_s is None
