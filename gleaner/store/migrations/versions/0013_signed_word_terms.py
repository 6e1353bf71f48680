"""A word's sign and a number's groups are kept in its term: ``c++``, ``c#``, ``3.10.10``,
``v2.0.2``, ``1,000,000``, ``10:30``, ``-18``.

Before, ``C++``, ``C#`` and ``C`` were all the term ``c`` and ``3.10.10`` the terms ``3`` and
``10``, so two notes differing only there were the same fact (the newer hid the older). The
notes whose title or topics hold a ``+``, a ``#`` or a digit after ``.``, ``,``, ``:`` or ``-`` get
their ``memory_terms`` and ``memories.term_count`` rebuilt with
``store.notes.terms.similarity_terms`` (a note among them whose terms do not change is written as it
was); every other note's terms are as that function gives them already.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

# Notes read per statement: bounded memory on a store of millions.
BATCH = 5_000
# The notes whose terms may change (a cheap first test, as store.notes.terms makes it).
_SIGNED = re.compile(r"[+#]|[.,:-]\d")


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
        changed = [row for row in rows if _SIGNED.search(f"{row[3]} {row[4] or ''}")]
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
    # The terms stay as this revision made them: the earlier code looks a note's twins up by
    # its own terms, so it finds fewer twins for these notes (a note kept twice), never a
    # wrong one (the same-fact rule reads the notes' text, not these rows).
    pass
