"""Jobs and imports (the record of all queued work) and housekeeping watermarks.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "imports",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("provenance", sa.String(16), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("unreadable", sa.Integer(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("queue", sa.String(32), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("provenance", sa.String(16), nullable=False),
        sa.Column("conversation_id", sa.String(255), nullable=False),
        sa.Column("transcript", sa.JSON(), nullable=False),
        sa.Column(
            "import_id",
            sa.String(32),
            sa.ForeignKey("imports.id", ondelete="CASCADE"),
            nullable=True,
        ),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("enqueued_at", TS, nullable=False),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("finished_at", TS, nullable=True),
    )
    op.create_index("ix_jobs_state_enqueued", "jobs", ["state", "enqueued_at"])
    op.create_index("ix_jobs_import_state", "jobs", ["import_id", "state"])
    op.create_table(
        "housekeeping_state",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("watermark", sa.BigInteger(), nullable=False),
        sa.Column("last_run_at", TS, nullable=True),
        sa.Column("last_result", sa.JSON(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("housekeeping_state")
    op.drop_index("ix_jobs_import_state", table_name="jobs")
    op.drop_index("ix_jobs_state_enqueued", table_name="jobs")
    op.drop_table("jobs")
    op.drop_table("imports")
