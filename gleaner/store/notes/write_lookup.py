"""What the writer reads before it writes: the rows an item may update (locked), the slugs
already taken among the ones it derives, and a session's copy of the same content.

Built once: only the parameters change from batch to batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import bindparam, or_, select, update

from gleaner.store.notes.drafts import base_slug_of
from gleaner.store.notes.history import VERSIONED
from gleaner.store.notes.write_item import Item
from gleaner.store.schema.models import SUPERSEDED, Memory
from gleaner.store.schema.sql import ID_CHUNK, Executor, one_of
from gleaner.store.schema.tables import MEMORIES
from gleaner.store.schemas import Scope

# What ``lookup`` finds: the stored rows by explicit slug and by topic key, and the slugs
# taken.
Found = tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], set[str]]


def free_slug(base: str, taken: set[str]) -> str:
    """``base``, or the first ``base-N`` (N from 2) not in ``taken``."""
    if base not in taken:
        return base
    n = 2
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


_IN_SCOPE = (Memory.scope_kind == bindparam("kind"), Memory.scope_id == bindparam("sid"))
# Built once: only the parameters change from batch to batch. The rows an item may update
# are locked, so a concurrent upsert of the same key waits for this transaction.
_BY_SLUGS, _BY_TOPIC_KEYS, _BY_IDS = (
    select(*VERSIONED, Memory.status, Memory.superseded_by_id, column.label("wanted_value"))
    .where(*_IN_SCOPE, one_of(column, "wanted"))
    .order_by(Memory.id)
    .with_for_update()
    for column in (Memory.slug, Memory.topic_key, Memory.id)
)
# A key's note found superseded: the row's field naming the slug of the note that holds the
# key (the write lands on the note that replaced it, ``_follow_superseders``).
SUPERSEDED_HOLDER = "superseded_holder"
_TAKEN_SLUGS = select(Memory.slug).where(*_IN_SCOPE, one_of(Memory.slug, "wanted"))
_SESSION_TWIN = (
    select(Memory.id, Memory.slug)
    .where(
        *_IN_SCOPE,
        Memory.session_id == bindparam("session_id"),
        Memory.content_hash == bindparam("digest"),
        Memory.topic_key.is_(None),
    )
    .order_by(Memory.id)
    .limit(1)
)


def session_twin(
    session: Executor, scope: Scope, session_id: str, digest: str
) -> tuple[int, str] | None:
    """The note of ``session_id`` holding the same content, if any (mem_save's dedup)."""
    row = session.execute(
        _SESSION_TWIN,
        {"kind": scope.kind, "sid": scope.id, "session_id": session_id, "digest": digest},
    ).first()
    return None if row is None else (int(row[0]), str(row[1]))


def _derived(items: Iterable[tuple[str, str | None]]) -> list[str]:
    """The derived slug bases a batch looks up, one per ``(title, topic key)`` of an item
    without an explicit slug."""
    return sorted({base_slug_of(title, key) for title, key in items})


def _taken_params(scope: Scope, wanted: list[str]) -> dict[str, Any]:
    return {"kind": scope.kind, "sid": scope.id, "wanted": wanted}


def lookup(session: Executor, scope: Scope, items: Sequence[Item], *, bases: bool = True) -> Found:
    """The scope's rows holding the items' explicit slugs and topic keys (locked; what
    history keeps of each, ``status`` and ``superseded_by_id``; for a key whose note is
    superseded, the note that replaced it, or none once the key is released:
    ``_follow_superseders``), and (with ``bases``)
    every slug taken among the derived bases and their ``-N`` forms."""
    explicit = sorted({i.draft.slug for i in items if i.draft.slug is not None})
    keys = sorted({i.topic_key for i in items if i.draft.slug is None and i.topic_key})
    derived = _derived((i.draft.title, i.topic_key) for i in items if i.draft.slug is None)
    in_scope = {"kind": scope.kind, "sid": scope.id}
    by_slug: dict[str, dict[str, Any]] = {}
    by_topic: dict[str, dict[str, Any]] = {}
    for stmt, wanted, found in ((_BY_SLUGS, explicit, by_slug), (_BY_TOPIC_KEYS, keys, by_topic)):
        for start in range(0, len(wanted), ID_CHUNK):
            rows = session.execute(stmt, {**in_scope, "wanted": wanted[start : start + ID_CHUNK]})
            for row in rows:
                found[str(row.wanted_value)] = dict(row._mapping)
    # A harvest's keyed write (its ``expect``) never takes over a key (see there).
    releasable = {str(i.topic_key) for i in items if i.expect is None} - {
        str(i.topic_key) for i in items if i.expect is not None
    }
    _follow_superseders(session, scope, by_topic, releasable)
    taken: set[str] = set(by_slug)
    # Most bases are free: look them up exactly (an index probe each), and only for the
    # taken ones list their -N forms.
    busy: set[str] = set()
    for start in range(0, len(derived) if bases else 0, ID_CHUNK):
        taken_rows = session.execute(
            _TAKEN_SLUGS, _taken_params(scope, derived[start : start + ID_CHUNK])
        )
        busy.update(str(slug) for (slug,) in taken_rows)
    taken |= busy
    crowded = sorted(busy)
    for start in range(0, len(crowded), 50):
        chunk = crowded[start : start + 50]
        taken.update(
            session.execute(
                select(Memory.slug).where(
                    Memory.scope_kind == scope.kind,
                    Memory.scope_id == scope.id,
                    or_(*(Memory.slug.like(f"{b}-%") for b in chunk)),
                ),
            ).scalars()
        )
    return by_slug, by_topic, taken


def _follow_superseders(
    session: Executor, scope: Scope, by_topic: dict[str, dict[str, Any]], releasable: set[str]
) -> None:
    """Put in place of each superseded key holder the note at the end of its supersede chain
    (locked), marked with ``SUPERSEDED_HOLDER``: what a write under the key means is the fact
    the holder stood for, and a person declared that note its replacement; written into the
    hidden holder, it would never be found. The key stays with its holder. A chain is
    followed within the scope only (links never leave it) and never round a loop; where it
    cannot go on, its last note is the target.

    A chain that ends in a pinned or person-written (``user``) note stops short of it: the
    key names the holder, not that note, and nothing written under a key rewrites a note a
    person chose. The key of such a holder in ``releasable`` is released (the holder keeps its
    text, status and superseder) and the write becomes a note of its own under the key; any
    other stays with its holder, marked, and the write is refused (a harvest's: NoteChanged).
    """
    holders = {
        key: row
        for key, row in by_topic.items()
        if row["status"] == SUPERSEDED and row["superseded_by_id"] is not None
    }
    pending = dict(holders)
    seen = {key: {int(row["id"])} for key, row in pending.items()}
    in_scope = {"kind": scope.kind, "sid": scope.id}
    released: list[int] = []
    while pending:
        wanted = sorted({int(row["superseded_by_id"]) for row in pending.values()})
        successors: dict[int, dict[str, Any]] = {}
        for start in range(0, len(wanted), ID_CHUNK):
            for found in session.execute(
                _BY_IDS, {**in_scope, "wanted": wanted[start : start + ID_CHUNK]}
            ):
                successors[int(found.id)] = dict(found._mapping)
        following: dict[str, dict[str, Any]] = {}
        for key, row in pending.items():
            successor = successors.get(int(row["superseded_by_id"]))
            if successor is None or int(successor["id"]) in seen[key]:
                continue
            seen[key].add(int(successor["id"]))
            holder = holders[key]
            if successor["status"] == SUPERSEDED and successor["superseded_by_id"] is not None:
                following[key] = successor
            elif successor["pinned"] or successor["provenance"] == "user":
                if key in releasable:
                    released.append(int(holder["id"]))
                    del by_topic[key]
                else:
                    by_topic[key] = {**holder, SUPERSEDED_HOLDER: holder["slug"]}
                continue
            by_topic[key] = {**successor, "wanted_value": key, SUPERSEDED_HOLDER: holder["slug"]}
        pending = following
    if released:
        session.execute(update(MEMORIES).where(MEMORIES.c.id.in_(released)).values(topic_key=None))
