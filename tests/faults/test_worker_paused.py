"""A worker SIGSTOPped past its lease loses its jobs to another worker; when it
resumes, its handlers are cancelled and nothing it writes counts."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from tests.faults._db import fetch, scalar
from tests.faults._fleet import start_worker
from tests.faults._jobs import Spec
from tests.faults._load import enqueue
from tests.faults._oracle import Figures, RecoveryProbe, held_leases, measure, wait_settled
from tests.faults._worker import BROKEN_ENV

pytestmark = pytest.mark.timeout(90)

LEASE = 1.0
POLL = 0.2
# A paused worker's atomic transaction stays open until PostgreSQL ends it, but it
# holds no lock on its job's row: the job is reaped once its lease expires, as a
# staged one is.
STAGED_BOUND = LEASE + POLL + 1.0
ATOMIC_BOUND = STAGED_BOUND


@dataclass
class Paused:
    staged: Any
    atomic: Any
    held: dict[Any, Any]
    staged_s: float | None
    atomic_s: float | None
    settled: bool
    # The paused worker's lines once resumed: its staged handler's abort, and how its
    # atomic attempt ended (each None if not seen).
    staged_aborted: str | None
    atomic_ended: str | None


def run_paused(dsn: str, *, rescuer_broken: str = "") -> Paused:
    """The victim runs a staged and an atomic job and is SIGSTOPped; the rescuer
    (running ``rescuer_broken``'s build) is left to take them back; once they are
    settled, the victim is resumed."""
    options = {"types": "work,effect", "slots": 2, "lease": LEASE, "poll": POLL}
    # The rescuer starts first and is kept stopped, so it takes nothing before the
    # victim pauses and its start-up time is not counted as recovery.
    rescuer = start_worker(dsn, "rescuer", **options, env={BROKEN_ENV: rescuer_broken})
    rescuer.send(signal.SIGSTOP)
    victim = start_worker(dsn, "paused", **options)
    staged_aborted = atomic_ended = None
    try:
        staged, atomic = enqueue(
            dsn, [("work", Spec(first_ms=60_000, ms=10)), ("effect", Spec(first_ms=1500, ms=10))]
        )
        victim.wait_for(rf"^started {staged} 1$")
        victim.wait_for(rf"^started {atomic} 1$")
        victim.send(signal.SIGSTOP)
        rescuer.send(signal.SIGCONT)
        stopped_at = time.monotonic()
        held = dict(held_leases(dsn, worker="paused"))
        staged_s = RecoveryProbe(dsn, [(staged, held[staged])], stopped_at).wait(STAGED_BOUND)
        atomic_s = RecoveryProbe(dsn, [(atomic, held[atomic])], stopped_at).wait(ATOMIC_BOUND)
        settled = wait_settled(dsn, 10)
        if settled:
            since = len(victim.lines)
            victim.send(signal.SIGCONT)
            # The renewal is refused: the staged handler is cancelled mid-sleep.
            _, line = victim.wait_for(
                rf"^aborted {staged} (ownership_lost|completed_elsewhere)$", since=since
            )
            staged_aborted = line.text
            # The atomic attempt's renewal is refused too (the job was reaped), or its
            # transaction was ended by the server: its handler is aborted, times out
            # or has its completion refused; either way nothing of it commits.
            _, line = victim.wait_for(
                rf"^(aborted {atomic} |event (attempt\.\w+|lease\.lost) .*{atomic})"
            )
            atomic_ended = line.text
    finally:
        victim.close()
        rescuer.close()
    return Paused(staged, atomic, held, staged_s, atomic_s, settled, staged_aborted, atomic_ended)


def check_paused(dsn: str, paused: Paused, report: Callable[[Figures], Figures]) -> None:
    """The scenario's oracle (also run against a broken build, which must fail it)."""
    figures = Figures("SIGSTOP a worker past its lease, then SIGCONT")
    # The pause found both jobs held (read while the worker was stopped): each may run
    # once more, and no other job at all.
    figures.faults, figures.in_flight_at_faults = 1, 2
    figures.held_jobs.update(list(paused.held))
    figures = measure(dsn, figures)
    staged_s, atomic_s = paused.staged_s, paused.atomic_s
    figures.recovery_s = [s if s is not None else float("inf") for s in (staged_s, atomic_s)]
    figures.notes = {"staged_recovery_s": staged_s, "atomic_recovery_s": atomic_s}
    report(figures)
    assert paused.settled
    assert paused.staged_aborted is not None
    assert paused.atomic_ended is not None
    rows = fetch(dsn, "SELECT id, status::text, output #>> '{}', attempt FROM pgwork.jobs")
    assert sorted(r[1:] for r in rows) == [("completed", "rescuer", 2)] * 2
    assert figures.lost == 0
    assert figures.duplicate_effects == 0
    assert scalar(dsn, "SELECT worker FROM faults_effects WHERE job_id = %s", paused.atomic) == (
        "rescuer"
    )
    assert figures.duplicate_executions == 2
    assert figures.unexplained_duplicates == []
    assert staged_s is not None
    assert staged_s <= STAGED_BOUND
    assert atomic_s is not None
    assert atomic_s <= ATOMIC_BOUND


def test_paused_worker_is_cancelled_and_its_late_writes_refused(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    check_paused(fault_dsn, run_paused(fault_dsn), report)


def test_build_that_never_reaps_fails_the_paused_worker_oracle(
    fault_dsn: str, report: Callable[[Figures], Figures]
) -> None:
    """The control: a rescuer that never takes expired leases back leaves both jobs
    with the paused worker."""
    paused = run_paused(fault_dsn, rescuer_broken="no-reap")
    with pytest.raises(AssertionError):
        check_paused(fault_dsn, paused, report)
    assert (paused.staged_s, paused.settled) == (None, False)
