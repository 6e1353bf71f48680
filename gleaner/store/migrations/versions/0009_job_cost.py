"""What each job cost the model, every run summed, failed runs included.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

COLUMNS = ("model_calls", "prompt_tokens", "completion_tokens")


def upgrade() -> None:
    # Plain ALTER TABLE on both databases (no SQLite table rebuild).
    for name in COLUMNS:
        op.add_column(
            "jobs", sa.Column(name, sa.Integer(), nullable=False, server_default=sa.text("0"))
        )


def downgrade() -> None:
    for name in reversed(COLUMNS):
        op.drop_column("jobs", name)
