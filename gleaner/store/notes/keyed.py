"""Topic-keyed notes as harvest needs them: which keys a pinned or person-written note holds
(no harvested text may rewrite those), and the owner's keyed notes shown to the model so it
reuses a key instead of inventing a second one for the same fact."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from sqlalchemy import Connection, Integer, bindparam, func, select

from gleaner.store.notes.term_lookup import TERM_CHUNK
from gleaner.store.notes.terms import FactText
from gleaner.store.schema.models import Memory, MemoryTerm
from gleaner.store.schema.sql import ID_CHUNK, one_of
from gleaner.store.schema.tables import LIVE, MEMORIES, SUPERSEDED
from gleaner.store.schemas import Note, Scope

if TYPE_CHECKING:
    from gleaner.config.store import StoreSettings
    from gleaner.store.schema.models import Memory
    from gleaner.store.schema.sql import Executor

_KEY_HOLDERS = select(Memory.topic_key, Memory.pinned, Memory.provenance, Memory.status).where(
    Memory.scope_kind == bindparam("kind"),
    Memory.scope_id == bindparam("sid"),
    one_of(Memory.topic_key, "keys"),
)


def protected_keys(session: Executor, scope: Scope, keys: Sequence[str]) -> set[str]:
    """The topic keys of ``keys`` held by a pinned, person-written (``user``) or superseded
    note: no harvested text may rewrite those, whatever key it names (a superseded note is
    hidden, and was declared replaced)."""
    wanted = sorted(set(keys))
    held: set[str] = set()
    for start in range(0, len(wanted), ID_CHUNK):
        rows = session.execute(
            _KEY_HOLDERS,
            {"kind": scope.kind, "sid": scope.id, "keys": wanted[start : start + ID_CHUNK]},
        )
        held.update(
            str(key)
            for key, pinned, provenance, status in rows
            if pinned or provenance == "user" or status == SUPERSEDED
        )
    return held


@dataclass(frozen=True)
class KeyedNote:
    """A live note that holds a topic key: the key and the note's title."""

    topic_key: str
    title: str


# The scope's live keyed notes (the partial topic-key index finds them: an owner has few),
# each with how many of the given terms it holds (one primary-key probe per note and term),
# most shared first, then the most recently changed (``shared``, ``seq``: the order, for a
# statement that joins this one, as ``store.jobs.ledger``'s check does).
KEYED = (
    select(
        Memory.topic_key,
        Memory.title,
        func.count(MemoryTerm.term).label("shared"),
        Memory.updated_seq.label("seq"),
    )
    .outerjoin(
        MemoryTerm,
        (MemoryTerm.memory_id == Memory.id) & one_of(MemoryTerm.term, "terms"),
    )
    .where(
        Memory.scope_kind == bindparam("kind"),
        Memory.scope_id == bindparam("sid"),
        Memory.topic_key.is_not(None),
        Memory.status == LIVE,
    )
    .group_by(Memory.id, Memory.topic_key, Memory.title, Memory.updated_seq)
    .order_by(func.count(MemoryTerm.term).desc(), Memory.updated_seq.desc())
    .limit(bindparam("limit", type_=Integer))
)


def keyed_params(scope: Scope, terms: Sequence[str], limit: int) -> dict[str, object]:
    """``KEYED``'s parameters: at most ``limit`` notes, ranked by ``terms``."""
    # An empty IN list matches nothing; a term no note holds keeps the statement's shape.
    wanted = sorted(set(terms))[:TERM_CHUNK] or [""]
    return {"kind": scope.kind, "sid": scope.id, "limit": limit, "terms": wanted}


def keyed_notes(
    session: Executor, scope: Scope, terms: Sequence[str], *, limit: int
) -> list[KeyedNote]:
    """At most ``limit`` of the scope's live topic-keyed notes: those sharing the most of
    ``terms`` first, then the most recently changed (a fact that changes, "moved to Porto",
    often shares no word with the note it replaces, "Based in Lisbon")."""
    if limit <= 0:
        return []
    rows = session.execute(KEYED, keyed_params(scope, terms, limit))
    return [KeyedNote(str(row.topic_key), row.title) for row in rows]


@dataclass(frozen=True)
class ShownNote:
    """One of the owner's notes shown to the harvest model with a transcript, under a short
    ``ref`` the model's marks name (``n1``, ``n2``...): what a mark may change, and what the
    change is checked against (its text as shown)."""

    ref: str
    id: int
    slug: str
    title: str
    body: str
    topics: str
    topic_key: str | None
    pinned: bool
    provenance: str

    @property
    def untouchable(self) -> bool:
        """Pinned or person-written: no harvested text may rewrite it."""
        return self.pinned or self.provenance == "user"


def shown_notes(
    conn: Connection,
    settings: StoreSettings,
    scope: Scope,
    *,
    keys: Sequence[str],
    terms: Sequence[str],
    limit: int,
) -> list[ShownNote]:
    """At most ``limit`` of the scope's live notes a transcript bears on: those holding
    ``keys`` (the keyed notes the ledger check ranked), then the best of a BM25 search for
    the transcript's search ``terms`` (``store.recall.search``), each once, refs in that order."""
    if limit <= 0:
        return []
    from gleaner.store.recall.search import ranked_by_terms

    found: dict[int, Note] = {}
    if keys:
        rows = conn.execute(
            select(MEMORIES)
            .where(
                MEMORIES.c.scope_kind == scope.kind,
                MEMORIES.c.scope_id == scope.id,
                MEMORIES.c.status == LIVE,
                one_of(MEMORIES.c.topic_key, "keys"),
            )
            .limit(limit),
            {"keys": list(dict.fromkeys(keys))[:ID_CHUNK]},
        )
        by_key = {str(row.topic_key): Note.from_row(cast("Memory", row)) for row in rows}
        for key in keys:
            if key in by_key:
                found.setdefault(by_key[key].id, by_key[key])
    for note in ranked_by_terms(conn, settings, scope, terms, limit):
        found.setdefault(note.id, note)
    return [
        ShownNote(
            ref=f"n{n}",
            id=note.id,
            slug=note.slug,
            title=note.title,
            body=note.body,
            topics=" ".join(note.topics),
            topic_key=note.topic_key,
            pinned=note.pinned,
            provenance=note.provenance,
        )
        for n, note in enumerate(list(found.values())[:limit], start=1)
    ]


def key_holders(
    session: Executor, scope: Scope, keys: Sequence[str]
) -> dict[str, tuple[int, FactText]]:
    """The live notes holding ``keys``: each key's note id and text (title, body, topics)."""
    wanted = sorted(set(keys))
    found: dict[str, tuple[int, FactText]] = {}
    for start in range(0, len(wanted), ID_CHUNK):
        rows = session.execute(
            select(Memory.topic_key, Memory.id, Memory.title, Memory.body, Memory.topics).where(
                Memory.scope_kind == scope.kind,
                Memory.scope_id == scope.id,
                Memory.status == LIVE,
                one_of(Memory.topic_key, "keys"),
            ),
            {"keys": wanted[start : start + ID_CHUNK]},
        )
        for key, note_id, title, body, topics in rows:
            found[str(key)] = (int(note_id), FactText(title, body, topics or ""))
    return found


def as_now(session: Executor, scope: Scope, shown: Sequence[ShownNote]) -> list[ShownNote]:
    """``shown`` as the notes stand now (read again: a person may have pinned, rewritten or
    superseded one since it was shown), each under its ref; one gone or no longer live is
    left out."""
    by_id = {note.id: note for note in shown}
    current: list[ShownNote] = []
    ids = sorted(by_id)
    for start in range(0, len(ids), ID_CHUNK):
        rows = session.execute(
            select(
                Memory.id,
                Memory.slug,
                Memory.title,
                Memory.body,
                Memory.topics,
                Memory.topic_key,
                Memory.pinned,
                Memory.provenance,
            ).where(
                Memory.scope_kind == scope.kind,
                Memory.scope_id == scope.id,
                Memory.status == LIVE,
                one_of(Memory.id, "ids"),
            ),
            {"ids": ids[start : start + ID_CHUNK]},
        )
        for row in rows:
            current.append(
                ShownNote(
                    ref=by_id[int(row.id)].ref,
                    id=int(row.id),
                    slug=str(row.slug),
                    title=row.title,
                    body=row.body,
                    topics=row.topics or "",
                    topic_key=row.topic_key,
                    pinned=bool(row.pinned),
                    provenance=str(row.provenance),
                )
            )
    return current
