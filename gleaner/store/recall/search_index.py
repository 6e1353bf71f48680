"""The search index (``search_postings``): each note's search terms, kept with its text.

A writer computes a note's postings with ``postings_of`` (its weighted term frequencies and
weighted length, ``store.recall.search_terms``), sets ``memories.search_length`` to that length and
writes the rows in the same transaction as the note (``insert_postings``; an update deletes
the note's rows first). Postings are kept for every status of a note: search reads only
live notes, and a note archived or superseded keeps its rows for the day it is live again.

``reindex`` builds the rows of notes written before the index existed (``search_length``
NULL) and rebuilds every note, its search postings and its same-fact terms
(``memory_terms``) both, when either tokenizer's version (``store.recall.search_terms.VERSION``,
``store.notes.fact_terms.TERMS_VERSION``) is not the one the indexes were built with; ``gleaner db
upgrade`` and ``gleaner db reindex`` run it, in batches, each note locked while its rows are
rebuilt. A migration never runs the tokenizers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Connection, Table, bindparam, delete, select, text, update

from gleaner.store.notes.fact_terms import TERMS_VERSION, similarity_terms
from gleaner.store.notes.term_index import insert_terms
from gleaner.store.recall.search_terms import VERSION as SEARCH_VERSION
from gleaner.store.recall.search_terms import note_terms
from gleaner.store.schema.models import SEARCH_POSTINGS, MemoryTerm
from gleaner.store.schema.sql import ID_CHUNK, dialect_name, one_of
from gleaner.store.schema.tables import MEMORIES
from gleaner.store.schemas import Scope

if TYPE_CHECKING:
    from gleaner.store.schema.sql import Executor

MEMORY_TERMS = cast(Table, MemoryTerm.__table__)

# Where the index records the tokenizer version it was built with.
STATE_NAME = "search_index"
REINDEX_BATCH = 2_000

_SQLITE_INSERT = (
    "INSERT INTO search_postings (scope_kind, scope_id, term, memory_id, weight, length)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)
_PG_INSERT = text(
    "INSERT INTO search_postings (scope_kind, scope_id, term, memory_id, weight, length)"
    " SELECT :kind, :sid, unnest(CAST(:terms AS varchar[])), unnest(CAST(:ids AS bigint[])),"
    " unnest(CAST(:weights AS float8[])), unnest(CAST(:lengths AS float8[]))"
)


@dataclass(frozen=True)
class Postings:
    """One note's index rows before it has an id: ``weights`` by term and its ``length``."""

    weights: Mapping[str, float]
    length: float


def postings_of(values: Mapping[str, Any]) -> Postings:
    """The postings of a note with these column values (``title``, ``body``, ``topics``,
    ``topic_key``, ``keywords``; a missing key counts as empty)."""
    keys = (
        values.get("topics") or "",
        (values.get("topic_key") or "").replace("/", " "),
        values.get("keywords") or "",
    )
    weights, length = note_terms(values.get("title") or "", values.get("body") or "", keys)
    return Postings(weights, length)


def insert_postings(session: Executor, scope: Scope, notes: Sequence[tuple[int, Postings]]) -> None:
    """Add the index rows of ``notes`` (``(memory id, postings)``, none indexed yet)."""
    rows = [
        (term, memory_id, weight, postings.length)
        for memory_id, postings in notes
        for term, weight in postings.weights.items()
    ]
    if not rows:
        return
    if dialect_name(session) == "postgresql":
        # One statement and four arrays, whatever the number of rows.
        session.execute(
            _PG_INSERT,
            {
                "kind": scope.kind,
                "sid": scope.id,
                "terms": [r[0] for r in rows],
                "ids": [r[1] for r in rows],
                "weights": [r[2] for r in rows],
                "lengths": [r[3] for r in rows],
            },
        )
        return
    # SQLite: straight to the driver's executemany (tens of rows a note; SQLAlchemy's
    # per-row parameter handling cost more than the inserts).
    connection = session if isinstance(session, Connection) else session.connection()
    connection.exec_driver_sql(_SQLITE_INSERT, [(scope.kind, scope.id, *row) for row in rows])


def delete_postings(session: Executor, memory_ids: Iterable[int]) -> None:
    """Remove every index row of these notes (their text is about to be written anew)."""
    ids = sorted(set(memory_ids))
    for start in range(0, len(ids), ID_CHUNK):
        session.execute(
            delete(SEARCH_POSTINGS).where(one_of(SEARCH_POSTINGS.c.memory_id, "ids")),
            {"ids": ids[start : start + ID_CHUNK]},
        )


@dataclass(frozen=True)
class ReindexResult:
    """What a reindex did: notes indexed, and the tokenizer version the index now has."""

    indexed: int
    version: str
    rebuilt: bool  # every note's rows were rebuilt (the version had changed)


def indexed_version(conn: Connection) -> str | None:
    """The tokenizer version the index was built with (None: never recorded)."""
    row = conn.execute(
        text("SELECT last_result FROM housekeeping_state WHERE name = :name"),
        {"name": STATE_NAME},
    ).first()
    if row is None or row[0] is None:
        return None
    value = row[0]
    if isinstance(value, str):  # SQLite hands JSON back as text through text()
        import json

        value = json.loads(value)
    version = value.get("version") if isinstance(value, dict) else None
    return str(version) if version is not None else None


def _record_version(conn: Connection, version: str) -> None:
    import json

    params = {"name": STATE_NAME, "result": json.dumps({"version": version})}
    changed = conn.execute(
        text("UPDATE housekeeping_state SET last_result = :result WHERE name = :name"), params
    ).rowcount
    if not changed:
        conn.execute(
            text(
                "INSERT INTO housekeeping_state (name, watermark, last_result)"
                " VALUES (:name, 0, :result)"
            ),
            params,
        )


_UNINDEXED = (
    select(
        MEMORIES.c.id,
        MEMORIES.c.scope_kind,
        MEMORIES.c.scope_id,
        MEMORIES.c.title,
        MEMORIES.c.body,
        MEMORIES.c.topics,
        MEMORIES.c.topic_key,
        MEMORIES.c.keywords,
    )
    .where(MEMORIES.c.search_length.is_(None), MEMORIES.c.id > bindparam("after"))
    .order_by(MEMORIES.c.id)
    .limit(REINDEX_BATCH)
)


def reindex(
    begin: Callable[[], Any],
    *,
    progress: Callable[[int], None] | None = None,
) -> ReindexResult:
    """Index every note not in the index yet, after marking every note so when the index
    was built by another tokenizer version. ``begin()`` opens one transaction (a context
    manager giving a Core connection); each batch of ``REINDEX_BATCH`` notes is its own, so
    locks stay short and a stopped run resumes where it was. ``progress`` gets the count
    indexed so far after each batch."""
    version = index_version()
    rebuilt = False
    with begin() as conn:
        stored = indexed_version(conn)
        if stored is not None and stored != version:
            conn.execute(update(MEMORIES).values(search_length=None))
            rebuilt = True
        if stored != version:
            _record_version(conn, version)
    done = 0
    after = 0
    while True:
        with begin() as conn:
            # Locked: a writer rewriting one of these notes meanwhile waits, then writes its
            # own rows over these.
            rows = conn.execute(_UNINDEXED.with_for_update(), {"after": after}).all()
            if not rows:
                break
            after = int(rows[-1].id)
            _reindex_rows(conn, rows)
        done += len(rows)
        if progress is not None:
            progress(done)
    return ReindexResult(done, version, rebuilt)


def index_version() -> str:
    """The version of both term indexes, as the tokenizers of this code build them."""
    return f"search {SEARCH_VERSION}; terms {TERMS_VERSION}"


def _reindex_rows(conn: Connection, rows: Sequence[Any]) -> None:
    by_scope: dict[Scope, list[tuple[int, Postings]]] = {}
    for row in rows:
        postings = postings_of(row._mapping)
        by_scope.setdefault(Scope.stored(row.scope_kind, row.scope_id), []).append(
            (int(row.id), postings)
        )
    ids = [int(row.id) for row in rows]
    delete_postings(conn, ids)
    conn.execute(delete(MEMORY_TERMS).where(one_of(MEMORY_TERMS.c.memory_id, "ids")), {"ids": ids})
    counts = {}
    for scope, notes in by_scope.items():
        insert_postings(conn, scope, notes)
    for row in rows:
        found = sorted(similarity_terms(row.title, row.topics or ""))
        counts[int(row.id)] = len(found)
        insert_terms(
            conn, Scope.stored(row.scope_kind, row.scope_id), [(int(row.id), t) for t in found]
        )
    conn.execute(
        update(MEMORIES)
        .where(MEMORIES.c.id == bindparam("note_id"))
        .values(term_count=bindparam("n")),
        [{"note_id": note_id, "n": n} for note_id, n in counts.items()],
    )
    conn.execute(
        update(MEMORIES)
        .where(MEMORIES.c.id == bindparam("note_id"))
        .values(search_length=bindparam("n")),
        [
            {"note_id": memory_id, "n": postings.length}
            for notes in by_scope.values()
            for memory_id, postings in notes
        ],
    )
