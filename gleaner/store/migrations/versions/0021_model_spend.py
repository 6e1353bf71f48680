"""Daily budgets: what harvest model calls spent per owner and per import and UTC day.

Revision ID: 0021
Revises: 0019
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_spend",
        sa.Column("kind", sa.String(8), primary_key=True),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("day", sa.String(10), primary_key=True),
        sa.Column("calls", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("model_spend")
