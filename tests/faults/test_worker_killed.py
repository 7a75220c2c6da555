"""SIGKILL a worker mid-job, again and again, under load: no job is lost, no atomic
job's effect is committed twice, and what the dead worker held is runnable again
within its lease plus a reap interval."""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable

import pytest
from tests.faults._fleet import Fleet
from tests.faults._load import Load, run_under_faults
from tests.faults._oracle import Figures, RecoveryProbe, held_leases
from tests.faults.conftest import Tier

pytestmark = pytest.mark.timeout(240)


def kill_random_worker(dsn: str, lease: float, seed: int = 7) -> Callable[[Fleet, Figures], None]:
    rng = random.Random(seed)

    def inject(fleet: Fleet, figures: Figures) -> None:
        victim = fleet.kill(rng.randrange(len(fleet.workers)), signal.SIGKILL)
        killed_at = time.monotonic()
        victim.proc.wait(10)
        held = held_leases(dsn, worker=victim.worker_id)
        figures.faults += 1
        figures.in_flight_at_faults += len(held)
        recovery = RecoveryProbe(dsn, held, killed_at).wait(timeout=3 * lease + 15)
        figures.recovery_s.append(recovery if recovery is not None else float("inf"))

    return inject


def kill_load(tier: Tier) -> Load:
    return Load(
        jobs=tier.load_jobs,
        workers=tier.workers,
        slots=tier.slots,
        lease=tier.lease,
        faults=tier.faults,
        fault_every=tier.fault_every,
    )


def recovery_bound(load: Load) -> float:
    """Lease, plus the reaper's turns (one expired lease per turn, a turn at least
    every poll interval, spread over the surviving workers), plus 1 s of slack."""
    turns = load.slots / max(1, load.workers - 1) + 1
    return load.lease + turns * load.poll + 1.0


def test_sigkilled_workers_lose_no_job_and_duplicate_no_effect(
    fault_dsn: str, tier: Tier, report: Callable[[Figures], Figures]
) -> None:
    load = kill_load(tier)
    figures, fleet = run_under_faults(
        fault_dsn, "SIGKILL a worker mid-job", load, kill_random_worker(fault_dsn, load.lease)
    )
    report(figures)
    assert figures.faults >= 1
    assert figures.lost == 0
    assert figures.completed == figures.jobs
    assert figures.duplicate_effects == 0
    assert figures.duplicate_executions <= figures.in_flight_at_faults
    assert figures.recovery_max_s is not None
    assert figures.recovery_max_s <= recovery_bound(load), figures.recovery_s
    assert not fleet.unexpected_exits()
