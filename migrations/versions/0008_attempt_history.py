"""A history of each job's failed attempts, so an operator sees what every retry hit.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28

A job kept only the error of its last attempt: what attempts 1 to 4 failed with was
gone by the time the fifth ran. ``attempt_history`` holds the failed attempts as a
JSON array, oldest first: attempt number, when, the worker, how long the handler ran
(when the worker said so) and the error, its traceback cut to its end. The statements
that end an attempt with an error (the failure and the reap) append to it and keep the
newest ``pgwork.records.ATTEMPT_HISTORY_LIMIT`` entries; nothing else writes it, so a
job that never fails holds NULL, and completions, claims and renewals leave the value
as it is (stored out of line once large, it is not even copied by them).

Adding a nullable column without a default rewrites nothing: it is a catalog change,
done under a brief exclusive lock. Existing jobs start with no history.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade(*, schema: str) -> None:
    op.add_column("jobs", sa.Column("attempt_history", pg.JSONB(), nullable=True), schema=schema)


def downgrade(*, schema: str) -> None:
    op.drop_column("jobs", "attempt_history", schema=schema)
