"""SIGKILL workers whose atomic handlers are plain ``def``s: a sync handler's writes
through ``attempt.connection`` commit with its job's completion or not at all, so a
kill mid-handler runs the job again and its effect is committed once.

The jobs are ``sync_effect`` ones: the handler writes its effect row through the
blocking connection lent to its thread, calls ``commit()`` on it (which keeps the row
for the job's transaction), then sleeps, so most kills find handlers with their effect
written and not yet committed. The control build makes that ``commit()`` commit the
job's transaction there and then: a kill during the sleep runs the job again, and its
effect is committed twice."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from tests.faults._inject import kill_random_worker, recovery_bound
from tests.faults._jobs import Spec
from tests.faults._load import Load, run_under_faults
from tests.faults._oracle import Figures
from tests.faults._worker import BROKEN_ENV

pytestmark = pytest.mark.timeout(240)

SYNC = Load(jobs=400, workers=3, slots=8, lease=1.0, poll=0.2, faults=4, fault_every=1.0)


def _sync_effect_jobs(count: int) -> list[tuple[str, Spec]]:
    rng = random.Random(13)
    return [("sync_effect", Spec(n=n, ms=rng.randint(50, 300))) for n in range(count)]


def _run(dsn: str, breakage: str) -> Figures:
    figures, fleet = run_under_faults(
        dsn,
        f"SIGKILL workers mid sync atomic handler, build: {breakage or 'correct'}",
        SYNC,
        kill_random_worker(dsn, SYNC),
        env={BROKEN_ENV: breakage} if breakage else None,
        jobs=_sync_effect_jobs(SYNC.jobs),
        types="sync_effect",
    )
    assert not fleet.unexpected_exits()
    return figures


def test_sigkilled_sync_atomic_handlers_lose_no_job_and_duplicate_no_effect(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    figures = report(_run(fault_dsn, ""))
    assert figures.faults >= 1
    assert figures.lost == 0
    assert figures.completed == figures.jobs
    assert figures.duplicate_effects == 0
    assert figures.duplicate_executions >= 1, "no kill found a handler running"
    assert figures.recovery_max_s is not None
    assert figures.recovery_max_s <= recovery_bound(SYNC), figures.recovery_s


def test_a_sync_handler_committing_apart_from_its_job_duplicates_effects(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    """The control: an effect committed before its job's completion is committed again
    by the run after the kill."""
    figures = report(_run(fault_dsn, "sync-commit-apart"))
    assert figures.faults >= 1
    assert figures.duplicate_effects > 0
