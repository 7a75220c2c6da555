"""Fewer index entries per state change: no creation-time index, no running roots.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24

No update of a job's state is HOT (``status`` is in partial indexes' predicates), so
every claim, completion and lease renewal writes one entry into each index whose
predicate the new row version matches. For a one-job chain that was eleven entries:
four at enqueue, four at the claim, three at the completion (``python -m
bench.indexes``, figures in docs/performance.md). Two of them go:

* ``jobs_created_idx`` (created_at, id) is dropped. Job ids are UUIDv7, time-ordered
  and unique, so the primary key already reads jobs newest first; job listings now
  page by id. One entry fewer at enqueue, claim and completion.
* ``jobs_chains_idx`` leaves out a root while it runs (``status <> 'running'``). The
  running jobs are the few rows of ``jobs_lease_expiry_idx`` (at most the workers'
  slots), which chain listings read beside this index, so the claim of a chain's root
  and each renewal of its lease write no entry here.

The new chains index is built before the old one is dropped, so the table keeps an
index on chains throughout; building it locks the table against writes (not reads)
for the time it takes (0.4 s for a million chains on the benchmark machine).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def _rebuild_chains_index(schema: str, where: str) -> None:
    """``jobs_chains_idx`` again over ``where``, built before the old one is dropped."""
    op.create_index(
        "jobs_chains_idx_next",
        "jobs",
        ["chain_type_name", "chain_status", "created_at"],
        schema=schema,
        postgresql_where=sa.text(where),
    )
    op.drop_index("jobs_chains_idx", table_name="jobs", schema=schema)
    op.execute(f'ALTER INDEX "{schema}".jobs_chains_idx_next RENAME TO jobs_chains_idx')


def upgrade(*, schema: str) -> None:
    _rebuild_chains_index(schema, "id = chain_id AND status <> 'running'")
    op.drop_index("jobs_created_idx", table_name="jobs", schema=schema)


def downgrade(*, schema: str) -> None:
    op.create_index("jobs_created_idx", "jobs", ["created_at", "id"], schema=schema)
    _rebuild_chains_index(schema, "id = chain_id")
