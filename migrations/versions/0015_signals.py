"""Signals: chains that wait for a named signal.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29

* ``jobs.wait_signal``: the name of the signal a waiting step waits for
  (``Continue(..., wait_for=...)``); NULL for every other job, and cleared by the match
  that hands the step a signal.
* ``jobs_wait_signal_idx``: waiting steps by name, oldest first (what a match pairs
  signals with). Partial: a job that never waits, or a step that was matched or has
  run, has no entry.
* ``signals``: one row per ``client.signal``, written in the sender's transaction;
  ``consumed_by`` / ``consumed_at`` record the step a match handed it to.
* ``signals_pending_idx`` (pending signals of a name, oldest first: the match and the
  sweep), ``signals_consumed_idx`` (a step's signal, read by its attempts) and
  ``signals_sent_idx`` (by age: pruning).

Adding a nullable column without a default rewrites nothing; the new index on
``jobs`` starts empty (no job waits yet) but is built with a scan of the table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade(*, schema: str) -> None:
    op.add_column("jobs", sa.Column("wait_signal", sa.Text(), nullable=True), schema=schema)
    op.create_index(
        "jobs_wait_signal_idx",
        "jobs",
        ["wait_signal", "id"],
        schema=schema,
        postgresql_where=sa.text("wait_signal IS NOT NULL AND status IN ('blocked', 'pending')"),
    )
    op.create_table(
        "signals",
        sa.Column("id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("payload", pg.JSONB(), nullable=False),
        sa.Column(
            "sent_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")
        ),
        sa.Column("consumed_by", pg.UUID(as_uuid=True), nullable=True),
        sa.Column("consumed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.CheckConstraint(
            "(consumed_by IS NULL) = (consumed_at IS NULL)", name="signals_consumed_whole"
        ),
        schema=schema,
    )
    op.create_index(
        "signals_pending_idx",
        "signals",
        ["name", "id"],
        schema=schema,
        postgresql_where=sa.text("consumed_by IS NULL"),
    )
    op.create_index(
        "signals_consumed_idx",
        "signals",
        ["consumed_by"],
        schema=schema,
        postgresql_where=sa.text("consumed_by IS NOT NULL"),
    )
    op.create_index("signals_sent_idx", "signals", ["sent_at"], schema=schema)


def downgrade(*, schema: str) -> None:
    op.drop_table("signals", schema=schema)
    op.drop_index("jobs_wait_signal_idx", table_name="jobs", schema=schema)
    op.drop_column("jobs", "wait_signal", schema=schema)
