"""The database is down for longer than the lease, then back: workers neither exit
nor spin while it is down, and every job still runs to completion afterwards."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.faults._cluster import PrivateCluster
from tests.faults._db import fetch
from tests.faults._inject import outage, recovery_bound
from tests.faults._load import Load, run_under_faults
from tests.faults._oracle import Figures
from tests.faults.conftest import Tier

pytestmark = pytest.mark.timeout(240)


def _outage_seconds(load: Load) -> float:
    return 3 * load.lease


def check_outage(figures: Figures, load: Load) -> None:
    """The scenario's oracle (also run against broken builds, which must fail it)."""
    assert figures.faults >= 1
    assert figures.lost == 0
    assert figures.completed == figures.jobs
    assert figures.duplicate_effects == 0
    assert figures.duplicate_executions <= figures.in_flight_at_faults, (
        figures.unexplained_duplicates
    )
    # No busy loop: a worker's backoff keeps it near idle while the server is down.
    assert max(figures.notes["worker_cpu_while_down"]) < 0.25
    assert max(figures.notes["retries_while_down"]) < 40
    assert figures.recovery_max_s is not None
    # The pool reconnects with its own backoff (1 s, 2 s, 4 s, ...) during the outage.
    assert figures.recovery_max_s <= recovery_bound(load) + _outage_seconds(load), (
        figures.recovery_s
    )


def test_outage_longer_than_the_lease_loses_no_job(
    fault_dsn: str, cluster: PrivateCluster, tier: Tier, report: Callable[[Figures], Figures]
) -> None:
    load = tier.load(faults=1 if tier.name == "quick" else 3, fault_every=2 * tier.fault_every)
    figures, fleet = run_under_faults(
        fault_dsn,
        f"database down {_outage_seconds(load):.0f} s (> lease), {load.workers} workers",
        load,
        outage(fault_dsn, load, cluster, _outage_seconds(load)),
    )
    report(figures)
    check_outage(figures, load)
    assert not fleet.unexpected_exits()
    assert fleet.restarts == 0


def test_outage_longer_than_the_lease_single_worker(
    fault_dsn: str, cluster: PrivateCluster, tier: Tier, report: Callable[[Figures], Figures]
) -> None:
    """Alone, the worker must take back the jobs it abandoned itself: attempts aborted
    because their lease ran out while the database was unreachable, and outcomes it
    could not write. (Found stranded for good by this test before the worker reaped its
    own abandoned leases.)"""
    load = tier.load(jobs=30, workers=1, slots=4, faults=1, fault_every=1.0, drain_timeout=30)
    figures, fleet = run_under_faults(
        fault_dsn,
        f"database down {_outage_seconds(load):.0f} s (> lease), 1 worker",
        load,
        outage(fault_dsn, load, cluster, _outage_seconds(load)),
    )
    stranded = fetch(
        fault_dsn,
        "SELECT id, leased_by, leased_until < now(), status, scheduled_at - now(), attempt, "
        "last_attempt_error->>'type' FROM pgwork.jobs "
        "WHERE status NOT IN ('completed', 'failed')",
    )
    figures.notes["stranded"] = [tuple(map(str, row)) for row in stranded]
    report(figures)
    assert not fleet.unexpected_exits()
    check_outage(figures, load)
