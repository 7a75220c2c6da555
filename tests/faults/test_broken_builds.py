"""Each oracle fails against a deliberately broken build, so no scenario passes
vacuously. The breakage lives only in the worker driver (``PGWORK_FAULTS_BROKEN``
swaps the adapter's SQL in that process); the library is untouched."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from tests.faults._inject import kill_random_worker, recovery_bound
from tests.faults._jobs import Spec
from tests.faults._load import Load, run_under_faults
from tests.faults._oracle import Figures
from tests.faults._worker import BROKEN_ENV

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


# Atomic jobs whose first run outlives its lease (legal: the worker renews an atomic
# attempt's lease while its handler runs), on two workers polling often enough to reap
# each other's expired leases well before those runs end (2.5 leases, under the type's
# timeout of 3). A run after the first is quick and ends first; the workers' final
# stop lets the first runs finish (grace), so each job's every run gets its chance to
# commit.
OUTLIVE = Load(
    jobs=4, workers=2, slots=4, lease=1.0, poll=0.2, faults=0, drain_timeout=15, grace=5.0
)
OUTLIVING_JOBS = [
    ("effect", Spec(n=n, ms=50, first_ms=int(OUTLIVE.lease * 2500))) for n in range(4)
]


def _no_fault(fleet: object, figures: Figures) -> None:  # pragma: no cover - faults=0
    raise AssertionError("this scenario injects no fault")


def run_outliving(dsn: str, breakage: str) -> Figures:
    figures, _ = run_under_faults(
        dsn,
        f"atomic jobs outlive their lease, build: {breakage or 'correct'}",
        OUTLIVE,
        _no_fault,
        env={BROKEN_ENV: breakage},
        jobs=OUTLIVING_JOBS,
    )
    return figures


def test_unfenced_build_commits_duplicate_effects(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    """Without the lease-token check and the refusal of a completion for a job that is
    no longer running, an atomic job whose lease is not renewed while its long first
    run goes on is reaped by the other worker and run again, and both runs commit
    their effect."""
    figures = report(run_outliving(fault_dsn, "unrenewed-atomic,unfenced"))
    assert figures.duplicate_effects > 0


def test_the_fence_refuses_the_effect_of_a_reaped_atomic_run(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    """The control for the test above: the same reaped runs, with the fence. Each job
    runs twice (its lease was not renewed), and commits one effect."""
    figures = report(run_outliving(fault_dsn, "unrenewed-atomic"))
    assert (figures.completed, figures.lost) == (len(OUTLIVING_JOBS), 0)
    assert figures.duplicate_executions > 0
    assert figures.duplicate_effects == 0


def test_correct_build_runs_the_same_jobs_without_a_duplicate(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    """The renewal of an atomic attempt's lease keeps the other worker from reaping
    the long runs, so each job runs once and commits one effect (the two tests above
    are its controls: without renewals the jobs run twice)."""
    figures = report(run_outliving(fault_dsn, ""))
    assert (figures.completed, figures.lost) == (len(OUTLIVING_JOBS), 0)
    assert figures.duplicate_effects == 0
    assert figures.duplicate_executions == 0


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
    # Per job too: the extra runs fall on jobs no kill found held, the evidence the
    # SIGKILL and SIGSTOP scenarios assert is empty.
    assert figures.unexplained_duplicates != []
