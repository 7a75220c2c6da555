"""Blocker failure policy per edge; chains someone awaits.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22

``job_blockers.on_failure`` records, when the job is enqueued, what happens to it if
the blocker chain fails or is cancelled, so the database can resolve dependants in
the transaction that ends the blocker without asking the application. ``jobs.
chain_awaited`` (root rows) is set by ``await_chain`` so only awaited chains cost a
notification when they end. ``jobs.chain_has_dependants`` (root rows) is written by
the transaction that enqueues a job blocked on the chain: writing the row (not only
locking it) makes a concurrent completion of the chain, which waits for that row, read
the flag from the newest row version and resolve the new dependant — a plain EXISTS in
the completing statement would look at its older snapshot and miss it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade(*, schema: str) -> None:
    op.add_column(
        "job_blockers",
        sa.Column("on_failure", sa.Text(), nullable=False, server_default=sa.text("'fail'")),
        schema=schema,
    )
    op.create_check_constraint(
        "job_blockers_on_failure_known",
        "job_blockers",
        "on_failure IN ('fail', 'cancel', 'unblock')",
        schema=schema,
    )
    op.add_column(
        "jobs",
        sa.Column("chain_awaited", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        schema=schema,
    )
    op.add_column(
        "jobs",
        sa.Column(
            "chain_has_dependants", sa.Boolean(), nullable=False, server_default=sa.text("false")
        ),
        schema=schema,
    )

    # Listing jobs newest first (keyset pagination) without reading the whole table.
    op.create_index("jobs_created_idx", "jobs", ["created_at", "id"], schema=schema)


def downgrade(*, schema: str) -> None:
    op.drop_index("jobs_created_idx", table_name="jobs", schema=schema)
    op.drop_column("jobs", "chain_has_dependants", schema=schema)
    op.drop_column("jobs", "chain_awaited", schema=schema)
    op.drop_constraint("job_blockers_on_failure_known", "job_blockers", schema=schema)
    op.drop_column("job_blockers", "on_failure", schema=schema)
