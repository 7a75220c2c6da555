"""The database hangs: every process of the private cluster is SIGSTOPped for longer
than the lease, sockets open, nothing refused or reset, then SIGCONTed. The workers
wait it out without exiting or restarting, nothing is lost, no atomic effect is
doubled, and what they held moves on soon after the thaw; at the tier's sizing and at
the library's default sizing."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.faults._cluster import PrivateCluster
from tests.faults._fleet import Fleet
from tests.faults._inject import hang_server, recovery_bound
from tests.faults._load import Load, run_under_faults, saturating_jobs
from tests.faults._oracle import Figures
from tests.faults.conftest import SIZINGS, Tier

pytestmark = pytest.mark.timeout(240)


def _hang_seconds(load: Load) -> float:
    return 3 * load.lease


@pytest.mark.parametrize("sizing", SIZINGS)
def test_hung_server_loses_no_job(
    fault_dsn: str,
    cluster: PrivateCluster,
    tier: Tier,
    sizing: str,
    report: Callable[[Figures], Figures],
) -> None:
    load = tier.load(
        faults=1 if tier.name == "quick" else 3,
        defaults=sizing == "defaults",
    )
    thawed: list[float] = []
    figures, fleet = run_under_faults(
        fault_dsn,
        f"database hangs {_hang_seconds(load):.0f} s (SIGSTOP, > lease) ({sizing} sizing)",
        load,
        hang_server(fault_dsn, load, cluster, _hang_seconds(load), thawed=thawed),
        then=saturating_jobs(load),
    )
    figures.notes["started_after_last_thaw"] = fleet.started_since(max(thawed))
    report(figures)
    check_hang(figures, fleet, load)


def check_hang(figures: Figures, fleet: Fleet, load: Load) -> None:
    """The scenario's oracle (also run against broken builds, which must fail it)."""
    after = figures.notes["started_after_last_thaw"]
    assert figures.faults >= 1
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
    # Every worker took up work again (not only some, the rest stuck for ever): the
    # jobs enqueued after the thaw are more than all workers but one can hold at once.
    assert all(after.values()), after
