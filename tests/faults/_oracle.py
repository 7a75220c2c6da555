"""The oracles: what the database says happened to every job of a scenario.

* ``lost``: a job that did not end as expected (still pending/running after the drain
  deadline), or that is completed without any recorded execution, or an atomic job
  completed without its effect row.
* ``duplicate_executions``: ledger rows beyond the first, per job (written in
  autocommit at the start of every attempt, so they count runs, including runs whose
  outcome was later thrown away).
* ``duplicate_effects``: effect rows beyond the first, per job (written in the
  completing transaction of an atomic attempt, so they count *committed* runs).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg

__all__ = [
    "Figures",
    "RecoveryProbe",
    "held_leases",
    "measure",
    "summary_lines",
    "wait_settled",
    "writes_held",
]


@dataclass(slots=True)
class Figures:
    """One scenario's numbers, as reported in docs/reliability.md."""

    scenario: str
    jobs: int = 0
    completed: int = 0
    failed: int = 0
    lost: int = 0
    executions: int = 0
    duplicate_executions: int = 0
    duplicate_effects: int = 0
    faults: int = 0
    in_flight_at_faults: int = 0
    recovery_s: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)
    # Jobs that ran more often than faults found them held: (job, workers, attempts,
    # last error). Empty when every extra run is explained by a held lease.
    unexplained_duplicates: list[Any] = field(default_factory=list)
    # How many faults found each job's lease held: its allowance of extra runs.
    held_jobs: Counter[Any] = field(default_factory=Counter, repr=False)
    # The deliberately broken builds the scenario's workers ran (empty: the library as
    # shipped). Such a scenario is a control: its oracle must reject the run.
    broken: list[str] = field(default_factory=list)

    @property
    def recovery_max_s(self) -> float | None:
        return max(self.recovery_s) if self.recovery_s else None

    def as_json(self) -> str:
        data = asdict(self)
        del data["held_jobs"]
        if not self.unexplained_duplicates:
            del data["unexplained_duplicates"]
        data["recovery_max_s"] = self.recovery_max_s
        data["recovery_s"] = [round(r, 3) for r in self.recovery_s]
        return json.dumps(data)


_COUNTS = """
SELECT count(*),
       count(*) FILTER (WHERE status = 'completed'),
       count(*) FILTER (WHERE status = 'failed'),
       count(*) FILTER (WHERE status NOT IN ('completed', 'failed'))
FROM pgwork.jobs
"""

_EXECUTIONS = """
SELECT coalesce(sum(n), 0), coalesce(sum(n - 1), 0)
FROM (SELECT count(*) AS n FROM faults_ledger GROUP BY job_id) AS per_job
"""

_DUPLICATE_EFFECTS = """
SELECT coalesce(sum(n - 1), 0)
FROM (SELECT count(*) AS n FROM faults_effects GROUP BY job_id) AS per_job
"""

# Runs beyond the first, with who ran them and how the job's last attempt ended.
_DUPLICATED = """
SELECT l.job_id, array_agg(l.worker ORDER BY l.id), array_agg(l.attempt ORDER BY l.id),
       j.last_attempt_error->>'type'
FROM faults_ledger AS l JOIN pgwork.jobs AS j ON j.id = l.job_id
GROUP BY l.job_id, j.last_attempt_error
HAVING count(*) > 1
"""

# Completed without a trace of having run: the job "succeeded" but its work is lost.
_HOLLOW = """
SELECT count(*) FROM pgwork.jobs AS j
WHERE j.status = 'completed'
  AND (NOT EXISTS (SELECT 1 FROM faults_ledger AS l WHERE l.job_id = j.id)
       OR (j.type_name IN ('effect', 'sync_effect')
           AND NOT EXISTS (SELECT 1 FROM faults_effects AS e WHERE e.job_id = j.id)))
"""


def _one(conn: psycopg.Connection[Any], query: str) -> tuple[Any, ...]:
    row = conn.execute(query).fetchone()
    assert row is not None
    return tuple(row)


def measure(dsn: str, figures: Figures) -> Figures:
    """Fill ``figures`` from the database (expects every job to have reached an end)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        jobs, completed, failed, unfinished = _one(conn, _COUNTS)
        executions, duplicates = _one(conn, _EXECUTIONS)
        (duplicate_effects,) = _one(conn, _DUPLICATE_EFFECTS)
        (hollow,) = _one(conn, _HOLLOW)
        duplicated = conn.execute(_DUPLICATED).fetchall()
    figures.jobs, figures.completed, figures.failed = jobs, completed, failed
    figures.lost = unfinished + hollow
    figures.executions, figures.duplicate_executions = int(executions), int(duplicates)
    figures.duplicate_effects = int(duplicate_effects)
    # Evidence for the report when the in-flight bound is broken: which jobs ran more
    # often than faults found them held.
    unexplained = [
        (str(job), workers, attempts, error)
        for job, workers, attempts, error in duplicated
        if len(workers) - 1 > figures.held_jobs[job]
    ]
    if figures.faults:
        figures.unexplained_duplicates = unexplained
    return figures


def wait_settled(dsn: str, timeout: float) -> bool:
    """Wait until every job is final (completed, failed or cancelled); False if some
    still are not at ``timeout``."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            (left,) = _one(
                conn,
                "SELECT count(*) FROM pgwork.jobs"
                " WHERE status NOT IN ('completed', 'failed', 'cancelled')",
            )
            if left == 0:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)


def held_leases(dsn: str, *, worker: str | None = None) -> list[tuple[Any, Any]]:
    """(job id, lease token) of every running job, or of ``worker``'s only."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, lease_token FROM pgwork.jobs WHERE status = 'running'"
            " AND (%(w)s::text IS NULL OR leased_by = %(w)s)",
            {"w": worker},
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


@contextmanager
def writes_held(dsn: str) -> Iterator[list[tuple[Any, Any]]]:
    """``held_leases``, read in a transaction that then keeps every other write to the
    jobs table waiting (``LOCK TABLE ... IN EXCLUSIVE MODE``) until the block ends: no
    acquire can commit between the read and what the block does (freeze the server,
    say), so every job a worker holds when the block begins is in the read. When the
    lock is not granted at once (a caller's transaction holds rows), the plain read."""
    conn = psycopg.connect(dsn, autocommit=True)
    try:
        try:
            conn.execute("BEGIN")
            conn.execute("SET LOCAL lock_timeout = '500ms'")
            conn.execute("LOCK TABLE pgwork.jobs IN EXCLUSIVE MODE")
            rows = conn.execute(
                "SELECT id, lease_token FROM pgwork.jobs WHERE status = 'running'"
            ).fetchall()
            held = [(r[0], r[1]) for r in rows]
        except psycopg.errors.LockNotAvailable:
            conn.execute("ROLLBACK")
            held = held_leases(dsn)
        yield held
    finally:
        conn.close()


class RecoveryProbe:
    """How long until every lease held at a fault has moved on.

    A held lease moves on when its job completes, fails, is reaped or is re-acquired:
    in each case the (job, token) pair no longer matches a row. For a dead holder
    that is "runnable again": lease expiry plus the time to reap it.
    """

    _STILL_HELD = """
    SELECT count(*) FROM pgwork.jobs AS j
    JOIN unnest(%s::uuid[], %s::uuid[]) AS h(id, token) ON j.id = h.id
    WHERE j.lease_token = h.token
    """

    def __init__(self, dsn: str, held: list[tuple[Any, Any]], since: float) -> None:
        self.dsn = dsn
        self.held = held
        self.since = since

    def wait(self, timeout: float) -> float | None:
        """Seconds from ``since`` until all moved on; None if not within ``timeout``."""
        if not self.held:
            return 0.0
        ids = [h[0] for h in self.held]
        tokens = [h[1] for h in self.held]
        deadline = time.monotonic() + timeout
        conn: psycopg.Connection[Any] | None = None
        try:
            while time.monotonic() < deadline:
                try:
                    if conn is None or conn.closed:
                        conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2)
                    row = conn.execute(self._STILL_HELD, (ids, tokens)).fetchone()
                    if row is not None and row[0] == 0:
                        return time.monotonic() - self.since
                except psycopg.OperationalError:
                    if conn is not None:
                        conn.close()
                    conn = None
                time.sleep(0.05)
            return None
        finally:
            if conn is not None:
                conn.close()


CONTROL = "CONTROL"

_LEGEND = [
    f"Rows marked {CONTROL} ran a deliberately broken build (named in brackets):",
    "  a worker with one mechanism removed, run to show that the scenario's checks notice.",
    "  Their losses, duplicates and 'inf' recoveries are expected: their tests pass on them.",
    "Every other row is the library as shipped.",
    "Recovery 'inf': the leases held at a fault had not moved on when the probe gave up.",
]


def summary_lines(collected: list[Figures], tier: str) -> list[str]:
    """The end-of-run report: a legend, then one table row per scenario (columns as
    in docs/reliability.md), a control's scenario cell led by ``CONTROL (build)``, then
    the notes."""
    lines = [
        *_LEGEND,
        "",
        "| scenario | jobs | completed | failed | lost | executions | dup. executions "
        "| in flight at faults | dup. effects | faults | recovery max (s) | elapsed (s) |",
        "|" + " --- |" * 12,
    ]
    for f in collected:
        recovery = f"{f.recovery_max_s:.2f}" if f.recovery_max_s is not None else "-"
        lines.append(
            f"| {_scenario_cell(f)} | {f.jobs} | {f.completed} | {f.failed} | {f.lost} "
            f"| {f.executions} | {f.duplicate_executions} | {f.in_flight_at_faults} "
            f"| {f.duplicate_effects} | {f.faults} | {recovery} | {f.elapsed_s:.1f} |"
        )
    controls = sum(1 for f in collected if f.broken)
    lines.append(
        f"{len(collected)} scenario(s) at the {tier} tier, {controls} of them "
        f"{CONTROL} rows (broken builds expected to fail)"
    )
    for f in collected:
        if f.notes:
            lines.append(f"{_scenario_cell(f)}: {f.notes}")
        if f.unexplained_duplicates:
            lines.append(
                f"{_scenario_cell(f)}: ran more often than any fault found them held "
                f"(job, workers, attempts, last error): {f.unexplained_duplicates}"
            )
    return lines


def _scenario_cell(figures: Figures) -> str:
    if not figures.broken:
        return figures.scenario
    return f"{CONTROL} ({', '.join(figures.broken)}) {figures.scenario}"
