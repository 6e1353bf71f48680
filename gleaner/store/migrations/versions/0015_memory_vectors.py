"""Vectors of notes for optional semantic recall, and what embedding them cost.

``memory_vectors`` holds one vector per note (float32 bytes, the model that made it, the
note's content hash then); ``embedding_usage`` the calls, notes, tokens and dollars of
embedding per model and day. Both start empty: the embedding workers (or `gleaner embed
--backfill`) fill them when GLEANER_EMBED_MODEL is set.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "memory_vectors",
        sa.Column(
            "memory_id",
            BigId,
            sa.ForeignKey("memories.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("scope_kind", sa.String(16), nullable=False),
        sa.Column("scope_id", sa.String(255), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("dimensions", sa.Integer(), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=False),
        sa.Column("embedded_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index(
        "ix_memory_vectors_scope",
        "memory_vectors",
        ["scope_kind", "scope_id", "model", "memory_id"],
    )
    op.create_index(
        "ix_memory_vectors_embedded",
        "memory_vectors",
        ["scope_kind", "scope_id", "model", "embedded_at"],
    )
    op.create_table(
        "embedding_usage",
        sa.Column("model", sa.String(255), primary_key=True),
        sa.Column("day", sa.String(10), primary_key=True),
        sa.Column("calls", sa.Integer(), nullable=False),
        sa.Column("notes", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("embedding_usage")
    op.drop_index("ix_memory_vectors_embedded", table_name="memory_vectors")
    op.drop_index("ix_memory_vectors_scope", table_name="memory_vectors")
    op.drop_table("memory_vectors")
