"""The randomized fault run's oracle: the contract, read from the database.

* nothing lost: every job reaches a final state within the drain bound of the last
  fault (completed, failed, or its chain cancelled);
* nothing past ``max_attempts``: no job started more handler runs than its
  ``max_attempts``, nor counts more attempts;
* atomic effects exactly once: a completed atomic job committed its effect once, any
  other atomic job never;
* bounded duplicates: a job that does not fail by itself ran again only as often as
  faults found it held (its lease, or its row locked by a caller);
* no worker stopped by itself, and after a cancel commits no job of the chain starts
  an attempt (a handler may still begin, for an attempt its worker had begun before,
  until its lease's renewal tells it the chain was cancelled).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg
from tests.faults._oracle import Figures

if TYPE_CHECKING:
    from tests.faults._chaos import Chaos

__all__ = ["SELF_FAILING", "check", "unexplained", "violations"]

# Types whose handlers fail by themselves (every run may be a new attempt).
SELF_FAILING = ("boom", "unwritable")

_PAST_MAX_ATTEMPTS = """
SELECT j.id, j.type_name, j.attempt, j.max_attempts, count(l.id)
FROM pgwork.jobs AS j LEFT JOIN faults_ledger AS l ON l.job_id = j.id
GROUP BY j.id
HAVING count(l.id) > j.max_attempts OR j.attempt > j.max_attempts
"""

_EFFECTS_NOT_ONCE = """
SELECT j.id, j.type_name, j.status::text, count(e.job_id)
FROM pgwork.jobs AS j LEFT JOIN faults_effects AS e ON e.job_id = j.id
WHERE j.type_name IN ('effect', 'relay')
GROUP BY j.id
HAVING count(e.job_id) <> CASE WHEN j.status = 'completed' THEN 1 ELSE 0 END
"""

_NOT_FINAL = """
SELECT id, type_name, status::text, attempt, leased_by FROM pgwork.jobs
WHERE status NOT IN ('completed', 'failed', 'cancelled')
"""

# A chain's status is kept on its first job's row.
_WRONG_END = """
SELECT j.id, j.type_name, j.status::text, j.last_attempt_error->>'type'
FROM pgwork.jobs AS j JOIN pgwork.jobs AS root ON root.id = j.chain_id
WHERE root.chain_status <> 'cancelled'
  AND ((j.type_name IN ('work', 'effect', 'quiet') AND j.status <> 'completed')
       OR (j.type_name IN ('boom', 'unwritable') AND j.status <> 'failed'))
"""

# Handlers that began after the cancel had committed, with their attempts.
_STARTED_AFTER_CANCEL = """
SELECT j.id, j.type_name, l.at, j.status::text, l.attempt FROM pgwork.jobs AS j
JOIN faults_ledger AS l ON l.job_id = j.id
WHERE j.chain_id = %s AND l.at > %s
"""

_CHAIN_STATUS = "SELECT chain_status::text FROM pgwork.jobs WHERE id = %s"  # the root


def unexplained(dsn: str, figures: Figures) -> list[Any]:
    """Jobs that do not fail by themselves and ran more often than faults found them
    held."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT l.job_id, array_agg(l.worker ORDER BY l.id), j.type_name,"
            " array_agg(to_char(l.at, 'HH24:MI:SS.MS') ORDER BY l.id),"
            " j.last_attempt_error->>'message'"
            " FROM faults_ledger AS l JOIN pgwork.jobs AS j ON j.id = l.job_id"
            " WHERE j.type_name <> ALL(%s) GROUP BY l.job_id, j.type_name, j.last_attempt_error"
            " HAVING count(*) > 1",
            (list(SELF_FAILING),),
        ).fetchall()
    return [
        (str(job), workers, type_name, started, error)
        for job, workers, type_name, started, error in rows
        if len(workers) - 1 > figures.held_jobs[job]
    ]


# Lines about leases, renewals, reaping and the database's reachability: what explains
# a job run twice.
_LEASE_TALK = r"lease|renew|reap|unreachable|could not|settled|hand"


def _leases_around(chaos: Chaos, job: str) -> list[str]:
    """Every worker's lines about leases from 3 s before the job was first named to 1 s
    after it was last named, each with its time relative to the first."""
    named = chaos.fleet.all_lines(job)
    if not named:
        return []
    first, last = min(line.at for line in named), max(line.at for line in named)
    return [
        f"{line.at - first:+.3f} {worker} {line.text[:160]}"
        for worker, line in chaos.fleet.said_between(first - 3.0, last + 1.0, _LEASE_TALK)
    ][:40]


def violations(dsn: str, chaos: Chaos, drain_bound: float) -> list[str]:
    """Every way the run broke the contract (empty: it kept it)."""
    found: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        not_final = conn.execute(_NOT_FINAL).fetchall()
        if not chaos.settled or not_final:
            late = chaos.late or not_final
            found.append(
                f"{len(late)} job(s) not final {drain_bound:.0f} s after the last fault (id, "
                f"type, status, attempt, leased by, until, scheduled at, last error): "
                f"{late[:5]}; {len(not_final)} still not final as the workers stopped"
            )
            for job, *_ in late[:3]:
                said = [line.text for line in chaos.fleet.all_lines(str(job))]
                found.append(f"what the workers said of {job}: {said[-8:]}")
        past = conn.execute(_PAST_MAX_ATTEMPTS).fetchall()
        if past:
            found.append(
                f"{len(past)} job(s) past max_attempts (id, type, attempt, max, runs): {past[:5]}"
            )
        effects = conn.execute(_EFFECTS_NOT_ONCE).fetchall()
        if effects:
            found.append(
                f"{len(effects)} atomic job(s) whose effect did not commit exactly once "
                f"(id, type, status, effects): {effects[:5]}"
            )
        wrong = conn.execute(_WRONG_END).fetchall()
        if wrong:
            found.append(f"{len(wrong)} job(s) ended wrongly: {wrong[:5]}")
        for chain, at, begun in chaos.cancels:
            late = [
                row
                for row in conn.execute(_STARTED_AFTER_CANCEL, (chain, at)).fetchall()
                if row[0] not in begun or row[4] > begun[row[0]]
            ]
            if late:
                found.append(f"chain {chain} cancelled, then its jobs started: {late}")
            status = conn.execute(_CHAIN_STATUS, (chain,)).fetchone()
            if status is not None and status[0] != "cancelled":
                found.append(f"chain {chain} cancelled, then ended {status[0]}")
    extra = unexplained(dsn, chaos.figures)
    if extra:
        found.append(
            f"{len(extra)} job(s) ran more often than faults found them held "
            f"(job, workers, type, started at, last error): {extra[:5]}; faults began at "
            + ", ".join(f"{k} {at:%H:%M:%S.%f}"[:-3] for k, at in chaos.faults_at)
        )
        for job, *_ in extra[:3]:
            said = [line.text for line in chaos.fleet.all_lines(job) if "started" not in line.text]
            found.append(f"what the workers said of {job}: {said[:6]}")
            found.append(f"what the workers said of leases around it: {_leases_around(chaos, job)}")
    exits = chaos.fleet.unexpected_exits()
    if exits:
        found.append(
            "worker(s) stopped by themselves: "
            + "; ".join(f"{e.worker_id} ({e.returncode}): {e.tail[-30:]}" for e in exits)
        )
    return found


def check(dsn: str, chaos: Chaos, drain_bound: float, replay: str) -> None:
    """Fail with every violation found, the schedule, and how to replay it."""
    found = violations(dsn, chaos, drain_bound)
    if found:
        raise AssertionError(
            "the randomized fault run broke the contract:\n  - "
            + "\n  - ".join(found)
            + f"\nschedule (seed {chaos.schedule.seed}): {chaos.schedule.describe()}"
            + f"\nreplay: {replay}"
        )
