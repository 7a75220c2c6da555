"""SIGTERM with jobs in flight: the driver's handler calls ``worker.stop()`` with a
short grace period; in-flight jobs are released at once, no attempt burned, and
another worker then runs them. The control runs a build whose hand-back does nothing:
its jobs are then still leased, with the attempt counted, when the worker has exited."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest
from tests.faults._db import fetch
from tests.faults._fleet import start_worker
from tests.faults._jobs import Spec
from tests.faults._load import enqueue
from tests.faults._oracle import Figures, measure, wait_settled
from tests.faults._worker import BROKEN_ENV

pytestmark = pytest.mark.timeout(60)

GRACE = 0.2


@pytest.mark.parametrize("build", ["", "no-release"])
def test_sigterm_releases_in_flight_jobs_without_burning_attempts(
    fault_dsn: str, report: Callable[[Figures], Figures], build: str
) -> None:
    worker = start_worker(
        fault_dsn, "w", types="work", slots=4, lease=2.0, grace=GRACE, env={BROKEN_ENV: build}
    )
    try:
        jobs = enqueue(
            fault_dsn, [("work", Spec(n=n, first_ms=60_000, slow_on="w")) for n in range(4)]
        )
        for job in jobs:
            worker.wait_for(rf"^started {job} 1$")
        signalled = time.monotonic()
        worker.send(signal.SIGTERM)
        worker.wait_for(r"^stopped$", timeout=10)
        worker.proc.wait(10)
        exited_s = time.monotonic() - signalled
        aborted = worker.matching(r"^aborted .* worker_stopping$")
    finally:
        worker.close()
    rows = fetch(
        fault_dsn,
        "SELECT status::text, attempt, leased_by, scheduled_at <= now() FROM pgwork.jobs",
    )
    if build:
        assert rows == [("running", 1, "w", True)] * len(jobs)
        return
    successor = start_worker(fault_dsn, "w2", types="work", slots=4)
    try:
        assert wait_settled(fault_dsn, 20)
    finally:
        successor.close()
    figures = measure(fault_dsn, Figures("SIGTERM with jobs in flight"))
    figures.faults, figures.in_flight_at_faults = 1, len(jobs)
    figures.recovery_s = [exited_s]
    figures.notes = {"exit_after_sigterm_s": round(exited_s, 3), "grace_s": GRACE}
    report(figures)
    assert worker.proc.returncode == 0
    assert len(aborted) == len(jobs)
    assert rows == [("pending", 0, None, True)] * len(jobs)
    assert exited_s < GRACE + 2.0
    assert figures.lost == 0
    assert fetch(fault_dsn, "SELECT DISTINCT status::text, attempt FROM pgwork.jobs") == [
        ("completed", 1)
    ]
