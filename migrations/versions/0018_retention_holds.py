"""Retention that keeps dedup windows: the end of a chain's dedup window on its root.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01

* ``jobs.dedup_until``: on a root enqueued with a ``DedupSpec`` that has a window, the
  window's end (``scope="window"``: the enqueue's now plus the window; ``"ever"``:
  infinity). Retention keeps such a chain until then, whatever its type's period, so
  that a key still deduplicates within its window after its chain ended.

The column is nullable without a default and rewrites nothing. Chains enqueued before
this revision carry no window (it was not stored): retention deletes them by their
type's periods alone, as it did for types that declared a retention. Job types that
declare none now have one (``pgwork.retention.DEFAULT_RETENTION``: completed chains a
day after they ended, failed and cancelled ones a week); declare
``retention=Retention.forever()`` to keep a type's chains, those enqueued with
``scope="ever"`` keys before this revision among them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade(*, schema: str) -> None:
    op.add_column(
        "jobs", sa.Column("dedup_until", sa.DateTime(timezone=True), nullable=True), schema=schema
    )


def downgrade(*, schema: str) -> None:
    op.drop_column("jobs", "dedup_until", schema=schema)
