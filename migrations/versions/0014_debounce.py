"""Debounced enqueues: a deadline on each debounced chain's root, and one such root per key.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29

* ``jobs.debounce_deadline``: on the root of a chain started with ``Debounce``, its
  first enqueue plus ``max_wait``, the latest a later enqueue of its key may push its
  start to; NULL on every other row. Adding a nullable column without a default
  rewrites nothing.
* ``jobs_debounce_idx``: unique over (chain type, dedup key) among debounced roots
  still pending and never started. The enqueue inserts with ``ON CONFLICT`` on it, so
  concurrent enqueues of one key merge into one job at any isolation level. No row has
  a deadline yet, so the index starts empty; building it reads ``jobs`` once and locks
  it against writes (not reads) meanwhile.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade(*, schema: str) -> None:
    op.add_column(
        "jobs",
        sa.Column("debounce_deadline", sa.DateTime(timezone=True), nullable=True),
        schema=schema,
    )
    op.create_index(
        "jobs_debounce_idx",
        "jobs",
        ["chain_type_name", "dedup_key"],
        unique=True,
        schema=schema,
        postgresql_where=sa.text(
            "debounce_deadline IS NOT NULL AND status = 'pending' AND started_at IS NULL"
        ),
    )


def downgrade(*, schema: str) -> None:
    op.drop_index("jobs_debounce_idx", table_name="jobs", schema=schema)
    op.drop_column("jobs", "debounce_deadline", schema=schema)
