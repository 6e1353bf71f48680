"""Forgetting one conversation: how many times each was forgotten, as a hash only.

``forgotten_conversations`` counts the forgets of one conversation of an owner (keyed by
sha256 of the scope and the conversation id), beside ``forgotten_owners``: a harvest of that
conversation planned before a forget writes nothing when it finishes after it.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "forgotten_conversations",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("forgotten_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("forgotten_conversations")
