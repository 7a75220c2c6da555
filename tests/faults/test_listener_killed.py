"""Only the LISTEN connection is killed: the worker reconnects within about a second,
and a job enqueued right after wakes it by notification (its poll interval is far
longer than the wait the test allows). The control runs a build whose listener never
hears a ``ready`` notice: it must then miss every pickup window, which shows that the
notification, not a poll or a spin, is what woke the correct build."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from tests.faults._db import fetch
from tests.faults._fleet import WORKER_APP, start_worker
from tests.faults._jobs import Spec
from tests.faults._load import enqueue
from tests.faults._oracle import Figures, measure
from tests.faults._worker import BROKEN_ENV
from tests.faults.conftest import Tier

pytestmark = pytest.mark.timeout(120)

POLL = 30.0  # never the reason a job is picked up within the test's waits


def _listen_backends(dsn: str) -> list[int]:
    rows = fetch(
        dsn,
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND query LIKE 'LISTEN%%'",
        WORKER_APP,
    )
    return [r[0] for r in rows]


@pytest.mark.parametrize("build", ["", "no-notify"])
def test_killed_listen_connection_comes_back_and_delivers(
    fault_dsn: str, tier: Tier, report: Callable[[Figures], Figures], build: str
) -> None:
    if build:
        _control_misses_the_pickup(fault_dsn, build)
        return
    rounds = 3 if tier.name == "quick" else 10
    worker = start_worker(fault_dsn, "listener", types="work", slots=2, poll=POLL)
    reconnects: list[float] = []
    pickups: list[float] = []
    try:
        for n in range(rounds):
            (backend,) = _listen_backends(fault_dsn)
            since = len(worker.lines)
            killed_at = time.monotonic()
            fetch(fault_dsn, "SELECT pg_terminate_backend(%s)", backend)
            _, line = worker.wait_for(r"^event listener\.reconnected ", since=since, timeout=5)
            reconnects.append(line.at - killed_at)
            assert _listen_backends(fault_dsn) != [backend]
            enqueued_at = time.monotonic()
            (job,) = enqueue(fault_dsn, [("work", Spec(n=n))])
            _, started = worker.wait_for(rf"^started {job} 1$", since=since, timeout=5)
            pickups.append(started.at - enqueued_at)
    finally:
        worker.close()
    figures = measure(fault_dsn, Figures("kill only the LISTEN connection"))
    figures.faults = rounds
    figures.recovery_s = reconnects
    figures.notes = {
        "reconnect_s": [round(r, 3) for r in reconnects],
        "pickup_after_enqueue_s": [round(p, 3) for p in pickups],
        "poll_interval_s": POLL,
    }
    report(figures)
    assert figures.lost == 0
    assert max(reconnects) < 1.5
    assert max(pickups) < PICKUP_S


PICKUP_S = 2.0


def _control_misses_the_pickup(dsn: str, build: str) -> None:
    worker = start_worker(dsn, "deaf", types="work", slots=2, poll=POLL, env={BROKEN_ENV: build})
    try:
        (backend,) = _listen_backends(dsn)
        since = len(worker.lines)
        fetch(dsn, "SELECT pg_terminate_backend(%s)", backend)
        worker.wait_for(r"^event listener\.reconnected ", since=since, timeout=5)
        (job,) = enqueue(dsn, [("work", Spec(n=0))])
        with pytest.raises(AssertionError, match="no line matching"):
            worker.wait_for(rf"^started {job} 1$", since=since, timeout=PICKUP_S)
    finally:
        worker.close()
