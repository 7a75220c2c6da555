"""A job that kills its own worker process on every attempt: a supervisor restarts the
worker each time, the lease expires, the job is reaped, and at max attempts it ends
failed instead of taking workers down forever."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from tests.faults._db import fetch
from tests.faults._fleet import Fleet, Options
from tests.faults._jobs import Spec
from tests.faults._load import enqueue
from tests.faults._oracle import Figures, measure, wait_settled

pytestmark = pytest.mark.timeout(120)


def test_job_killing_its_worker_fails_at_max_attempts(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    started = time.monotonic()
    (job,) = enqueue(fault_dsn, [("suicide", Spec())])
    with Fleet(fault_dsn, 1, Options(types="suicide", slots=1, lease=1.0, poll=0.2)) as fleet:
        assert wait_settled(fault_dsn, 60)
        restarts = fleet.restarts
    figures = measure(fault_dsn, Figures("job kills its own worker (max_attempts 3)"))
    figures.elapsed_s = time.monotonic() - started
    figures.faults = restarts
    figures.notes = {"worker_restarts": restarts}
    report(figures)
    ((status, attempt, error),) = fetch(
        fault_dsn,
        "SELECT status::text, attempt, last_attempt_error->>'type' FROM pgwork.jobs WHERE id = %s",
        job,
    )
    assert (status, attempt, error) == ("failed", 3, "LeaseExpired")
    assert figures.executions == 3
    assert restarts >= 3
