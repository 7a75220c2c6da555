"""SIGKILL a worker mid-job, again and again, under load: no job is lost, no atomic
job's effect is committed twice, and what the dead worker held is runnable again
within its lease plus a reap interval; at the tier's sizing and at the library's
default sizing (10 slots, a pool of 10 connections)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.faults._inject import kill_random_worker, recovery_bound
from tests.faults._load import run_under_faults
from tests.faults._oracle import Figures
from tests.faults.conftest import SIZINGS, Tier

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("sizing", SIZINGS)
def test_sigkilled_workers_lose_no_job_and_duplicate_no_effect(
    fault_dsn: str, tier: Tier, sizing: str, report: Callable[[Figures], Figures]
) -> None:
    load = tier.load(defaults=sizing == "defaults")
    figures, fleet = run_under_faults(
        fault_dsn,
        f"SIGKILL a worker mid-job ({sizing} sizing)",
        load,
        kill_random_worker(fault_dsn, load),
    )
    report(figures)
    assert figures.faults >= 1
    assert figures.lost == 0
    assert figures.completed == figures.jobs
    assert figures.duplicate_effects == 0
    assert figures.duplicate_executions <= figures.in_flight_at_faults, figures.notes
    # Per job, not only in total: the victim's leases are read while it is frozen, so
    # every extra run belongs to a job a kill found held (not to another's allowance).
    assert figures.unexplained_duplicates == [], figures.notes
    assert figures.recovery_max_s is not None
    assert figures.recovery_max_s <= recovery_bound(load), figures.recovery_s
    assert not fleet.unexpected_exits()
