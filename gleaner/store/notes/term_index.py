"""The term index (``memory_terms``): each note's similarity terms, written beside the note
in the same transaction, so duplicate lookups walk postings instead of every note."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from sqlalchemy import Table, insert, text

from gleaner.store.schema.models import MemoryTerm
from gleaner.store.schema.sql import dialect_name
from gleaner.store.schemas import Scope

if TYPE_CHECKING:
    from gleaner.store.schema.sql import Executor

_TERMS = cast(Table, MemoryTerm.__table__)
# PostgreSQL: every row in one statement (arrays unnested side by side), not one per row.
_UNNEST_TERMS = text(
    "INSERT INTO memory_terms (memory_id, term, scope_kind, scope_id)"
    " SELECT unnest(CAST(:ids AS bigint[])), unnest(CAST(:terms AS varchar[])), :kind, :sid"
)


def insert_terms(session: Executor, scope: Scope, rows: Sequence[tuple[int, str]]) -> None:
    """Add ``(memory_id, term)`` rows of the scope to the term index."""
    if not rows:
        return
    if dialect_name(session) == "postgresql":
        session.execute(
            _UNNEST_TERMS,
            {
                "ids": [memory_id for memory_id, _ in rows],
                "terms": [term for _, term in rows],
                "kind": scope.kind,
                "sid": scope.id,
            },
        )
        return
    session.execute(
        insert(_TERMS),
        [
            {"memory_id": memory_id, "term": term, "scope_kind": scope.kind, "scope_id": scope.id}
            for memory_id, term in rows
        ],
    )
