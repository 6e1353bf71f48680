"""Note history, and the term index rebuilt over content terms.

``memory_versions`` keeps every note text a change replaced. The similarity term index
(``memory_terms``, ``memories.term_count``) is rebuilt with ``store.notes.terms.similarity_terms``:
stop words out, Snowball stems in, so the stored sets are exactly the ones compared.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# Notes re-indexed per statement batch: bounded memory on a store of millions.
BATCH = 5_000


def upgrade() -> None:
    big_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "memory_versions",
        sa.Column("id", big_id, primary_key=True, autoincrement=True),
        sa.Column(
            "memory_id",
            big_id,
            sa.ForeignKey("memories.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("scope_kind", sa.String(16), nullable=False),
        sa.Column("scope_id", sa.String(255), nullable=False),
        sa.Column("slug", sa.String(120), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("topics", sa.Text(), nullable=False, server_default=""),
        sa.Column("type", sa.String(32)),
        sa.Column("pinned", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("confidence", sa.Float()),
        sa.Column("written_provenance", sa.String(16), nullable=False),
        sa.Column("written_conversation_id", sa.String(255)),
        sa.Column("written_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.String(32), nullable=False),
        sa.Column("changed_provenance", sa.String(16), nullable=False),
        sa.Column("changed_conversation_id", sa.String(255)),
        sa.Column("changed_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_memory_versions_memory", "memory_versions", ["memory_id", "id"])
    _rebuild_terms()


def _rebuild_terms() -> None:
    from gleaner.store.notes.terms import similarity_terms

    bind = op.get_bind()
    after = -1
    while True:
        rows = bind.execute(
            sa.text(
                "SELECT id, scope_kind, scope_id, title, topics FROM memories"
                " WHERE id > :after ORDER BY id LIMIT :n"
            ),
            {"after": after, "n": BATCH},
        ).all()
        if not rows:
            return
        after = rows[-1][0]
        ids = [row[0] for row in rows]
        bind.execute(
            sa.text("DELETE FROM memory_terms WHERE memory_id >= :lo AND memory_id <= :hi"),
            {"lo": ids[0], "hi": ids[-1]},
        )
        terms = {row[0]: sorted(similarity_terms(row[3], row[4] or "")) for row in rows}
        values = [
            {"memory_id": row[0], "term": term, "scope_kind": row[1], "scope_id": row[2]}
            for row in rows
            for term in terms[row[0]]
        ]
        if values:
            bind.execute(
                sa.text(
                    "INSERT INTO memory_terms (memory_id, term, scope_kind, scope_id)"
                    " VALUES (:memory_id, :term, :scope_kind, :scope_id)"
                ),
                values,
            )
        bind.execute(
            sa.text("UPDATE memories SET term_count = :n WHERE id = :id"),
            [{"id": row[0], "n": len(terms[row[0]])} for row in rows],
        )


def downgrade() -> None:
    op.drop_index("ix_memory_versions_memory", table_name="memory_versions")
    op.drop_table("memory_versions")
