"""A network path that is slow, then stalls without a reset: every worker reaches the
server through a TCP proxy of its own that adds latency to every chunk; one worker's
path at a time stops forwarding (sockets open, nothing refused) for longer than the
lease, then resumes. The others take its jobs back; when its path resumes, the stalled
worker carries on without a restart and nothing it writes late counts.

All of a worker's connections go through its proxy: the state pool, the LISTEN
connection and the handlers' ledger pool."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator

import pytest
from tests.faults._cluster import PrivateCluster
from tests.faults._fleet import Fleet, start_worker
from tests.faults._inject import recovery_bound, stall_path
from tests.faults._jobs import Spec
from tests.faults._load import Load, enqueue, run_under_faults, saturating_jobs
from tests.faults._oracle import Figures
from tests.faults._proxy import Proxy, via
from tests.faults.conftest import Tier

pytestmark = pytest.mark.timeout(240)

# Each way, per chunk: a round trip costs 2 x LATENCY more than on loopback.
LATENCY = 0.005


def _stall_seconds(load: Load) -> float:
    return 3 * load.lease


@pytest.fixture
def proxies(cluster: PrivateCluster, tier: Tier) -> Iterator[list[Proxy]]:
    started = [Proxy(cluster.port, latency=LATENCY).start() for _ in range(tier.workers)]
    try:
        yield started
    finally:
        for proxy in started:
            proxy.close()


def test_stalled_network_path_loses_no_job(
    fault_dsn: str, tier: Tier, proxies: list[Proxy], report: Callable[[Figures], Figures]
) -> None:
    load = tier.load(faults=1 if tier.name == "quick" else 6)
    resumed: list[tuple[str, float]] = []
    figures, fleet = run_under_faults(
        fault_dsn,
        f"one worker's network path stalls {_stall_seconds(load):.0f} s (> lease), "
        f"+{LATENCY * 1000:.0f} ms each way",
        load,
        stall_path(fault_dsn, load, proxies, _stall_seconds(load), resumed=resumed),
        route=lambda index: via(fault_dsn, proxies[index].port),
        then=saturating_jobs(load),
    )
    figures.notes["proxied_connections"] = sum(p.connections for p in proxies)
    # What the last stalled worker started once its path resumed, and the others.
    victim, resumed_at = resumed[-1]
    figures.notes["started_after_last_resume"] = fleet.started_since(resumed_at)
    report(figures)
    check_stall(figures, fleet, load, victim)


def check_stall(figures: Figures, fleet: Fleet, load: Load, victim: str) -> None:
    """The scenario's oracle (also run against broken builds, which must fail it)."""
    after = figures.notes["started_after_last_resume"]
    assert figures.faults >= 1
    assert figures.lost == 0
    assert figures.completed == figures.jobs
    assert figures.duplicate_effects == 0
    assert figures.duplicate_executions <= figures.in_flight_at_faults, (
        figures.unexplained_duplicates
    )
    # The stalled worker's leases are read before and just after its path stalls: it
    # can change nothing in between, so every extra run is a job the stall found held.
    assert figures.unexplained_duplicates == [], figures.notes
    assert figures.recovery_max_s is not None
    assert figures.recovery_max_s <= _stall_seconds(load) + recovery_bound(load), figures.recovery_s
    assert not fleet.unexpected_exits()
    assert fleet.restarts == 0
    # The stalled worker took up work again: the jobs enqueued after the last stall are
    # more than the others can hold at once.
    assert after[victim] > 0, after


SOLO_LEASE = 1.0
SOLO_POLL = 0.2
SOLO_STALL = 5 * SOLO_LEASE


def test_stalled_worker_aborts_a_handler_whose_lease_ran_out(
    fault_dsn: str, cluster: PrivateCluster
) -> None:
    """pgwork's promise (worker/_side/lease.py): when renewals fail past the moment the lease
    would expire, the attempt is aborted, because another worker may own the job by
    then. A renewal refused at once (server down) keeps it; a renewal that never
    answers must keep it too: the worker's handler should stop within its lease (plus
    a renewal tick and slack), while its path is still stalled, not when it resumes."""
    options = {"types": "work", "slots": 2, "lease": SOLO_LEASE, "poll": SOLO_POLL}
    proxy = Proxy(cluster.port).start()
    # The rescuer (direct) is kept stopped until the job is the stalled worker's.
    rescuer = start_worker(fault_dsn, "rescuer", **options)
    rescuer.send(signal.SIGSTOP)
    stalled = start_worker(via(fault_dsn, proxy.port), "stalled", **options)
    try:
        (job,) = enqueue(fault_dsn, [("work", Spec(first_ms=60_000, ms=10, slow_on="stalled"))])
        stalled.wait_for(rf"^started {job} 1$")
        since = len(stalled.lines)
        proxy.stall()
        stalled_at = time.monotonic()
        rescuer.send(signal.SIGCONT)
        try:
            rescuer.wait_for(rf"^started {job} 2$", timeout=10)
            deadline = SOLO_LEASE + SOLO_LEASE / 3 + 1.5
            left = max(0.1, stalled_at + deadline - time.monotonic())
            try:
                _, aborted = stalled.wait_for(rf"^aborted {job} ", since=since, timeout=left)
            except AssertionError:
                aborted = None
        finally:
            time.sleep(max(0.0, stalled_at + SOLO_STALL - time.monotonic()))
            proxy.resume()
        # Once the path resumes the refused renewal aborts it in any case.
        stalled.wait_for(rf"^aborted {job} ", since=since, timeout=10)
    finally:
        stalled.close()
        rescuer.close()
        proxy.close()
    assert aborted is not None, "the handler ran on past its lease while the path stalled"
    assert aborted.at - stalled_at <= deadline
