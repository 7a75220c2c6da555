"""A worker SIGSTOPped past its lease loses its jobs to another worker; when it
resumes, its handlers are cancelled and nothing it writes counts."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest
from tests.faults._db import fetch, scalar
from tests.faults._fleet import start_worker
from tests.faults._jobs import Spec
from tests.faults._load import enqueue
from tests.faults._oracle import Figures, RecoveryProbe, held_leases, measure, wait_settled

pytestmark = pytest.mark.timeout(90)

LEASE = 1.0
POLL = 0.2
# A paused worker's atomic transaction stays open until PostgreSQL ends it (the job
# type's timeout, 3 leases, plus the adapter's 5 s of slack); its job's row is not
# locked, so the job is reaped once its lease expires. This bound is a loose upper one.
ATOMIC_HOLD = 3 * LEASE + 5


def test_paused_worker_is_cancelled_and_its_late_writes_refused(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    options = {"types": "work,effect", "slots": 2, "lease": LEASE, "poll": POLL}
    # The rescuer starts first and is kept stopped, so it takes nothing before the
    # victim pauses and its start-up time is not counted as recovery.
    rescuer = start_worker(fault_dsn, "rescuer", **options)
    rescuer.send(signal.SIGSTOP)
    victim = start_worker(fault_dsn, "paused", **options)
    try:
        staged, atomic = enqueue(
            fault_dsn,
            [("work", Spec(first_ms=60_000, ms=10)), ("effect", Spec(first_ms=1500, ms=10))],
        )
        victim.wait_for(rf"^started {staged} 1$")
        victim.wait_for(rf"^started {atomic} 1$")
        victim.send(signal.SIGSTOP)
        rescuer.send(signal.SIGCONT)
        stopped_at = time.monotonic()
        held = dict(held_leases(fault_dsn, worker="paused"))
        staged_s = RecoveryProbe(fault_dsn, [(staged, held[staged])], stopped_at).wait(20)
        atomic_s = RecoveryProbe(fault_dsn, [(atomic, held[atomic])], stopped_at).wait(30)
        assert wait_settled(fault_dsn, 20)
        since = len(victim.lines)
        victim.send(signal.SIGCONT)
        # The renewal is refused: the staged handler is cancelled mid-sleep.
        victim.wait_for(rf"^aborted {staged} (ownership_lost|completed_elsewhere)$", since=since)
        # The atomic attempt's renewal is refused too (the job was reaped), or its
        # transaction was ended by the server: its handler is aborted, times out or
        # has its completion refused; either way nothing of it commits.
        victim.wait_for(rf"^(aborted {atomic} |event (attempt\.\w+|lease\.lost) .*{atomic})")
    finally:
        victim.close()
        rescuer.close()
    figures = Figures("SIGSTOP a worker past its lease, then SIGCONT")
    # The pause found both jobs held (read while the worker was stopped): each may run
    # once more, and no other job at all.
    figures.faults, figures.in_flight_at_faults = 1, 2
    figures.held_jobs.update(list(held))
    figures = measure(fault_dsn, figures)
    figures.recovery_s = [s if s is not None else float("inf") for s in (staged_s, atomic_s)]
    figures.notes = {"staged_recovery_s": staged_s, "atomic_recovery_s": atomic_s}
    report(figures)
    rows = fetch(fault_dsn, "SELECT id, status::text, output #>> '{}', attempt FROM pgwork.jobs")
    assert sorted(r[1:] for r in rows) == [("completed", "rescuer", 2)] * 2
    assert figures.lost == 0
    assert figures.duplicate_effects == 0
    assert scalar(fault_dsn, "SELECT worker FROM faults_effects WHERE job_id = %s", atomic) == (
        "rescuer"
    )
    assert figures.duplicate_executions == 2
    assert figures.unexplained_duplicates == []
    assert staged_s is not None
    assert staged_s <= LEASE + POLL + 1.0
    assert atomic_s is not None
    assert atomic_s <= ATOMIC_HOLD + LEASE + POLL + 1.0
