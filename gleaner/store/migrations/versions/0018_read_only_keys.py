"""Read-only API keys: a key that searches and reads but cannot submit, pin, delete or forget.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ALTER TABLE on both databases (a server default): every key made before this
    # revision could write, and keeps doing so.
    op.add_column(
        "api_keys",
        sa.Column("read_only", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    op.drop_column("api_keys", "read_only")
