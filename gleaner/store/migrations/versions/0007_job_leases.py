"""Job leases: who claimed a running job, its heartbeat, and how often its worker was lost.

A job ``running`` whose ``heartbeat_at`` is older than GLEANER_JOB_LEASE_SECONDS has lost its
worker; the sweep puts it back to ``pending`` (or fails it after GLEANER_JOB_MAX_CRASHES).
Jobs already ``running`` when this runs get their start as their last heartbeat, so a job
orphaned before the upgrade is recovered by the first sweep after it.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# Plain ALTER TABLE on both databases (nullable columns, or a server default): no batch
# rebuild of the jobs table on SQLite.
COLUMNS = ("heartbeat_at", "lease_token", "claimed_by", "crashes")


def upgrade() -> None:
    op.add_column(
        "jobs", sa.Column("crashes", sa.Integer(), nullable=False, server_default=sa.text("0"))
    )
    op.add_column("jobs", sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("jobs", sa.Column("lease_token", sa.String(64), nullable=True))
    op.add_column("jobs", sa.Column("claimed_by", sa.String(255), nullable=True))
    op.execute(
        "UPDATE jobs SET heartbeat_at = COALESCE(started_at, enqueued_at) WHERE state = 'running'"
    )


def downgrade() -> None:
    for column in COLUMNS:
        op.drop_column("jobs", column)
