"""Topic-keyed notes as harvest needs them: which keys a pinned or person-written note holds
(no harvested text may rewrite those), and the owner's keyed notes shown to the model so it
reuses a key instead of inventing a second one for the same fact."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Integer, bindparam, func, select

from store import prepared
from store.models import LIVE, SUPERSEDED, Memory, MemoryTerm
from store.schemas import Scope
from store.similar import TERM_CHUNK
from store.sql import ID_CHUNK, one_of

if TYPE_CHECKING:
    from store.sql import Executor

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
# statement that joins this one, as ``store.ledger``'s check does).
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
    rows = prepared.execute(session, KEYED, keyed_params(scope, terms, limit))
    return [KeyedNote(str(row.topic_key), row.title) for row in rows]
