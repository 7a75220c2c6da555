"""Flow limits: remember that a worker waits for room in a limited type.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29

* ``job_limits.waiting_since``: set by an acquire that came back short while jobs of
  the type it could not start were left pending (its worker now sleeps until told);
  cleared by the next acquire of the type that finds room left, whose worker then
  announces the type's jobs as ready. An attempt that ends where nobody waits
  announces nothing.

Adding a nullable column without a default rewrites nothing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade(*, schema: str) -> None:
    op.add_column(
        "job_limits",
        sa.Column("waiting_since", sa.DateTime(timezone=True), nullable=True),
        schema=schema,
    )


def downgrade(*, schema: str) -> None:
    op.drop_column("job_limits", "waiting_since", schema=schema)
