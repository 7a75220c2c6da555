"""Fan-out: steps blocked on children, settled by counters.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-30

* ``jobs.blockers_needed`` / ``blockers_met`` / ``blockers_open``: a blocked job's count
  of its blockers (how many must be met, how many are, how many have not ended). Each
  blocker's end adds to them and reads none of the job's other edges, so a step waiting
  for 10,000 children costs each child's end one edge and one row.
* ``job_blockers.counted``: how the edge was counted (NULL while its chain runs, 'met'
  or 'failed'), so that settling one end twice counts it once.
* ``job_blockers.position`` becomes an integer: a fan-out may have more than 32,767
  children.

The integer rewrites ``job_blockers`` (one row per edge) under an exclusive lock; the
new columns of ``jobs`` are nullable without a default and rewrite nothing. Edges of
jobs released already (pending, running, failed) are counted from their chains'
status now, so a job released before the upgrade reads its blockers' outputs as it
did. A job still blocked gets counters with every edge open; the workers' blocker
sweep then counts its ended blockers (a job whose blockers ended meanwhile is settled
by that sweep, within its interval of a worker's start).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade(*, schema: str) -> None:
    for column in ("blockers_needed", "blockers_met", "blockers_open"):
        op.add_column("jobs", sa.Column(column, sa.Integer(), nullable=True), schema=schema)
    op.add_column("job_blockers", sa.Column("counted", sa.Text(), nullable=True), schema=schema)
    op.create_check_constraint(
        "job_blockers_counted_known",
        "job_blockers",
        "counted IN ('met', 'failed')",
        schema=schema,
    )
    op.alter_column(
        "job_blockers",
        "position",
        type_=sa.Integer(),
        existing_type=sa.SmallInteger(),
        existing_nullable=False,
        schema=schema,
    )
    jobs = f'"{schema}".jobs'
    edges = f'"{schema}".job_blockers'
    op.execute(
        f"""
        UPDATE {edges} AS b
        SET counted = v.counted
        FROM (
            SELECT e.job_id, e.blocker_chain_id,
                CASE WHEN r.id IS NULL OR r.chain_status = 'completed' THEN 'met'
                     WHEN r.chain_status = 'active' THEN NULL
                     WHEN e.on_failure = 'unblock' THEN 'met'
                     ELSE 'failed' END AS counted
            FROM {edges} AS e
            JOIN {jobs} AS d ON d.id = e.job_id
            LEFT JOIN {jobs} AS r ON r.id = e.blocker_chain_id AND r.id = r.chain_id
            WHERE d.status IN ('pending', 'running', 'failed')
        ) AS v
        WHERE b.job_id = v.job_id AND b.blocker_chain_id = v.blocker_chain_id
          AND v.counted IS NOT NULL
        """
    )
    op.execute(
        f"""
        UPDATE {jobs} AS d
        SET blockers_needed = t.total, blockers_met = 0, blockers_open = t.total
        FROM (SELECT e.job_id, count(*) AS total FROM {edges} AS e GROUP BY e.job_id) AS t
        WHERE d.id = t.job_id AND d.status = 'blocked'
        """
    )


def downgrade(*, schema: str) -> None:
    op.alter_column(
        "job_blockers",
        "position",
        type_=sa.SmallInteger(),
        existing_type=sa.Integer(),
        existing_nullable=False,
        schema=schema,
    )
    op.drop_constraint("job_blockers_counted_known", "job_blockers", schema=schema)
    op.drop_column("job_blockers", "counted", schema=schema)
    for column in ("blockers_open", "blockers_met", "blockers_needed"):
        op.drop_column("jobs", column, schema=schema)
