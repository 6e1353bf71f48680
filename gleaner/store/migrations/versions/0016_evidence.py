"""Evidence and time order: what a note rests on, and when each version was said.

``memories.evidence`` and ``memory_versions.evidence`` hold a note's evidence (one or two
short verbatim quotes from its conversation, each with who said it), kept with the text it
grounds; ``memory_versions.occurred_at`` is when a replaced version's fact was said, so
history is ordered by it. All start empty (NULL): notes from before have no evidence.
``harvest_ledger.items_ungrounded`` counts the candidates a harvest dropped because their
evidence was not in the transcript.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("memories", sa.Column("evidence", sa.JSON(), nullable=True))
    op.add_column("memory_versions", sa.Column("evidence", sa.JSON(), nullable=True))
    op.add_column(
        "memory_versions", sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column(
        "harvest_ledger",
        sa.Column("items_ungrounded", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )


def downgrade() -> None:
    op.drop_column("harvest_ledger", "items_ungrounded")
    op.drop_column("memory_versions", "occurred_at")
    op.drop_column("memory_versions", "evidence")
    op.drop_column("memories", "evidence")
