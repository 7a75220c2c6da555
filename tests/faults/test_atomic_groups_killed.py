"""SIGKILL workers that commit atomic attempts in groups: a group killed before its
commit runs again, every member of it, and no member's effect is committed twice.

The jobs are short atomic ``effect`` jobs, whose handlers write (they take under the
group wait, so they are grouped); in a second run half are ``quiet`` ones, whose
handlers write nothing, so that their completions wait for the group's commit and are
written with it in one statement. A kill waits for a worker one of whose members has
finished its handler and waits in an open group (a kill after the queue drained finds
none); every job killed before its group committed must run again, and none be lost.
The control build commits each member's writes on their own, before the group's
commit of its completion: a kill in between runs the job again, and its effect is
committed twice (run on ``effect`` jobs only: half as many effects, and one run in
two saw none duplicated)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from tests.faults._inject import kill_worker_mid_group
from tests.faults._jobs import Spec
from tests.faults._load import Load, run_under_faults
from tests.faults._oracle import Figures
from tests.faults._worker import BROKEN_ENV

pytestmark = pytest.mark.timeout(240)

GROUPED = Load(
    jobs=1500,
    workers=3,
    slots=8,
    lease=1.0,
    poll=0.2,
    faults=4,
    fault_every=0.6,
    drain_timeout=60.0,
    atomic_group=16,
    # Long enough that a kill finds members waiting in open groups: at 20 ms, with a
    # lane per 2 slots, the control saw 1-7 duplicated effects and none in 1 run of 13.
    atomic_group_wait=0.05,
)


def _short_atomic_jobs(count: int, *, quiet: bool) -> list[tuple[str, Spec]]:
    """``count`` short ``effect`` jobs, or (``quiet``) every other one ``quiet``."""
    rng = random.Random(11)
    return [
        ("quiet" if quiet and n % 2 == 0 else "effect", Spec(n=n, ms=rng.randint(0, 3)))
        for n in range(count)
    ]


def _recovery_bound(load: Load) -> float:
    """As ``recovery_bound``, with what a grouping worker may hold: running and
    prefetched jobs plus members waiting for their group's commit (the worker keeps
    at most twice its slots and prefetch unsettled)."""
    held = 4 * load.slots
    return load.lease + (held / max(1, load.workers - 1) + 1) * load.poll + 1.0


def _run(dsn: str, breakage: str, *, quiet: bool = False) -> Figures:
    mix = ", half writing nothing" if quiet else ""
    figures, fleet = run_under_faults(
        dsn,
        f"SIGKILL grouped atomic workers{mix}, build: {breakage or 'correct'}",
        GROUPED,
        kill_worker_mid_group(dsn, GROUPED, probe_timeout=_recovery_bound(GROUPED) + 0.5),
        env={BROKEN_ENV: breakage} if breakage else None,
        jobs=_short_atomic_jobs(GROUPED.jobs, quiet=quiet),
    )
    assert not fleet.unexpected_exits()
    return figures


@pytest.mark.parametrize("quiet", [False, True], ids=["all-writing", "half-writing-nothing"])
def test_sigkilled_grouping_workers_lose_no_job_and_duplicate_no_effect(
    fault_dsn: str, report: Callable[[Figures], Figures], quiet: bool
) -> None:
    figures = report(_run(fault_dsn, "", quiet=quiet))
    assert figures.faults >= 1
    assert figures.notes.get("kills_mid_group", 0) >= 1
    assert figures.lost == 0
    assert figures.completed == figures.jobs
    assert figures.duplicate_effects == 0
    assert figures.recovery_max_s is not None
    assert figures.recovery_max_s <= _recovery_bound(GROUPED), figures.recovery_s


def test_committing_members_before_their_group_duplicates_effects(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    """The control: effects committed apart from their completion are committed again
    by the run after the kill."""
    figures = report(_run(fault_dsn, "early-commit"))
    assert figures.faults >= 1
    assert figures.notes.get("kills_mid_group", 0) >= 1
    assert figures.duplicate_effects > 0
