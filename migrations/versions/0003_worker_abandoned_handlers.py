"""Workers report the handlers they gave up on that still run.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24

``workers.abandoned_handlers``: handlers the worker abandoned (they ignored
cancellation past ``abandon_after``) whose coroutines have not ended yet. Their slots
and connections were given back, but each one may still hold memory or a thread, and
an operator should see them (``pgwork workers``) before they pile up.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade(*, schema: str) -> None:
    op.add_column(
        "workers",
        sa.Column("abandoned_handlers", sa.Integer(), nullable=False, server_default=sa.text("0")),
        schema=schema,
    )


def downgrade(*, schema: str) -> None:
    op.drop_column("workers", "abandoned_handlers", schema=schema)
