"""Flow limits: the attempts started of types with a rate.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29

* ``job_starts``: one row per attempt of a type that declares ``rate`` or ``key_rate``,
  written by the acquire that leased it (its type, its limit group, the moment on the
  database's clock, taken under the type's lock). The acquire counts the rows of the
  last window to know how many more may start, and deletes those older than the
  type's longest window: the table holds about one window of starts per rated type.
  Types without a rate write nothing here.
* ``job_starts_type_idx`` and ``job_starts_group_idx``: a type's starts, and one
  group's, in time order: the count of a window is one index range.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade(*, schema: str) -> None:
    op.create_table(
        "job_starts",
        sa.Column("type_name", sa.Text(), nullable=False),
        sa.Column("limit_group", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        schema=schema,
    )
    op.create_index("job_starts_type_idx", "job_starts", ["type_name", "started_at"], schema=schema)
    op.create_index(
        "job_starts_group_idx",
        "job_starts",
        ["type_name", "limit_group", "started_at"],
        schema=schema,
    )


def downgrade(*, schema: str) -> None:
    op.drop_table("job_starts", schema=schema)
