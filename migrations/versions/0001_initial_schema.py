"""Initial schema: jobs, job_blockers, workers, queues.

Revision ID: 0001
Revises:
Create Date: 2026-11-22

Frozen history: every name is spelled out here, nothing is imported from pgwork's
current MetaData. The schema itself is created by ``env.py`` (it must exist before
Alembic writes its version table into it); this revision creates everything inside.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JOB_STATUS = ("blocked", "pending", "running", "completed", "failed", "cancelled")
CHAIN_STATUS = ("active", "completed", "failed", "cancelled")


def _enum(name: str, values: tuple[str, ...], schema: str) -> pg.ENUM:
    return pg.ENUM(*values, name=name, schema=schema, create_type=False)


def upgrade(*, schema: str) -> None:
    bind = op.get_bind()
    job_status = _enum("job_status", JOB_STATUS, schema)
    chain_status = _enum("chain_status", CHAIN_STATUS, schema)
    job_status.create(bind, checkfirst=False)
    chain_status.create(bind, checkfirst=False)
    now = sa.text("now()")

    op.create_table(
        "jobs",
        sa.Column("id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("type_name", sa.Text(), nullable=False),
        sa.Column("chain_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("chain_type_name", sa.Text(), nullable=False),
        sa.Column("chain_index", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("input", pg.JSONB(), nullable=True),
        sa.Column("output", pg.JSONB(), nullable=True),
        sa.Column("status", job_status, nullable=False),
        sa.Column("queue", sa.Text(), nullable=False, server_default=sa.text("'default'")),
        sa.Column("priority", sa.SmallInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("scheduled_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("last_attempt_error", pg.JSONB(), nullable=True),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("leased_by", sa.Text(), nullable=True),
        sa.Column("leased_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_token", pg.UUID(as_uuid=True), nullable=True),
        sa.Column("chain_status", chain_status, nullable=True),
        sa.Column("chain_completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("dedup_key", sa.Text(), nullable=True),
        sa.Column("trace_context", pg.JSONB(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="jobs_pkey"),
        sa.CheckConstraint("attempt >= 0", name="jobs_attempt_non_negative"),
        sa.CheckConstraint("max_attempts >= 1", name="jobs_max_attempts_positive"),
        sa.CheckConstraint(
            "(id = chain_id) = (chain_status IS NOT NULL)", name="jobs_chain_status_on_root"
        ),
        schema=schema,
        postgresql_with={
            "fillfactor": "70",
            "autovacuum_vacuum_scale_factor": "0.01",
            "autovacuum_analyze_scale_factor": "0.02",
            "autovacuum_vacuum_cost_delay": "1",
        },
    )
    op.create_index(
        "jobs_acquire_idx",
        "jobs",
        ["queue", "priority", "scheduled_at"],
        schema=schema,
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "jobs_lease_expiry_idx",
        "jobs",
        ["leased_until"],
        schema=schema,
        postgresql_where=sa.text("status = 'running'"),
    )
    op.create_index(
        "jobs_chain_idx", "jobs", ["chain_id", "chain_index"], unique=True, schema=schema
    )
    op.create_index(
        "jobs_chains_idx",
        "jobs",
        ["chain_type_name", "chain_status", "created_at"],
        schema=schema,
        postgresql_where=sa.text("id = chain_id"),
    )
    op.create_index(
        "jobs_dedup_idx",
        "jobs",
        ["chain_type_name", "dedup_key"],
        schema=schema,
        postgresql_where=sa.text("dedup_key IS NOT NULL"),
    )
    op.create_index(
        "jobs_attention_idx",
        "jobs",
        ["status", "type_name", "created_at"],
        schema=schema,
        postgresql_where=sa.text("status IN ('failed', 'blocked')"),
    )

    op.create_table(
        "job_blockers",
        sa.Column("job_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("blocker_chain_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("position", sa.SmallInteger(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "blocker_chain_id", name="job_blockers_pkey"),
        sa.ForeignKeyConstraint(
            ["job_id"],
            [f"{schema}.jobs.id"],
            name="job_blockers_job_id_fkey",
            ondelete="CASCADE",
        ),
        schema=schema,
    )
    op.create_index("job_blockers_blocker_idx", "job_blockers", ["blocker_chain_id"], schema=schema)

    op.create_table(
        "workers",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("queues", pg.ARRAY(sa.Text()), nullable=False),
        sa.Column("job_types", pg.ARRAY(sa.Text()), nullable=False),
        sa.Column("max_slots", sa.Integer(), nullable=False),
        sa.Column("active_slots", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("status", sa.Text(), nullable=False, server_default=sa.text("'idle'")),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("metadata", pg.JSONB(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="workers_pkey"),
        sa.CheckConstraint(
            "status IN ('idle', 'busy', 'stopping', 'stopped')", name="workers_status_known"
        ),
        schema=schema,
    )
    op.create_index("workers_heartbeat_idx", "workers", ["heartbeat_at"], schema=schema)

    op.create_table(
        "queues",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.PrimaryKeyConstraint("name", name="queues_pkey"),
        schema=schema,
    )


def downgrade(*, schema: str) -> None:
    # Dropping a table drops its indexes, constraints and the foreign key into it.
    op.drop_table("queues", schema=schema)
    op.drop_table("workers", schema=schema)
    op.drop_table("job_blockers", schema=schema)
    op.drop_table("jobs", schema=schema)
    bind = op.get_bind()
    _enum("chain_status", CHAIN_STATUS, schema).drop(bind, checkfirst=False)
    _enum("job_status", JOB_STATUS, schema).drop(bind, checkfirst=False)
