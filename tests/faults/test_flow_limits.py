"""Flow limits hold exactly across worker processes, under kills, pauses and callers.

Three worker processes of eight slots each (far more than the limits) run a type
limited to three attempts at once (``limited``) and a type limited to two per limit
key (``keyed``, over four keys and jobs without a key, which share one group), and a
type limited to six starts in any half second and two per key (``rated``). Each
handler holds its attempt 50-200 ms and records its interval by the database's clock
(``tests/faults/_flow.py`` says how a killed attempt's interval ends: at its job's
reap). Meanwhile workers are SIGKILLed (the supervisor starts a replacement; the dead
worker's jobs count until they are reaped) and SIGSTOPped for less than a lease (their
jobs still count while they are stopped), a caller enqueues more jobs in transactions
it holds open for a random moment, and another holds row locks on pending and running
jobs for a while.

The oracle, outside pgwork: at no instant more than three ``limited`` attempts ran, nor
more than two ``keyed`` ones of one group; no half second saw more than six ``rated``
attempts start, nor more than two of one group (``_flow.Densest`` says how a start is
bounded); the limits and rates were reached (three, two for some group, six, two for
some key), so the bounds are not met by running too little; every job completed.

The control runs the same scenario on ``racy-limits``, a build whose limited acquire
takes no lock before it counts what runs and what started: two acquires at once each
fill the same room, and the oracle sees more running than the limit and more started
than the rate.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from tests.faults._db import scalar
from tests.faults._fleet import BROKEN_ENV, Fleet, Options
from tests.faults._flow import (
    Callers,
    Densest,
    Overlaps,
    densest,
    flow_jobs,
    overlaps,
    racing_callers,
)
from tests.faults._inject import kill_random_worker, pause_busiest_worker
from tests.faults._jobs import FLOW_CONCURRENCY, FLOW_KEY_CONCURRENCY, FLOW_KEY_RATE, FLOW_RATE
from tests.faults._load import Load, enqueue
from tests.faults._oracle import Figures, measure, wait_settled

pytestmark = pytest.mark.timeout(120)

# Short polls and leases: a killed worker's jobs are reaped within about two seconds,
# so the scenario sees them counted, then freed, several times within its run.
LOAD = Load(
    jobs=0, workers=3, slots=8, lease=1.5, poll=0.2, faults=4, fault_every=1.0, drain_timeout=30
)
LIMITED_JOBS = 150
KEYED_JOBS = 300
# About ten seconds at the rates: six a half second while every key has jobs, then two
# a half second for the key that holds half of them.
RATED_JOBS = 80
# Well under the lease: the paused worker's leases hold, its jobs still count.
PAUSE_S = 0.5


@dataclass(slots=True)
class FlowRun:
    figures: Figures
    overlaps: Overlaps
    densest: Densest
    callers: Callers
    unexpected_exits: list[Any]


def run_flow(dsn: str, build: str = "", *, seed: int = 3) -> FlowRun:
    """Enqueue the jobs, start the fleet and the racing callers, alternate a SIGKILL
    and a pause every ``fault_every`` seconds, stop the callers, drain, measure."""
    figures = Figures(
        f"flow limits: SIGKILL, SIGSTOP < lease, racing callers, build: {build or 'correct'}"
    )
    jobs, keys = flow_jobs(LIMITED_JOBS, KEYED_JOBS, RATED_JOBS, rng=random.Random(seed))
    enqueue(dsn, jobs, keys=keys)
    options = Options(
        types="limited,keyed,rated",
        slots=LOAD.slots,
        lease=LOAD.lease,
        poll=LOAD.poll,
        grace=LOAD.grace,
        env={BROKEN_ENV: build} if build else {},
    )
    kill = kill_random_worker(dsn, LOAD, seed=seed)
    pause = pause_busiest_worker(dsn, LOAD, PAUSE_S)
    started = time.monotonic()
    fleet = Fleet(dsn, LOAD.workers, options)
    try:
        fleet.start()
        with racing_callers(dsn, seed=seed) as callers:
            next_fault = time.monotonic() + LOAD.fault_every
            while figures.faults < LOAD.faults and _unfinished(dsn) > 0:
                time.sleep(max(0.0, next_fault - time.monotonic()))
                (kill if figures.faults % 2 == 0 else pause)(fleet, figures)
                next_fault = time.monotonic() + LOAD.fault_every
        wait_settled(dsn, LOAD.drain_timeout)
        figures.elapsed_s = time.monotonic() - started
        figures.notes["restarts"] = fleet.restarts
        unexpected = [(e.worker_id, e.returncode, e.tail[-3:]) for e in fleet.unexpected_exits()]
    finally:
        fleet.close()
    measure(dsn, figures)
    found = overlaps(dsn)
    figures.notes.update(found.as_notes())
    starts = densest(dsn)
    figures.notes.update(starts.as_notes())
    figures.notes["callers"] = {
        "enqueued": callers.enqueued,
        "transactions": callers.transactions,
        "lock_holds": callers.locks,
        "rows_locked": dict(callers.rows_locked),
        **({"errors": callers.errors} if callers.errors else {}),
    }
    return FlowRun(figures, found, starts, callers, unexpected)


def _unfinished(dsn: str) -> int:
    return int(
        scalar(dsn, "SELECT count(*) FROM pgwork.jobs WHERE status NOT IN ('completed', 'failed')")
    )


def check_flow(run: FlowRun) -> None:
    """The scenario's oracle (run against the racy build too, which must fail it)."""
    figures, found, starts = run.figures, run.overlaps, run.densest
    assert found.unended == 0, figures.notes
    assert found.by_type["limited"] <= FLOW_CONCURRENCY, found.excess
    assert found.most_keyed() <= FLOW_KEY_CONCURRENCY, found.excess
    assert starts.by_type <= FLOW_RATE.n, starts.excess
    assert starts.most_keyed() <= FLOW_KEY_RATE.n, starts.excess
    # Not vacuous: the limits and rates were reached, with far more slots than they allow.
    assert found.by_type["limited"] == FLOW_CONCURRENCY, figures.notes
    assert found.most_keyed() == FLOW_KEY_CONCURRENCY, figures.notes
    assert starts.by_type == FLOW_RATE.n, figures.notes
    assert starts.most_keyed() == FLOW_KEY_RATE.n, figures.notes
    # Not vacuous either: the kills found attempts running, the callers raced.
    assert figures.faults == LOAD.faults
    assert found.killed > 0, figures.notes
    assert not run.callers.errors
    assert run.callers.transactions > 0
    assert run.callers.locks > 0
    assert figures.lost == 0
    assert figures.completed == figures.jobs
    assert figures.duplicate_effects == 0
    assert figures.unexplained_duplicates == [], figures.notes
    assert not run.unexpected_exits


def test_flow_limits_hold_under_kills_pauses_and_racing_callers(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    run = run_flow(fault_dsn)
    report(run.figures)
    check_flow(run)


def test_racy_build_runs_more_than_the_limit(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    """The control: without the lock, concurrent acquires each count the same running
    jobs and the same starts, and each fill the room that leaves."""
    run = run_flow(fault_dsn, "racy-limits")
    report(run.figures)
    assert not run.overlaps.within_limits(), run.figures.notes
    assert not run.densest.within_rates(), run.figures.notes
    with pytest.raises(AssertionError):
        check_flow(run)
