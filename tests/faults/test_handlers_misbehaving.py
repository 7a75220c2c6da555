"""Handlers that hang, block the event loop, or always raise."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.faults._db import fetch, scalar
from tests.faults._fleet import start_worker
from tests.faults._jobs import BOOM_RETRY, Spec
from tests.faults._load import enqueue
from tests.faults._oracle import Figures, measure, wait_settled
from tests.faults._worker import BROKEN_ENV

from pgwork import backoff_delay

pytestmark = pytest.mark.timeout(90)

LEASE = 1.0
POLL = 0.2


def _job(dsn: str, job_id: object) -> tuple[str, int, str | None, str | None]:
    (row,) = fetch(
        dsn,
        "SELECT status::text, attempt, last_attempt_error->>'type', output #>> '{}'"
        " FROM pgwork.jobs WHERE id = %s",
        job_id,
    )
    return row  # type: ignore[return-value]


def _ledger_times(dsn: str, job_id: object) -> list[float]:
    rows = fetch(
        dsn,
        "SELECT extract(epoch FROM at)::float8 FROM faults_ledger WHERE job_id = %s ORDER BY id",
        job_id,
    )
    return [r[0] for r in rows]


def test_hanging_handler_times_out_and_fails_at_max_attempts(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    hanging_handler(fault_dsn, report)


def test_build_that_never_times_out_handlers_fails_the_hanging_handler_oracle(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    with pytest.raises(AssertionError):
        hanging_handler(fault_dsn, report, broken="no-timeout")
    # Its one attempt ran until the worker stopped: never timed out, never retried.
    assert scalar(fault_dsn, "SELECT count(*) FROM faults_ledger") == 1


def hanging_handler(dsn: str, report: Callable[[Figures], Figures], broken: str = "") -> None:
    worker = start_worker(
        dsn, "w", types="hang", slots=2, lease=LEASE, poll=POLL, env={BROKEN_ENV: broken}
    )
    started = time.monotonic()
    try:
        (job,) = enqueue(dsn, [("hang", Spec())])
        # Two attempts of the 1 s timeout and a retry take about 2 s.
        assert wait_settled(dsn, 10)
        cancelled = worker.matching(rf"^aborted {job} ")
    finally:
        worker.close()
    figures = measure(dsn, Figures("handler hangs (timeout 1 s)"))
    figures.elapsed_s = time.monotonic() - started
    report(figures)
    assert _job(dsn, job)[:3] == ("failed", 2, "builtins.TimeoutError")
    assert figures.executions == 2
    assert len(cancelled) == 2


def test_handler_blocking_the_event_loop_loses_its_job_to_another_worker(
    fault_dsn: str, report: Callable[[Figures], Figures], tmp_path: Path
) -> None:
    blocking_handler(fault_dsn, report, tmp_path / "unblock")


def test_build_that_never_reaps_fails_the_blocking_handler_oracle(
    fault_dsn: str, report: Callable[[Figures], Figures], tmp_path: Path
) -> None:
    with pytest.raises(AssertionError):
        blocking_handler(fault_dsn, report, tmp_path / "unblock", broken="no-reap")
    assert fetch(fault_dsn, "SELECT output #>> '{}', attempt FROM pgwork.jobs") == [("blocker", 1)]


def blocking_handler(
    dsn: str, report: Callable[[Figures], Figures], unblock: Path, broken: str = ""
) -> None:
    """The first attempt blocks its worker's event loop (``time.sleep``) until another
    worker has taken the job over, however long that takes (a minute at the most), so
    the lease expires and is reaped whatever the machine's load."""
    options = {
        "types": "block",
        "slots": 2,
        "lease": LEASE,
        "poll": POLL,
        "env": {BROKEN_ENV: broken},
    }
    blocker = start_worker(dsn, "blocker", **options)
    other = None
    started = time.monotonic()
    try:
        spec = Spec(first_ms=60_000, until=str(unblock))
        (job,) = enqueue(dsn, [("block", spec)])
        blocker.wait_for(rf"^started {job} 1$")
        other = start_worker(dsn, "other", **options)
        try:
            other.wait_for(rf"^started {job} 2$", timeout=30)
        finally:
            unblock.touch()
            settled = wait_settled(dsn, 20)
        assert settled
        # When the loop unblocks, the first attempt's completion is refused.
        blocker.wait_for(rf'^event lease\.lost .*"{job}".*"action": "completion"', timeout=10)
    finally:
        blocker.close()
        if other is not None:
            other.close()
    figures = measure(dsn, Figures("handler blocks the event loop until another worker runs it"))
    figures.elapsed_s = time.monotonic() - started
    report(figures)
    status, attempt, _, output = _job(dsn, job)
    assert (status, attempt, output) == ("completed", 2, "other")
    assert figures.executions == 2
    assert figures.lost == 0


def test_handler_that_always_raises_fails_at_max_attempts_on_the_backoff_schedule(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    raising_handler(fault_dsn, report)


def test_build_whose_attempts_never_count_fails_the_raising_handler_oracle(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    with pytest.raises(AssertionError):
        raising_handler(fault_dsn, report, broken="never-counting")
    assert scalar(fault_dsn, "SELECT count(*) FROM faults_ledger") > 3


def raising_handler(dsn: str, report: Callable[[Figures], Figures], broken: str = "") -> None:
    worker = start_worker(
        dsn, "w", types="boom", slots=2, lease=LEASE, poll=POLL, env={BROKEN_ENV: broken}
    )
    started = time.monotonic()
    try:
        (job,) = enqueue(dsn, [("boom", Spec())])
        # Three attempts 0.3 s and 0.6 s apart.
        assert wait_settled(dsn, 10)
    finally:
        worker.close()
    figures = measure(dsn, Figures("handler always raises (max_attempts 3)"))
    figures.elapsed_s = time.monotonic() - started
    times = _ledger_times(dsn, job)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    expected = [backoff_delay(n, BOOM_RETRY).total_seconds() for n in (1, 2)]
    figures.notes = {"gaps_s": [round(g, 3) for g in gaps], "backoff_s": expected}
    report(figures)
    assert _job(dsn, job)[:3] == ("failed", 3, "builtins.RuntimeError")
    assert "boom on attempt 3" in scalar(
        dsn, "SELECT last_attempt_error->>'message' FROM pgwork.jobs WHERE id = %s", job
    )
    assert len(times) == 3
    for gap, delay in zip(gaps, expected, strict=True):
        # Never early; late by at most a poll interval and some scheduling slack.
        assert delay <= gap <= delay + POLL + 0.5, (gaps, expected)
