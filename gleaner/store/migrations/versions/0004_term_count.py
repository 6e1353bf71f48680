"""A note's similarity term count, so Jaccard scores are computed in SQL.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


# Plain ALTER TABLE on both databases: a batch (copy-and-move) rebuild on SQLite would drop
# the FTS triggers of the memories table.


def upgrade() -> None:
    op.add_column(
        "memories",
        sa.Column("term_count", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )
    op.execute(
        "UPDATE memories SET term_count = "
        "(SELECT count(*) FROM memory_terms WHERE memory_terms.memory_id = memories.id)"
    )


def downgrade() -> None:
    op.drop_column("memories", "term_count")
