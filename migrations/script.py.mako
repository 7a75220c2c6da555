"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}

Frozen history: write explicit ``op.`` calls with every name spelled out, never import
pgwork's current MetaData. The schema name arrives as the ``schema`` argument; pass it to
every operation and quote it (``op.f`` / SQLAlchemy do) in any raw SQL.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
${imports if imports else ""}
revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade(*, schema: str) -> None:
    ${upgrades if upgrades else "pass"}


def downgrade(*, schema: str) -> None:
    ${downgrades if downgrades else "pass"}
