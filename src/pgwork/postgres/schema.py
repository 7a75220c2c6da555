"""The pgwork schema, defined once as SQLAlchemy Core ``MetaData``.

Alembic migrations are checked against this module (autogenerate must find no
difference), and the statement contract test prepares every SQL statement against a
database migrated to head, so this file, the migrations and the SQL cannot drift apart.

Design notes (why the columns are what they are):

* A *chain* is its first job: ``jobs.id == jobs.chain_id`` marks the chain's root row.
  Chain-level state (``chain_status``, ``chain_completed_at``, ``dedup_key``,
  ``debounce_deadline``) lives only on that row, so a one-job chain — the common case —
  costs one row and one write per state change, and chains can still be listed and
  filtered through a partial index.
* ``lease_token`` fences every write made while a job runs: it is replaced on each
  acquisition, so a worker that lost its lease (paused, partitioned, reaped) matches no
  row. ``attempt`` counts attempts and is not reused for fencing because a graceful
  release hands the attempt back.
* All timestamps are written with the database clock (``now()``), the one clock pgwork
  trusts for schedules and leases.
* ``jobs`` is the high-churn table: a lower fillfactor leaves room for HOT updates and
  autovacuum runs after 1% of rows change instead of the default 20%.
"""

from __future__ import annotations

from functools import lru_cache

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from pgwork.postgres._names import (
    CHAIN_STATUSES,
    DEFAULT_SCHEMA,
    JOB_STATUSES,
    LEGACY_VERSION_TABLE,
    VERSION_TABLE,
    validate_schema_name,
)

__all__ = [
    "CHAIN_STATUSES",
    "DEFAULT_SCHEMA",
    "JOB_STATUSES",
    "LEGACY_VERSION_TABLE",
    "VERSION_TABLE",
    "build_metadata",
    "table",
    "validate_schema_name",
]


@lru_cache(maxsize=32)
def build_metadata(schema: str = DEFAULT_SCHEMA) -> sa.MetaData:
    """Return the MetaData of every pgwork table in ``schema``."""
    schema = validate_schema_name(schema)
    md = sa.MetaData(schema=schema)
    job_status = pg.ENUM(*JOB_STATUSES, name="job_status", schema=schema, metadata=md)
    chain_status = pg.ENUM(*CHAIN_STATUSES, name="chain_status", schema=schema, metadata=md)
    now = sa.text("now()")

    sa.Table(
        "jobs",
        md,
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("type_name", sa.Text, nullable=False),
        sa.Column("chain_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("chain_type_name", sa.Text, nullable=False),
        sa.Column("chain_index", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("input", pg.JSONB, nullable=True),
        sa.Column("output", pg.JSONB, nullable=True),
        sa.Column("status", job_status, nullable=False),
        sa.Column("queue", sa.Text, nullable=False, server_default=sa.text("'default'")),
        sa.Column("priority", sa.SmallInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("scheduled_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempt", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("last_attempt_error", pg.JSONB, nullable=True),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("leased_by", sa.Text, nullable=True),
        sa.Column("leased_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_token", pg.UUID(as_uuid=True), nullable=True),
        # Chain-level state; meaningful on the root row only (id = chain_id).
        sa.Column("chain_status", chain_status, nullable=True),
        sa.Column("chain_completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("dedup_key", sa.Text, nullable=True),
        # W3C trace context of the request that enqueued the job (observability).
        sa.Column("trace_context", pg.JSONB, nullable=True),
        # Root rows: someone awaits this chain, so its end is announced (migration 0002).
        sa.Column("chain_awaited", sa.Boolean, nullable=False, server_default=sa.text("false")),
        # Root rows: some job is blocked on this chain (migration 0002, see there why).
        sa.Column(
            "chain_has_dependants", sa.Boolean, nullable=False, server_default=sa.text("false")
        ),
        # A logging context given at enqueue, inherited by continuations (migration 0004).
        sa.Column("context", pg.JSONB, nullable=True),
        # The job's failed attempts, newest last and capped (migration 0008): appended
        # by the failure and reap statements only, so a job that never fails holds NULL
        # and no other write touches it.
        sa.Column("attempt_history", pg.JSONB, nullable=True),
        # The key its type's per-key flow limits count it by (``start_chain(limit_key=...)``),
        # kept by continuations; NULL: no key, which a keyed type counts as one key of
        # its own (migration 0011).
        sa.Column("limit_key", sa.Text, nullable=True),
        # The group a limited type's flow limits count the job in: its limit key for a
        # keyed type, '' for a type limited as a whole or a keyed type's job without a
        # key; NULL for a type without limits, which keeps it out of the two indexes
        # below (migration 0011).
        sa.Column("limit_group", sa.Text, nullable=True),
        # A debounced chain's root (``Debounce``): its first enqueue plus ``max_wait``,
        # the latest a merge may push its start to; NULL on every other row, so the
        # index below holds debounced roots only (migration 0014).
        sa.Column("debounce_deadline", sa.DateTime(timezone=True), nullable=True),
        # A waiting step's signal name (``Continue(..., wait_for=...)``), cleared by the
        # match that hands it a signal; NULL for every other job (migration 0015).
        sa.Column("wait_signal", sa.Text, nullable=True),
        # A blocked job's count of its blockers (migration 0016): how many must be met
        # (completed, or ended under "unblock") before it runs, how many are, and how
        # many have not ended. Each blocker's end adds to them, reading nothing else
        # (``sql.chains``); NULL for a job that was never blocked on a chain.
        sa.Column("blockers_needed", sa.Integer, nullable=True),
        sa.Column("blockers_met", sa.Integer, nullable=True),
        sa.Column("blockers_open", sa.Integer, nullable=True),
        # A root enqueued with a dedup key that has a window (``DedupSpec``): the end of
        # that window, infinity for ``scope="ever"``. Retention keeps the chain until
        # then, so that deleting it reopens no window early; NULL for every other row
        # (migration 0018).
        sa.Column("dedup_until", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("attempt >= 0", name="jobs_attempt_non_negative"),
        sa.CheckConstraint("max_attempts >= 1", name="jobs_max_attempts_positive"),
        sa.CheckConstraint(
            "(id = chain_id) = (chain_status IS NOT NULL)", name="jobs_chain_status_on_root"
        ),
        # Acquire: ready jobs of one queue in (priority, scheduled_at) order.
        sa.Index(
            "jobs_acquire_idx",
            "queue",
            "priority",
            "scheduled_at",
            postgresql_where=sa.text("status = 'pending'"),
        ),
        # Reap: running jobs by lease expiry.
        sa.Index(
            "jobs_lease_expiry_idx",
            "leased_until",
            postgresql_where=sa.text("status = 'running'"),
        ),
        # A chain's continuations in order; its root (id = chain_id, chain_index 0) is
        # found by primary key, so most chains, one job long, cost no entry here
        # (migration 0005).
        sa.Index(
            "jobs_chain_idx",
            "chain_id",
            "chain_index",
            unique=True,
            postgresql_where=sa.text("id <> chain_id"),
        ),
        # Chains (root rows) by type and status, newest first for listings and retention.
        # A running root is left out: it is among the few rows of jobs_lease_expiry_idx,
        # where listings find it, and its claim then writes no entry here (migration 0006).
        # ``id`` breaks ties: the chains of one bulk enqueue share their ``created_at``,
        # and a page reads them in order without sorting them all (migration 0010).
        sa.Index(
            "jobs_chains_idx",
            "chain_type_name",
            "chain_status",
            "created_at",
            "id",
            postgresql_where=sa.text("id = chain_id AND status <> 'running'"),
        ),
        # Deduplication lookups.
        sa.Index(
            "jobs_dedup_idx",
            "chain_type_name",
            "dedup_key",
            postgresql_where=sa.text("dedup_key IS NOT NULL"),
        ),
        # At most one debounced root per (chain type, key) that a merge may still change:
        # pending and never started. The enqueue's ``ON CONFLICT`` arbiter, so that
        # concurrent enqueues of a key merge instead of starting two chains, at any
        # isolation level. A job leaves it as it starts (a retry's pending again but has
        # ``started_at``), and every other row has no entry (migration 0014).
        sa.Index(
            "jobs_debounce_idx",
            "chain_type_name",
            "dedup_key",
            unique=True,
            postgresql_where=sa.text(
                "debounce_deadline IS NOT NULL AND status = 'pending' AND started_at IS NULL"
            ),
        ),
        # Failed / blocked jobs are few and listed often.
        sa.Index(
            "jobs_attention_idx",
            "status",
            "type_name",
            "created_at",
            postgresql_where=sa.text("status IN ('failed', 'blocked')"),
        ),
        # Failed jobs newest first by id, for job listings filtered on failure: the
        # primary key would walk past every newer job that did not fail (migration 0010).
        sa.Index(
            "jobs_failed_idx",
            "id",
            postgresql_where=sa.text("status = 'failed'"),
        ),
        # Ended jobs by end time: the dashboard counts the last hour as one range of it
        # (migration 0007). One entry per job, written by its completion or failure.
        sa.Index(
            "jobs_ended_idx",
            "completed_at",
            "queue",
            "status",
            postgresql_where=sa.text("status IN ('completed', 'failed')"),
        ),
        # Flow limits (migration 0011): a limited type's ready jobs by group in acquire
        # order, so the acquire walks the groups and takes the next job of each that
        # has room; and its running jobs by group, so it counts what runs of a type, or
        # of one of its groups, in one index range. Jobs of types without limits have
        # no group and no entry in either.
        sa.Index(
            "jobs_limit_pending_idx",
            "type_name",
            "limit_group",
            "priority",
            "scheduled_at",
            postgresql_where=sa.text("status = 'pending' AND limit_group IS NOT NULL"),
        ),
        sa.Index(
            "jobs_limit_running_idx",
            "type_name",
            "limit_group",
            postgresql_where=sa.text("status = 'running' AND limit_group IS NOT NULL"),
        ),
        # Waiting steps by signal name, oldest first: what a match pairs signals with
        # (migration 0015). A step leaves it when matched (its name cleared) or once
        # it runs; a job that never waits has no entry.
        sa.Index(
            "jobs_wait_signal_idx",
            "wait_signal",
            "id",
            postgresql_where=sa.text(
                "wait_signal IS NOT NULL AND status IN ('blocked', 'pending')"
            ),
        ),
        postgresql_with={
            "fillfactor": "70",
            "autovacuum_vacuum_scale_factor": "0.01",
            "autovacuum_analyze_scale_factor": "0.02",
            "autovacuum_vacuum_cost_delay": "1",
        },
    )

    sa.Table(
        "job_blockers",
        md,
        sa.Column(
            "job_id",
            pg.UUID(as_uuid=True),
            sa.ForeignKey(f"{schema}.jobs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("blocker_chain_id", pg.UUID(as_uuid=True), primary_key=True),
        # Its place among the job's blockers; an integer, for a fan-out of more than
        # 32,767 children (migration 0016).
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("on_failure", sa.Text, nullable=False, server_default=sa.text("'fail'")),
        # How the edge was counted in its job's counters: NULL while its chain runs,
        # 'met' or 'failed' once its end was settled (migration 0016).
        sa.Column("counted", sa.Text, nullable=True),
        sa.CheckConstraint(
            "on_failure IN ('fail', 'cancel', 'unblock')", name="job_blockers_on_failure_known"
        ),
        sa.CheckConstraint("counted IN ('met', 'failed')", name="job_blockers_counted_known"),
        sa.Index("job_blockers_blocker_idx", "blocker_chain_id"),
        # A job's edges in declaration order: the first few of each blocked job listed,
        # one job's paged (migration 0017).
        sa.Index("job_blockers_position_idx", "job_id", "position"),
    )

    sa.Table(
        "workers",
        md,
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("queues", pg.ARRAY(sa.Text), nullable=False),
        sa.Column("job_types", pg.ARRAY(sa.Text), nullable=False),
        sa.Column("max_slots", sa.Integer, nullable=False),
        sa.Column("active_slots", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'idle'")),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("metadata", pg.JSONB, nullable=True),
        # Revision 0003: handlers the worker gave up on that still run.
        sa.Column("abandoned_handlers", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.CheckConstraint(
            "status IN ('idle', 'busy', 'stopping', 'stopped')", name="workers_status_known"
        ),
        sa.Index("workers_heartbeat_idx", "heartbeat_at"),
    )

    sa.Table(
        "queues",
        md,
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
    )

    # Flow limits changed at run time (migration 0011), kept like a queue's pause: a row
    # per job type (``limit_key`` '', which no job's key can be) or per key of one
    # (``limit_key`` the key). A NULL column keeps what the code declares; a value
    # overrides it. ``rate_per_s`` / ``key_rate_per_s`` are a ``Rate``'s window in
    # seconds, set together with their count. ``paused_until``: no attempt of the type
    # (or key) starts before then.
    sa.Table(
        "job_limits",
        md,
        sa.Column("type_name", sa.Text, primary_key=True),
        sa.Column("limit_key", sa.Text, primary_key=True, server_default=sa.text("''")),
        sa.Column("concurrency", sa.Integer, nullable=True),
        sa.Column("key_concurrency", sa.Integer, nullable=True),
        sa.Column("rate_n", sa.Integer, nullable=True),
        sa.Column("rate_per_s", sa.Float, nullable=True),
        sa.Column("key_rate_n", sa.Integer, nullable=True),
        sa.Column("key_rate_per_s", sa.Float, nullable=True),
        sa.Column("paused_until", sa.DateTime(timezone=True), nullable=True),
        # The type-wide row's: the limit group the type's last acquire served last (the
        # next starts after it, so groups are served in turn).
        sa.Column("cursor_key", sa.Text, nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        # The type-wide row's (migration 0012): since when an acquire that came back
        # short left jobs of the type pending that it could not start (its worker
        # sleeps until told); the next acquire that finds room clears it and its
        # worker announces the type's jobs.
        sa.Column("waiting_since", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "concurrency > 0 AND key_concurrency > 0", name="job_limits_concurrency_positive"
        ),
        sa.CheckConstraint(
            "(rate_n IS NULL) = (rate_per_s IS NULL) AND rate_n > 0 AND rate_per_s > 0",
            name="job_limits_rate_whole",
        ),
        sa.CheckConstraint(
            "(key_rate_n IS NULL) = (key_rate_per_s IS NULL)"
            " AND key_rate_n > 0 AND key_rate_per_s > 0",
            name="job_limits_key_rate_whole",
        ),
    )

    # The attempts started of types with a rate (migration 0013): written by the
    # acquire that leased each, under the type's lock, and counted over the last window
    # by the next; the acquire deletes those older than the type's longest window.
    sa.Table(
        "job_starts",
        md,
        sa.Column("type_name", sa.Text, nullable=False),
        sa.Column("limit_group", sa.Text, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Index("job_starts_type_idx", "type_name", "started_at"),
        sa.Index("job_starts_group_idx", "type_name", "limit_group", "started_at"),
    )

    # Signals (migration 0015): one row per ``client.signal``, written in the sender's
    # transaction. ``consumed_by`` is the waiting step a match handed it to (NULL while
    # pending); that step's attempts read the payload by it. Ordered by ``id`` (a
    # UUIDv7 made when the signal is sent): the oldest pending signal of a name goes
    # to the oldest waiting step.
    sa.Table(
        "signals",
        md,
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("payload", pg.JSONB, nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("consumed_by", pg.UUID(as_uuid=True), nullable=True),
        sa.Column("consumed_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "(consumed_by IS NULL) = (consumed_at IS NULL)", name="signals_consumed_whole"
        ),
        # Pending signals of a name, oldest first: the match, and the sweep that finds
        # names with both a signal and a waiter.
        sa.Index(
            "signals_pending_idx", "name", "id", postgresql_where=sa.text("consumed_by IS NULL")
        ),
        # A step's signal, read by its attempts.
        sa.Index(
            "signals_consumed_idx",
            "consumed_by",
            postgresql_where=sa.text("consumed_by IS NOT NULL"),
        ),
        # By age, for the pruning of expired pending signals and of consumed ones
        # whose step has ended.
        sa.Index("signals_sent_idx", "sent_at"),
    )

    # The history of ended jobs, counted per bucket of end time, queue and job type
    # (migration 0009): throughput, wait and run time over days, kept after retention
    # deleted the jobs. Filled by the worker's maintenance from jobs_ended_idx
    # (``sql.history``); nothing on the enqueue, claim or completion path
    # writes it. Each bucket width (``bucket_seconds``) is a resolution of its own.
    # Besides each queue and type, a rollup writes each queue's total (type '') and
    # the grand total (queue and type ''; neither name can be empty), so a chart of
    # everything reads one row per bucket; the key puts the time last for that.
    # ``*_hist`` count durations per bin of ``pgwork.adapters.history.DURATION_BINS_S``.
    bigint_zero = sa.text("0")
    sa.Table(
        "job_history",
        md,
        sa.Column("bucket_seconds", sa.Integer, primary_key=True),
        sa.Column("queue", sa.Text, primary_key=True),
        sa.Column("type_name", sa.Text, primary_key=True),
        sa.Column("bucket_start", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("completed", sa.BigInteger, nullable=False, server_default=bigint_zero),
        sa.Column("failed", sa.BigInteger, nullable=False, server_default=bigint_zero),
        sa.Column("wait_count", sa.BigInteger, nullable=False, server_default=bigint_zero),
        sa.Column("wait_sum_s", sa.Float, nullable=False, server_default=bigint_zero),
        sa.Column("wait_max_s", sa.Float, nullable=False, server_default=bigint_zero),
        sa.Column("wait_hist", pg.ARRAY(sa.BigInteger), nullable=False),
        sa.Column("run_count", sa.BigInteger, nullable=False, server_default=bigint_zero),
        sa.Column("run_sum_s", sa.Float, nullable=False, server_default=bigint_zero),
        sa.Column("run_max_s", sa.Float, nullable=False, server_default=bigint_zero),
        sa.Column("run_hist", pg.ARRAY(sa.BigInteger), nullable=False),
        sa.CheckConstraint("bucket_seconds > 0", name="job_history_bucket_positive"),
    )

    # How far the history has counted ended jobs: every job that completed or failed
    # before ``rolled_up_to`` is in ``job_history``. One row, written by the migration;
    # locking it is what lets one maintenance run (or retention sweep) count at a time.
    sa.Table(
        "job_history_progress",
        md,
        sa.Column("singleton", sa.Boolean, primary_key=True, server_default=sa.text("true")),
        sa.Column("rolled_up_to", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.CheckConstraint("singleton", name="job_history_progress_one_row"),
    )
    return md


def table(schema: str, name: str) -> sa.Table:
    """Return one table of the schema's MetaData."""
    return build_metadata(schema).tables[f"{schema}.{name}"]
