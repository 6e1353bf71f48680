"""Words of over 64 characters become terms (their start and a digest of the whole).

Before, such a word (a token, a long identifier) was no term at all, so two notes differing
only in one were the same fact. The notes holding one in their title or topics get their
``memory_terms`` and ``memories.term_count`` rebuilt with ``store.notes.terms.similarity_terms``;
every other note's terms are as that function gives them already.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# Notes read per statement: bounded memory on a store of millions.
BATCH = 5_000
# A run of over 64 word characters: the notes whose terms change (a cheap first test).
_LONG_WORD = re.compile(r"\w{65}")


def upgrade() -> None:
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
        changed = [row for row in rows if _LONG_WORD.search(f"{row[3]} {row[4] or ''}")]
        for note_id, kind, scope_id, title, topics in changed:
            terms = sorted(similarity_terms(title, topics or ""))
            bind.execute(sa.text("DELETE FROM memory_terms WHERE memory_id = :id"), {"id": note_id})
            if terms:
                bind.execute(
                    sa.text(
                        "INSERT INTO memory_terms (memory_id, term, scope_kind, scope_id)"
                        " VALUES (:memory_id, :term, :scope_kind, :scope_id)"
                    ),
                    [
                        {"memory_id": note_id, "term": t, "scope_kind": kind, "scope_id": scope_id}
                        for t in terms
                    ],
                )
            bind.execute(
                sa.text("UPDATE memories SET term_count = :n WHERE id = :id"),
                {"id": note_id, "n": len(terms)},
            )


def downgrade() -> None:
    # The earlier rule had no term for a long word: its terms are the only ones with a "#".
    op.execute(
        "UPDATE memories SET term_count = term_count - (SELECT count(*) FROM memory_terms AS t"
        " WHERE t.memory_id = memories.id AND t.term LIKE '%#%')"
        " WHERE id IN (SELECT memory_id FROM memory_terms WHERE term LIKE '%#%')"
    )
    op.execute("DELETE FROM memory_terms WHERE term LIKE '%#%'")
