"""Flow limits: a limit key on each job, the indexes that count by it, run-time overrides.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29

A job type may declare how many of its attempts run at once and how many start per
window of time, for the type as a whole and per limit key (a tenant, a host), the key
given at enqueue (``start_chain(limit_key=...)``) and kept by the chain's
continuations.

* ``jobs.limit_key``: the key, NULL for none. ``jobs.limit_group``: the group a
  limited type's limits count the job in (its key, or '' for none), NULL for a job of a
  type without limits. Nullable without a default: adding them rewrites nothing, even
  on a large table.
* ``jobs_limit_pending_idx``: ready jobs of limited types by type and group in acquire
  order (priority, then due time), so the acquire can take the next job of each group
  that has room.
* ``jobs_limit_running_idx``: running jobs of limited types by type and group, so the
  acquire counts what runs of a type, or of one of its groups, in one index range.
* ``job_limits.cursor_key``: the group a keyed type's last acquire served last.
* ``job_limits``: limits changed at run time, kept like a queue's pause: a row per
  type (``limit_key`` '') or per key of one; a NULL column keeps the code's
  declaration.

A job of a limited type costs one entry more in each index while it is pending and
while it runs; a job of any other type none.
Building the two indexes locks ``jobs`` against writes (not reads) for the time it
takes; creating the table takes no lock on ``jobs``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade(*, schema: str) -> None:
    now = sa.text("now()")
    op.add_column("jobs", sa.Column("limit_key", sa.Text(), nullable=True), schema=schema)
    op.add_column("jobs", sa.Column("limit_group", sa.Text(), nullable=True), schema=schema)
    op.create_index(
        "jobs_limit_pending_idx",
        "jobs",
        ["type_name", "limit_group", "priority", "scheduled_at"],
        schema=schema,
        postgresql_where=sa.text("status = 'pending' AND limit_group IS NOT NULL"),
    )
    op.create_index(
        "jobs_limit_running_idx",
        "jobs",
        ["type_name", "limit_group"],
        schema=schema,
        postgresql_where=sa.text("status = 'running' AND limit_group IS NOT NULL"),
    )
    op.create_table(
        "job_limits",
        sa.Column("type_name", sa.Text(), nullable=False),
        sa.Column("limit_key", sa.Text(), nullable=False, server_default=sa.text("''")),
        sa.Column("concurrency", sa.Integer(), nullable=True),
        sa.Column("key_concurrency", sa.Integer(), nullable=True),
        sa.Column("rate_n", sa.Integer(), nullable=True),
        sa.Column("rate_per_s", sa.Float(), nullable=True),
        sa.Column("key_rate_n", sa.Integer(), nullable=True),
        sa.Column("key_rate_per_s", sa.Float(), nullable=True),
        sa.Column("paused_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cursor_key", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
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
        sa.PrimaryKeyConstraint("type_name", "limit_key", name="job_limits_pkey"),
        schema=schema,
    )


def downgrade(*, schema: str) -> None:
    op.drop_table("job_limits", schema=schema)
    op.drop_index("jobs_limit_running_idx", table_name="jobs", schema=schema)
    op.drop_index("jobs_limit_pending_idx", table_name="jobs", schema=schema)
    op.drop_column("jobs", "limit_group", schema=schema)
    op.drop_column("jobs", "limit_key", schema=schema)
