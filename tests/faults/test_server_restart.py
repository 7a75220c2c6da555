"""PostgreSQL restarted (fast and immediate mode) under load: the workers ride it out,
nothing is lost, no atomic effect is doubled; at the tier's sizing and at the library's
default sizing."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.faults._cluster import PrivateCluster
from tests.faults._fleet import Fleet
from tests.faults._inject import Mode, recovery_bound, restart_server
from tests.faults._load import Load, run_under_faults
from tests.faults._oracle import Figures
from tests.faults.conftest import SIZINGS, Tier

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("sizing", SIZINGS)
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_server_restart_loses_no_job(
    fault_dsn: str,
    cluster: PrivateCluster,
    tier: Tier,
    mode: Mode,
    sizing: str,
    report: Callable[[Figures], Figures],
) -> None:
    load = tier.load(
        faults=1 if tier.name == "quick" else tier.faults // 2, defaults=sizing == "defaults"
    )
    figures, fleet = run_under_faults(
        fault_dsn,
        f"PostgreSQL restart -m {mode} ({sizing} sizing)",
        load,
        restart_server(fault_dsn, load, cluster, mode),
    )
    report(figures)
    check_restart(figures, fleet, load)


def check_restart(figures: Figures, fleet: Fleet, load: Load) -> None:
    """The scenario's oracle (also run against broken builds, which must fail it)."""
    assert figures.faults >= 1
    assert figures.lost == 0
    assert figures.completed == figures.jobs
    assert figures.duplicate_effects == 0
    assert figures.duplicate_executions <= figures.in_flight_at_faults, (
        figures.unexplained_duplicates
    )
    assert figures.recovery_max_s is not None
    assert figures.recovery_max_s <= recovery_bound(load) + max(figures.notes["restart_s"])
    assert not fleet.unexpected_exits()
    assert fleet.restarts == 0
