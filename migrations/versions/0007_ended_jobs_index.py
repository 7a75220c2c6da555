"""An index of ended jobs by end time, so the last hour is counted, not sampled.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28

The dashboard's "last hour" counted completions among the newest 20,000 jobs by
creation: past that many jobs an hour, the oldest minutes of the hour drew empty bars
while thousands of jobs completed in them, a false outage. ``jobs_ended_idx`` holds the
completed and failed jobs by ``completed_at`` (with queue and status, so the count
reads the index alone where the visibility map allows): the hour is one index range,
counted exactly.

It costs one index entry per job, written by its completion (or its failure for
good); the enqueue, the claim and lease renewals match its predicate in no row
version, so they write none. Building it locks the table against writes (not reads)
for the time it takes, about a second per million ended jobs.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade(*, schema: str) -> None:
    op.create_index(
        "jobs_ended_idx",
        "jobs",
        ["completed_at", "queue", "status"],
        schema=schema,
        postgresql_where=sa.text("status IN ('completed', 'failed')"),
    )


def downgrade(*, schema: str) -> None:
    op.drop_index("jobs_ended_idx", table_name="jobs", schema=schema)
