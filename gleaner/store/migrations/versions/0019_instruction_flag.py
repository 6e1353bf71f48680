"""Notes marked as data: ``memories.flag`` says a note reads as an instruction to the assistant.

``memories.flag`` is ``instruction`` for a note whose title or body reads as an instruction
(``store.notes.instructions``), else NULL; notes already stored are checked here once.
``harvest_ledger.items_instructions`` counts a harvest's candidates that read so (flagged, or
dropped under ``GLEANER_INSTRUCTION_NOTES=drop``).

Revision ID: 0019
Revises: 0017 (0018 comes in between once merged)
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# Notes read per statement: bounded memory on a store of millions.
BATCH = 5_000


def upgrade() -> None:
    from gleaner.store.notes.instructions import instruction_flag

    op.add_column("memories", sa.Column("flag", sa.String(32), nullable=True))
    op.add_column(
        "harvest_ledger",
        sa.Column("items_instructions", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )
    bind = op.get_bind()
    after = -1
    while True:
        rows = bind.execute(
            sa.text("SELECT id, title, body FROM memories WHERE id > :after ORDER BY id LIMIT :n"),
            {"after": after, "n": BATCH},
        ).all()
        if not rows:
            return
        after = rows[-1][0]
        flagged = [
            {"id": note_id, "flag": flag}
            for note_id, title, body in rows
            if (flag := instruction_flag(title, body)) is not None
        ]
        if flagged:
            bind.execute(sa.text("UPDATE memories SET flag = :flag WHERE id = :id"), flagged)


def downgrade() -> None:
    op.drop_column("harvest_ledger", "items_instructions")
    op.drop_column("memories", "flag")
