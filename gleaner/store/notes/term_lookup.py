"""Reads of the term index for the near-duplicate lookup (``store.notes.similar``): how many notes
hold each term, the notes holding the rare ones (postings), and which probe terms each
candidate holds."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, text
from sqlalchemy.sql.elements import TextClause

from gleaner.store.schema.models import Memory, MemoryTerm
from gleaner.store.schema.sql import ID_CHUNK, dialect_name, one_of
from gleaner.store.schema.tables import LIVE
from gleaner.store.schemas import Scope

if TYPE_CHECKING:
    from gleaner.store.schema.sql import Executor


# Terms per statement in the frequency and postings lookups: well under SQLite's
# bound-parameter limit.
TERM_CHUNK = 200


@functools.lru_cache(maxsize=256)
def _frequency_statement(count: int, cap: int) -> TextClause:
    """One row: for each of ``count`` terms, how many notes of the scope hold it, capped at
    ``cap``. Each term is its own equality lookup, so every column of the (scope,
    term) index is an index condition whatever the table's statistics say."""
    columns = ", ".join(
        # Only integers are formatted in; every value is a bound parameter.
        f"(SELECT count(*) FROM (SELECT 1 FROM memory_terms WHERE scope_kind = :kind"  # noqa: S608
        f" AND scope_id = :sid AND term = :t{n} LIMIT {int(cap)}) AS c{n})"
        for n in range(count)
    )
    return text(f"SELECT {columns}")


@functools.lru_cache(maxsize=256)
def _postings_statement(count: int) -> TextClause:
    """``(term, memory_id)`` for every note of the scope holding one of ``count`` terms."""
    return text(
        " UNION ALL ".join(
            f"SELECT term, memory_id FROM memory_terms WHERE scope_kind = :kind"  # noqa: S608
            f" AND scope_id = :sid AND term = :t{n}"
            for n in range(count)
        )
    )


# The candidates' shared terms, read through the (memory_id, term) primary key.
_CANDIDATE_TERMS = (
    select(
        Memory.id,
        Memory.slug,
        Memory.title,
        Memory.term_count,
        Memory.pinned,
        Memory.provenance,
        MemoryTerm.term,
    )
    .join(MemoryTerm, MemoryTerm.memory_id == Memory.id)
    .where(
        one_of(Memory.id, "ids"),
        Memory.status == LIVE,
        one_of(MemoryTerm.term, "terms"),
    )
)


def _term_chunks(scope: Scope, terms: Sequence[str]) -> Iterator[tuple[list[str], dict[str, Any]]]:
    """``terms`` in chunks of TERM_CHUNK, each with the parameters of a per-term statement."""
    for start in range(0, len(terms), TERM_CHUNK):
        chunk = list(terms[start : start + TERM_CHUNK])
        params: dict[str, Any] = {"kind": scope.kind, "sid": scope.id}
        params.update({f"t{n}": term for n, term in enumerate(chunk)})
        yield chunk, params


# PostgreSQL takes the terms as one array: one statement text whatever their number, so
# psycopg prepares it once (the per-term forms above are new SQL for every count of terms). The
# correlated subquery keeps each term its own index lookup.
_FREQUENCIES_PG = text(
    "SELECT t.term, (SELECT count(*) FROM (SELECT 1 FROM memory_terms WHERE scope_kind = :kind"
    " AND scope_id = :sid AND term = t.term LIMIT :cap) AS c)"
    " FROM unnest(CAST(:terms AS varchar[])) AS t(term)"
)


_POSTINGS_PG = text(
    "SELECT m.term, m.memory_id FROM unnest(CAST(:terms AS varchar[])) AS t(term)"
    " CROSS JOIN LATERAL (SELECT term, memory_id FROM memory_terms WHERE scope_kind = :kind"
    " AND scope_id = :sid AND term = t.term) AS m"
)


def term_frequencies(
    session: Executor, scope: Scope, terms: Sequence[str], cap: int
) -> dict[str, int]:
    found: dict[str, int] = {}
    if dialect_name(session) == "postgresql":
        params = {"kind": scope.kind, "sid": scope.id, "cap": cap, "terms": list(terms)}
        rows = session.execute(_FREQUENCIES_PG, params).all()
        found.update((str(t), int(n)) for t, n in rows)
        return found
    for chunk, params in _term_chunks(scope, terms):
        row = session.execute(_frequency_statement(len(chunk), cap), params).one()
        found.update({term: int(n) for term, n in zip(chunk, row, strict=True)})
    return found


def term_postings(session: Executor, scope: Scope, terms: Sequence[str]) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {term: set() for term in terms}
    if dialect_name(session) == "postgresql":
        params = {"kind": scope.kind, "sid": scope.id, "terms": list(terms)}
        for term, memory_id in session.execute(_POSTINGS_PG, params):
            found[str(term)].add(int(memory_id))
        return found
    for chunk, params in _term_chunks(scope, terms):
        for term, memory_id in session.execute(_postings_statement(len(chunk)), params):
            found[str(term)].add(int(memory_id))
    return found


@dataclass
class CandidateNote:
    id: int
    slug: str
    title: str
    term_count: int
    pinned: bool
    provenance: str
    terms: set[str]


def candidate_notes(
    session: Executor, ids: Sequence[int], terms: Sequence[str]
) -> dict[int, CandidateNote]:
    """The live notes among ``ids``, each with which of ``terms`` it holds."""
    found: dict[int, CandidateNote] = {}
    for start in range(0, len(ids), ID_CHUNK):
        rows = session.execute(
            _CANDIDATE_TERMS, {"ids": list(ids[start : start + ID_CHUNK]), "terms": list(terms)}
        )
        for note_id, slug, title, term_count, pinned, provenance, term in rows:
            note = found.get(int(note_id))
            if note is None:
                note = found[int(note_id)] = CandidateNote(
                    int(note_id), slug, title, int(term_count), bool(pinned), provenance, set()
                )
            note.terms.add(str(term))
    return found
