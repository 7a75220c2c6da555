"""The recovery scenarios' oracles fail against a build whose worker never recovers.

Each test runs a scenario's fault (restart, outage, terminated connections, hang,
stall) at a small size against the ``no-reconnect`` build, whose state adapter, once
one statement failed for its connection, fails every later one, and asserts that the
scenario's own oracle (its ``check_*`` function) rejects the run. A hang or a stall
shorter than the adapter's default ``operation_timeout`` fails no statement, so those
two give the workers an ``operation_timeout`` of one second: the statements caught in
the fault time out, and the broken worker never takes work again."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
from tests.faults._cluster import PrivateCluster
from tests.faults._inject import (
    hang_server,
    outage,
    recovery_bound,
    restart_server,
    stall_path,
    terminate_backends,
)
from tests.faults._load import Load, run_under_faults, saturating_jobs
from tests.faults._oracle import Figures
from tests.faults._proxy import Proxy, via
from tests.faults._worker import BROKEN_ENV
from tests.faults.test_connections_terminated import check_terminated
from tests.faults.test_network_stall import check_stall
from tests.faults.test_server_hang import check_hang
from tests.faults.test_server_outage import check_outage
from tests.faults.test_server_restart import check_restart

pytestmark = pytest.mark.timeout(120)

BROKEN = {BROKEN_ENV: "no-reconnect"}
CONTROL = Load(
    jobs=200, workers=2, slots=6, lease=1.0, poll=0.2, faults=1, fault_every=1.0, drain_timeout=5
)
# Short statement bounds, so that a hang or stall of a few seconds fails statements.
BOUNDED = replace(CONTROL, operation_timeout=1.0)
# Just past the bound: a broken build need not be waited for any longer.
PROBE = recovery_bound(CONTROL) + 0.5
FAULT_S = 3 * CONTROL.lease


def test_build_that_never_reconnects_fails_the_restart_oracle(
    fault_dsn: str, cluster: PrivateCluster, report: Callable[[Figures], Figures]
) -> None:
    figures, fleet = run_under_faults(
        fault_dsn,
        "PostgreSQL restart -m fast, broken build: no-reconnect",
        CONTROL,
        restart_server(fault_dsn, CONTROL, cluster, "fast", probe_timeout=PROBE),
        env=BROKEN,
    )
    report(figures)
    assert figures.faults == 1
    with pytest.raises(AssertionError):
        check_restart(figures, fleet, CONTROL)
    assert figures.lost > 0


def test_build_that_never_reconnects_fails_the_outage_oracle(
    fault_dsn: str, cluster: PrivateCluster, report: Callable[[Figures], Figures]
) -> None:
    figures, _ = run_under_faults(
        fault_dsn,
        f"database down {FAULT_S:.0f} s, broken build: no-reconnect",
        CONTROL,
        outage(fault_dsn, CONTROL, cluster, FAULT_S, probe_timeout=0.5),
        env=BROKEN,
    )
    report(figures)
    assert figures.faults == 1
    with pytest.raises(AssertionError):
        check_outage(figures, CONTROL)
    assert figures.lost > 0


def test_build_that_never_reconnects_fails_the_terminated_connections_oracle(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    figures, fleet = run_under_faults(
        fault_dsn,
        "pg_terminate_backend on all worker connections, broken build: no-reconnect",
        CONTROL,
        terminate_backends(fault_dsn, CONTROL, probe_timeout=PROBE),
        env=BROKEN,
    )
    report(figures)
    assert figures.faults == 1
    with pytest.raises(AssertionError):
        check_terminated(figures, fleet, CONTROL)
    assert figures.lost > 0


def test_build_that_never_reconnects_fails_the_hang_oracle(
    fault_dsn: str, cluster: PrivateCluster, report: Callable[[Figures], Figures]
) -> None:
    thawed: list[float] = []
    figures, fleet = run_under_faults(
        fault_dsn,
        f"database hangs {FAULT_S:.0f} s, operation_timeout 1 s, broken build: no-reconnect",
        BOUNDED,
        hang_server(fault_dsn, BOUNDED, cluster, FAULT_S, thawed=thawed, probe_timeout=PROBE),
        env=BROKEN,
        then=saturating_jobs(BOUNDED),
    )
    figures.notes["started_after_last_thaw"] = fleet.started_since(max(thawed))
    report(figures)
    assert figures.faults == 1
    with pytest.raises(AssertionError):
        check_hang(figures, fleet, BOUNDED)
    assert figures.lost > 0


@pytest.fixture
def proxies(cluster: PrivateCluster) -> Iterator[list[Proxy]]:
    started = [Proxy(cluster.port).start() for _ in range(BOUNDED.workers)]
    try:
        yield started
    finally:
        for proxy in started:
            proxy.close()


def test_build_that_never_reconnects_fails_the_stall_oracle(
    fault_dsn: str, proxies: list[Proxy], report: Callable[[Figures], Figures]
) -> None:
    """Only the stalled worker breaks: the other completes what it can, and the
    stalled one never takes a job of those enqueued after the stall."""
    resumed: list[tuple[str, float]] = []
    figures, fleet = run_under_faults(
        fault_dsn,
        f"one worker's path stalls {FAULT_S:.0f} s, operation_timeout 1 s, "
        "broken build: no-reconnect",
        BOUNDED,
        stall_path(fault_dsn, BOUNDED, proxies, FAULT_S, resumed=resumed, probe_timeout=PROBE),
        env=BROKEN,
        route=lambda index: via(fault_dsn, proxies[index].port),
        then=saturating_jobs(BOUNDED),
    )
    victim, resumed_at = resumed[-1]
    figures.notes["started_after_last_resume"] = after = fleet.started_since(resumed_at)
    report(figures)
    assert figures.faults == 1
    with pytest.raises(AssertionError):
        check_stall(figures, fleet, BOUNDED, victim)
    assert after[victim] == 0, after
