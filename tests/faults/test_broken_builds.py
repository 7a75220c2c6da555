"""Each oracle fails against a deliberately broken build, so no scenario passes
vacuously. The breakage lives only in the worker driver (``PGWORK_FAULTS_BROKEN``
swaps the adapter's SQL in that process); the library is untouched."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from tests.faults._inject import kill_random_worker, recovery_bound
from tests.faults._jobs import Spec
from tests.faults._load import Load, run_under_faults
from tests.faults._oracle import Figures
from tests.faults._worker import BROKEN_ENV
from tests.faults.conftest import Tier

pytestmark = pytest.mark.timeout(120)

SMALL = Load(jobs=60, workers=2, slots=6, lease=1.0, faults=1, fault_every=1.0, drain_timeout=3)


def run_broken(dsn: str, breakage: str, load: Load = SMALL, **kwargs: Any) -> Figures:
    figures, _ = run_under_faults(
        dsn,
        f"SIGKILL, broken build: {breakage}",
        load,
        # Just past the bound: a broken build need not be waited for any longer.
        kill_random_worker(dsn, load, probe_timeout=recovery_bound(load) + 0.5),
        env={BROKEN_ENV: breakage},
        **kwargs,
    )
    return figures


def test_unfenced_build_commits_duplicate_effects(
    fault_dsn: str, report: Callable[[Figures], Figures], tier: Tier
) -> None:
    """Without the lease-token check and row lock, an atomic job that outlives its
    lease (legal: the row lock, not renewals, holds an atomic job) is reaped and run
    again while the first run still commits. The correct build runs the same jobs in
    the SIGKILL scenario's mix without a duplicate."""
    if tier.name == "quick":
        pytest.skip(
            "open (issue 5): at the quick tier's sizes the unfenced build no longer shows a "
            "duplicate effect reliably since the engine's latest reap changes; the full tier "
            "(--faults-full) still runs this oracle check"
        )
    slow_atomic = [("effect", Spec(n=n, ms=int(SMALL.lease * 2000))) for n in range(24)]
    load = replace(SMALL, drain_timeout=20)
    figures = report(run_broken(fault_dsn, "unfenced", load, jobs=slow_atomic))
    assert figures.duplicate_effects > 0


def test_build_that_never_reaps_loses_jobs(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    figures = report(run_broken(fault_dsn, "no-reap"))
    assert figures.lost > 0
    assert figures.recovery_max_s is None or figures.recovery_max_s > recovery_bound(SMALL)


def test_build_that_reaps_live_leases_duplicates_executions(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    figures = report(run_broken(fault_dsn, "eager-reap"))
    assert figures.duplicate_executions > figures.in_flight_at_faults
