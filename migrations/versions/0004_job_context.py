"""Jobs carry a logging context given at enqueue.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25

``jobs.context``: a small string-to-string map (a request id, a tenant) given to
``start_chain(context=...)``, inherited by the chain's continuations and bound to every
log line of each attempt. Kept apart from ``trace_context``, which carries
OpenTelemetry's propagation headers and is not meant for people to read.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade(*, schema: str) -> None:
    # Nullable without a default: adding it rewrites nothing, even on a large table.
    op.add_column("jobs", sa.Column("context", pg.JSONB(), nullable=True), schema=schema)


def downgrade(*, schema: str) -> None:
    op.drop_column("jobs", "context", schema=schema)
