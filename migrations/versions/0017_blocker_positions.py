"""A job's blockers by position: a listing reads the first few, however many there are.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01

* ``job_blockers_position_idx`` on ``job_blockers (job_id, position)``. The primary key
  orders a job's edges by blocker id; a listing of blocked jobs shows the first few of
  each in declaration order (a step may wait for 10,000 children), and a job's blockers
  are paged by position. Without this index each reads and sorts every edge of the job.
  It costs one index entry an edge, written with the edge.

Building the index locks ``job_blockers`` against writes (not reads) for the time it
takes; it reads one row an edge.
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade(*, schema: str) -> None:
    op.create_index(
        "job_blockers_position_idx", "job_blockers", ["job_id", "position"], schema=schema
    )


def downgrade(*, schema: str) -> None:
    op.drop_index("job_blockers_position_idx", table_name="job_blockers", schema=schema)
