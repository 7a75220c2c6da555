"""SIGKILL a worker mid-job, again and again, under load: no job is lost, no atomic
job's effect is committed twice, and what the dead worker held is runnable again
within its lease plus a reap interval."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.faults._inject import kill_random_worker, recovery_bound
from tests.faults._load import run_under_faults
from tests.faults._oracle import Figures
from tests.faults.conftest import Tier

pytestmark = pytest.mark.timeout(240)


def test_sigkilled_workers_lose_no_job_and_duplicate_no_effect(
    fault_dsn: str, tier: Tier, report: Callable[[Figures], Figures]
) -> None:
    load = tier.load()
    figures, fleet = run_under_faults(
        fault_dsn, "SIGKILL a worker mid-job", load, kill_random_worker(fault_dsn, load)
    )
    report(figures)
    assert figures.faults >= 1
    assert figures.lost == 0
    assert figures.completed == figures.jobs
    assert figures.duplicate_effects == 0
    assert figures.duplicate_executions <= figures.in_flight_at_faults, figures.notes
    assert figures.recovery_max_s is not None
    assert figures.recovery_max_s <= recovery_bound(load), figures.recovery_s
    assert not fleet.unexpected_exits()
