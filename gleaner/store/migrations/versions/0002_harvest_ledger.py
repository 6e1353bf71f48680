"""The harvest ledger: one row per harvested transcript, for exactly-once harvesting.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "harvest_ledger",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("scope_kind", sa.String(16), nullable=False),
        sa.Column("scope_id", sa.String(255), nullable=False),
        sa.Column("transcript_hash", sa.String(64), nullable=False),
        sa.Column("harvester_version", sa.String(255), nullable=False),
        sa.Column("conversation_id", sa.String(255), nullable=True),
        sa.Column("provenance", sa.String(16), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("notes_written", sa.Integer(), nullable=False),
        sa.Column("notes_updated", sa.Integer(), nullable=False),
        sa.Column("notes_skipped", sa.Integer(), nullable=False),
        sa.Column("items_dropped", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("model_calls", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint(
            "scope_kind",
            "scope_id",
            "transcript_hash",
            "harvester_version",
            name="uq_harvest_ledger_transcript",
        ),
    )


def downgrade() -> None:
    op.drop_table("harvest_ledger")
