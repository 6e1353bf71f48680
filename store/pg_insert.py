"""PostgreSQL: a batch of new notes, their term rows and search postings in one statement.

The rows travel as one JSON array of value arrays (``jsonb_array_elements``), so the statement's
text is the same for any batch size: psycopg prepares it once and the server plans it once,
and neither SQLAlchemy's multi-row VALUES nor a second round trip for the terms is paid on
the harvest's hot path. A slug a concurrent writer took is skipped (``ON CONFLICT DO
NOTHING``), as the SQLAlchemy INSERT does, and so are its terms.

``insert_notes_at_commit`` sends the same statement with the transaction's COMMIT, in its
round trip (``store.prepared.later``), without ``ON CONFLICT DO NOTHING``: a slug or topic
key another writer took since the lookup breaks its unique key there, and the whole
transaction rolls back (``SlugTaken``) instead of skipping the note.

What is stored is what ``store.writer``'s SQLAlchemy INSERT stores (tests compare the rows
column by column): a ``None`` source is the JSON ``null``, as the ``JSON`` column type writes
it, and ``updated_seq`` comes from the sequence, in the batch's order.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import JSON, TextClause, text
from sqlalchemy.dialects import postgresql

from store import prepared
from store.errors import SlugTaken
from store.schemas import Scope
from store.search_index import Postings
from store.tables import MEMORIES

if TYPE_CHECKING:
    from store.sql import Executor


def insert_notes(
    session: Executor,
    scope: Scope,
    rows: Sequence[Mapping[str, Any]],
    terms: Mapping[str, Sequence[str]],
    postings: Mapping[str, Postings],
) -> dict[str, Any]:
    """Insert ``rows`` (every column but ``id`` and ``updated_seq``, the same keys in each)
    and each inserted row's ``terms`` and search ``postings`` (by slug); returns the ``(id,
    slug)`` rows inserted, by slug (a slug missing from it was taken meanwhile)."""
    columns = tuple(rows[0])
    found = prepared.execute(
        session, _statement(columns), _params(scope, columns, rows, terms, postings)
    )
    return {row.slug: row for row in found}


def insert_notes_at_commit(
    session: Executor,
    scope: Scope,
    rows: Sequence[Mapping[str, Any]],
    terms: Mapping[str, Sequence[str]],
    postings: Mapping[str, Postings],
) -> None:
    """``insert_notes`` with the COMMIT of ``session``'s transaction (one
    ``store.prepared.begin`` opened): every row is inserted then, or the transaction rolls
    back and its end raises ``SlugTaken`` (a slug or topic key was taken meanwhile)."""
    columns = tuple(rows[0])
    prepared.later(
        session,
        _statement(columns, strict=True),
        _params(scope, columns, rows, terms, postings),
        conflict=lambda: SlugTaken(
            f"a slug or topic key of {len(rows)} new note(s) was taken by another writer "
            "before the commit; nothing was written"
        ),
    )


def _params(
    scope: Scope,
    columns: tuple[str, ...],
    rows: Sequence[Mapping[str, Any]],
    terms: Mapping[str, Sequence[str]],
    postings: Mapping[str, Postings],
) -> dict[str, Any]:
    # Arrays of values rather than objects: the column names are not repeated per row.
    payload = [[_plain(row[name]) for name in columns] for row in rows]
    term_rows = [[slug, term] for slug, found in terms.items() for term in found]
    posting_rows = [
        [slug, term, weight, found.length]
        for slug, found in postings.items()
        for term, weight in found.weights.items()
    ]
    return {
        "rows": json.dumps(payload),
        "terms": json.dumps(term_rows),
        "postings": json.dumps(posting_rows),
        "kind": scope.kind,
        "sid": scope.id,
    }


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


@functools.cache
def _statement(columns: tuple[str, ...], *, strict: bool = False) -> TextClause:
    """The statement for rows with these ``columns``, built once per column set; a
    ``strict`` one fails on a slug or topic key already taken instead of skipping its row."""
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]

    def value(position: int, name: str) -> str:
        column = MEMORIES.c[name]
        if isinstance(column.type, JSON):  # the JSON value itself: null stays the JSON null
            return f"CAST(v->{position} AS json)"
        return f"CAST(v->>{position} AS {column.type.compile(dialect=dialect)})"

    # Every name is a column of MEMORIES (``value`` looks each one up), never input.
    return text(
        "WITH new AS ("  # noqa: S608
        f" INSERT INTO memories ({', '.join(columns)}, updated_seq)"
        f" SELECT {', '.join(value(i, name) for i, name in enumerate(columns))},"
        " nextval('memories_updated_seq_seq')"
        " FROM jsonb_array_elements(CAST(:rows AS jsonb)) WITH ORDINALITY AS a(v, n)"
        " ORDER BY n"
        f"{'' if strict else ' ON CONFLICT DO NOTHING'} RETURNING id, slug),"
        " terms AS ("
        " INSERT INTO memory_terms (memory_id, term, scope_kind, scope_id)"
        " SELECT new.id, t.v->>1, :kind, :sid"
        " FROM new JOIN jsonb_array_elements(CAST(:terms AS jsonb)) AS t(v)"
        " ON t.v->>0 = new.slug),"
        " postings AS ("
        " INSERT INTO search_postings (scope_kind, scope_id, term, memory_id, weight, length)"
        " SELECT :kind, :sid, p.v->>1, new.id, CAST(p.v->>2 AS float8), CAST(p.v->>3 AS float8)"
        " FROM new JOIN jsonb_array_elements(CAST(:postings AS jsonb)) AS p(v)"
        " ON p.v->>0 = new.slug)"
        " SELECT id, slug FROM new"
    )
