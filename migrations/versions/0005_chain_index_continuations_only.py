"""A chain's index holds its continuations only; its root is found by primary key.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24

``jobs_chain_idx`` (chain_id, chain_index) had an entry for every row version of every
job. Most chains are one job, their root, whose ``id`` is its ``chain_id``: the primary
key finds that row already, so the index entry was a second copy of the key. Every
state change of a job writes a new row version (status is in the partial indexes'
predicates, so no update of a job's state is HOT), and each version cost an entry here
too: three per one-job chain (enqueue, claim, completion), about a fifth of the index
entries and 15 % of the WAL a job writes (``python -m bench.indexes``, figures in
docs/performance.md). The index now covers continuations (``id <> chain_id``); reads of
a chain's jobs take the root by primary key and the rest from this index. Uniqueness of
(chain_id, chain_index) still holds: a root is unique by its primary key, it is a
chain's only row at index 0 (continuations are numbered from 1), and continuations are
unique here.

The new index is built before the old one is dropped, so the table keeps an index on
chains throughout; building it locks the table against writes (not reads) for the
time it takes, about a second per million continuation rows.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade(*, schema: str) -> None:
    op.create_index(
        "jobs_chain_idx_new",
        "jobs",
        ["chain_id", "chain_index"],
        unique=True,
        schema=schema,
        postgresql_where=sa.text("id <> chain_id"),
    )
    op.drop_index("jobs_chain_idx", table_name="jobs", schema=schema)
    op.execute(f'ALTER INDEX "{schema}".jobs_chain_idx_new RENAME TO jobs_chain_idx')


def downgrade(*, schema: str) -> None:
    op.create_index(
        "jobs_chain_idx_old", "jobs", ["chain_id", "chain_index"], unique=True, schema=schema
    )
    op.drop_index("jobs_chain_idx", table_name="jobs", schema=schema)
    op.execute(f'ALTER INDEX "{schema}".jobs_chain_idx_old RENAME TO jobs_chain_idx')
