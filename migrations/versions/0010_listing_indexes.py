"""Listings read only what they show: chains tied on creation time, failed jobs by id.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28

Two dashboard listings read far more rows than they showed while workers ran:

* ``jobs_chains_idx`` gains ``id`` after ``created_at``. Chain listings page newest
  first by ``(created_at, id)``; with ``created_at`` last, every chain enqueued in one
  transaction (one ``created_at``) had to be read and sorted before the first row of
  the page, a hundred thousand rows for a bulk enqueue that size. With ``id`` in the
  index each (type, status) range is read in page order and stops at the page's end.
  It costs no entry more: the index holds the same root rows, each 16 bytes wider.
* ``jobs_failed_idx`` holds the failed jobs by id. Job listings page newest first by
  id; filtered on ``failed`` they walked the primary key backwards past every newer
  job that had not failed (the completions of a busy worker) to fill a page. A job
  enters the index only when it fails for good: the enqueue, the claim, renewals and
  completions write nothing into it.

Each new index is built before the one it replaces is dropped; building one locks the
table against writes (not reads) for the time it takes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_ROOTS = "id = chain_id AND status <> 'running'"


def _rebuild_chains_index(schema: str, columns: list[str]) -> None:
    """``jobs_chains_idx`` again over ``columns``, built before the old one is dropped."""
    op.create_index(
        "jobs_chains_idx_next",
        "jobs",
        columns,
        schema=schema,
        postgresql_where=sa.text(_ROOTS),
    )
    op.drop_index("jobs_chains_idx", table_name="jobs", schema=schema)
    op.execute(f'ALTER INDEX "{schema}".jobs_chains_idx_next RENAME TO jobs_chains_idx')


def upgrade(*, schema: str) -> None:
    _rebuild_chains_index(schema, ["chain_type_name", "chain_status", "created_at", "id"])
    op.create_index(
        "jobs_failed_idx",
        "jobs",
        ["id"],
        schema=schema,
        postgresql_where=sa.text("status = 'failed'"),
    )


def downgrade(*, schema: str) -> None:
    op.drop_index("jobs_failed_idx", table_name="jobs", schema=schema)
    _rebuild_chains_index(schema, ["chain_type_name", "chain_status", "created_at"])
