"""Forget leaves tombstones: forgotten transcripts and owners, as hashes only.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "forgotten_transcripts",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("owner_key", sa.String(64), nullable=False),
        sa.Column("forgotten_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_forgotten_transcripts_owner", "forgotten_transcripts", ["owner_key"])
    op.create_table(
        "forgotten_owners",
        sa.Column("owner_key", sa.String(64), primary_key=True),
        sa.Column("generation", sa.Integer(), nullable=False, server_default=sa.text("1")),
        sa.Column("forgotten_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("forgotten_owners")
    op.drop_index("ix_forgotten_transcripts_owner", table_name="forgotten_transcripts")
    op.drop_table("forgotten_transcripts")
