"""The history of ended jobs: per-bucket counts and durations that outlive retention.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28

The dashboard saw one hour back (an index range of ``jobs_ended_idx``), and retention
deleted the rest. ``job_history`` holds, per bucket of end time, queue and job type
(and per queue, and in all, under the name ''), how many jobs completed and failed and
how long they waited and ran (count, sum, maximum and a histogram of fixed bins);
``job_history_progress`` holds how far that count has reached. The worker's
maintenance fills them from ``jobs_ended_idx``; no statement of the enqueue, the claim
or the completion writes them.

The progress row starts at ``-infinity``: the first rollups count the ended jobs the
table still holds (within the history's keep period), oldest first, a batch at a time.
Creating the two tables takes no lock on ``jobs``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade(*, schema: str) -> None:
    zero = sa.text("0")
    now = sa.text("now()")
    op.create_table(
        "job_history",
        sa.Column("bucket_seconds", sa.Integer(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("type_name", sa.Text(), nullable=False),
        sa.Column("bucket_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("completed", sa.BigInteger(), nullable=False, server_default=zero),
        sa.Column("failed", sa.BigInteger(), nullable=False, server_default=zero),
        sa.Column("wait_count", sa.BigInteger(), nullable=False, server_default=zero),
        sa.Column("wait_sum_s", sa.Float(), nullable=False, server_default=zero),
        sa.Column("wait_max_s", sa.Float(), nullable=False, server_default=zero),
        sa.Column("wait_hist", pg.ARRAY(sa.BigInteger()), nullable=False),
        sa.Column("run_count", sa.BigInteger(), nullable=False, server_default=zero),
        sa.Column("run_sum_s", sa.Float(), nullable=False, server_default=zero),
        sa.Column("run_max_s", sa.Float(), nullable=False, server_default=zero),
        sa.Column("run_hist", pg.ARRAY(sa.BigInteger()), nullable=False),
        sa.CheckConstraint("bucket_seconds > 0", name="job_history_bucket_positive"),
        sa.PrimaryKeyConstraint(
            "bucket_seconds", "queue", "type_name", "bucket_start", name="job_history_pkey"
        ),
        schema=schema,
    )
    op.create_table(
        "job_history_progress",
        sa.Column("singleton", sa.Boolean(), nullable=False, server_default=sa.text("true")),
        sa.Column("rolled_up_to", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.CheckConstraint("singleton", name="job_history_progress_one_row"),
        sa.PrimaryKeyConstraint("singleton", name="job_history_progress_pkey"),
        schema=schema,
    )
    progress = sa.table("job_history_progress", sa.column("rolled_up_to"), schema=schema)
    op.execute(progress.insert().values(rolled_up_to=sa.text("'-infinity'::timestamptz")))


def downgrade(*, schema: str) -> None:
    op.drop_table("job_history_progress", schema=schema)
    op.drop_table("job_history", schema=schema)
