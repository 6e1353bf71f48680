"""Each job keeps its transcript's hash, so forgetting its owner tombstones it unrun too.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTER TABLE on both databases; jobs recorded before have none (NULL).
    op.add_column("jobs", sa.Column("transcript_hash", sa.String(64), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "transcript_hash")
