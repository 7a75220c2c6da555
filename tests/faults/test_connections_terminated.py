"""pg_terminate_backend on every worker connection, every few seconds, under load:
workers keep running, nothing is lost, no atomic effect is doubled."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.faults._fleet import Fleet
from tests.faults._inject import recovery_bound, terminate_backends
from tests.faults._load import Load, run_under_faults
from tests.faults._oracle import Figures
from tests.faults.conftest import Tier

pytestmark = pytest.mark.timeout(240)


def test_terminated_connections_lose_no_job(
    fault_dsn: str, tier: Tier, report: Callable[[Figures], Figures]
) -> None:
    load = tier.load()
    figures, fleet = run_under_faults(
        fault_dsn,
        "pg_terminate_backend on all worker connections",
        load,
        terminate_backends(fault_dsn, load),
    )
    report(figures)
    check_terminated(figures, fleet, load)


def check_terminated(figures: Figures, fleet: Fleet, load: Load) -> None:
    """The scenario's oracle (also run against broken builds, which must fail it)."""
    assert figures.faults >= 1
    assert figures.notes["backends_terminated"] > 0
    assert figures.lost == 0
    assert figures.completed == figures.jobs
    assert figures.duplicate_effects == 0
    assert figures.duplicate_executions <= figures.in_flight_at_faults, (
        figures.unexplained_duplicates
    )
    assert figures.recovery_max_s is not None
    assert figures.recovery_max_s <= recovery_bound(load), figures.recovery_s
    assert not fleet.unexpected_exits()
    assert fleet.restarts == 0
