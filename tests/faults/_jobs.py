"""The job types the fault scenarios run, shared by the tests and the worker driver.

Every handler first writes a *ledger* row on a connection of its own, in autocommit:
the ledger survives whatever happens to the attempt afterwards, so it counts
executions. ``effect`` (atomic mode) also writes an *effect* row through
``attempt.connection`` (``sync_effect``: the same from a plain ``def`` handler): that
row commits with the job's completion or not at all, so two effect rows for one job are
a duplicate effect, the thing atomic mode promises never to produce. The flow-limited
types (``limited``, ``keyed``) also write an *interval* row: when their handler began
and, on its way out, when it ended, both by the database's clock, so the attempts
running at any instant can be counted from outside pgwork. The rated type (``rated``)
writes one too, with the moment before which its attempt cannot have started (its
acquire's transaction start, read back from the lease it was given), so the attempts
started in any window can be bounded from outside.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from pgwork import JobTypeRegistry, Rate, RetryPolicy

__all__ = [
    "FAULT_TABLES",
    "FLOW_CONCURRENCY",
    "FLOW_KEY_CONCURRENCY",
    "FLOW_KEY_RATE",
    "FLOW_RATE",
    "RETRY",
    "Spec",
    "registry",
]

# Kept in the template database, so every test's clone starts with empty tables.
FAULT_TABLES = """
CREATE TABLE faults_ledger (
    id bigserial PRIMARY KEY,
    job_id uuid NOT NULL,
    attempt int NOT NULL,
    worker text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ON faults_ledger (job_id);
-- No unique constraint on purpose: a duplicate effect must be visible, not refused.
CREATE TABLE faults_effects (
    job_id uuid NOT NULL,
    worker text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ON faults_effects (job_id);
-- Holds the one key ``unwritable`` handlers insert again: their write always fails.
CREATE TABLE faults_unique (k int PRIMARY KEY);
INSERT INTO faults_unique VALUES (1);
-- One row per attempt of a flow-limited type: ``ended_at`` stays NULL when its process
-- was killed mid-attempt. ``leased_at``: its acquire's transaction start (the lease's
-- end less its length), no later than the moment the acquire counted it as started.
CREATE TABLE faults_intervals (
    id bigserial PRIMARY KEY,
    job_id uuid NOT NULL,
    attempt int NOT NULL,
    limit_key text,
    worker text NOT NULL,
    leased_at timestamptz,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at timestamptz
);
"""

# Fast retries: a fault that fails an attempt should cost milliseconds, not minutes.
RETRY = RetryPolicy(initial=timedelta(seconds=0.05), multiplier=2.0, maximum=timedelta(seconds=0.5))
# The flow limits: at most this many ``limited`` attempts running at once, and this many
# ``keyed`` ones per limit key (its jobs enqueued without a key share one group).
FLOW_CONCURRENCY = 3
FLOW_KEY_CONCURRENCY = 2
# The rates: at most this many ``rated`` attempts started in any half second, and this
# many of one limit key (its jobs enqueued without a key share one group).
FLOW_RATE = Rate(6, per=timedelta(milliseconds=500))
FLOW_KEY_RATE = Rate(2, per=timedelta(milliseconds=500))
# The schedule "boom" is checked against: 0.3 s, then 0.6 s.
BOOM_RETRY = RetryPolicy(initial=timedelta(seconds=0.3), multiplier=2.0)


class Spec(BaseModel):
    """What one job does: sleep ``ms``, or ``first_ms`` on its first attempt (only on
    worker ``slow_on`` when that is set). ``block`` handlers, given ``until``, block
    their first attempt until that file exists, for ``first_ms`` at the most."""

    n: int = 0
    ms: int = 0
    first_ms: int | None = None
    slow_on: str | None = None
    until: str | None = None


def registry(lease: float = 2.0) -> JobTypeRegistry:
    """All fault job types; ``lease`` (seconds) is the staged lease and the atomic one."""
    reg = JobTypeRegistry()
    reg.job_type("work", input=Spec, lease=timedelta(seconds=lease), retry=RETRY, max_attempts=25)
    # Atomic: ``effect`` writes an effect row; ``quiet`` writes nothing of its own, so
    # in a group its completion waits for the group's commit, written with the other
    # such members' in one statement. An atomic attempt, lone or grouped, has its
    # lease renewed while its handler runs (the timeout bounds the transaction).
    # ``sync_effect``: ``effect`` as a plain ``def``, on the worker's threads.
    for name in ("effect", "sync_effect", "quiet"):
        reg.job_type(
            name,
            input=Spec,
            lease=timedelta(seconds=lease),
            timeout=timedelta(seconds=3 * lease),
            mode="atomic",
            retry=RETRY,
            max_attempts=25,
        )
    reg.job_type(
        "hang",
        input=Spec,
        lease=timedelta(seconds=lease),
        timeout=timedelta(seconds=1),
        retry=RETRY,
        max_attempts=2,
    )
    reg.job_type("block", input=Spec, lease=timedelta(seconds=lease), retry=RETRY, max_attempts=5)
    reg.job_type(
        "boom", input=Spec, lease=timedelta(seconds=lease), retry=BOOM_RETRY, max_attempts=3
    )
    reg.job_type("suicide", input=Spec, lease=timedelta(seconds=lease), max_attempts=3)
    # Atomic: swallows the unique violation of its write and returns normally, so its
    # outcome can never be committed; it must fail for good at max_attempts.
    reg.job_type(
        "unwritable",
        input=Spec,
        lease=timedelta(seconds=lease),
        timeout=timedelta(seconds=3 * lease),
        mode="atomic",
        retry=RETRY,
        max_attempts=3,
    )
    # Atomic: writes an effect, then hands its chain on to ``work``.
    reg.job_type(
        "relay",
        input=Spec,
        lease=timedelta(seconds=lease),
        timeout=timedelta(seconds=3 * lease),
        mode="atomic",
        retry=RETRY,
        max_attempts=25,
        continue_with=["work"],
    )
    reg.job_type(
        "limited",
        input=Spec,
        lease=timedelta(seconds=lease),
        retry=RETRY,
        max_attempts=25,
        concurrency=FLOW_CONCURRENCY,
    )
    reg.job_type(
        "keyed",
        input=Spec,
        lease=timedelta(seconds=lease),
        retry=RETRY,
        max_attempts=25,
        key_concurrency=FLOW_KEY_CONCURRENCY,
    )
    reg.job_type(
        "rated",
        input=Spec,
        lease=timedelta(seconds=lease),
        retry=RETRY,
        max_attempts=25,
        rate=FLOW_RATE,
        key_rate=FLOW_KEY_RATE,
    )
    return reg
