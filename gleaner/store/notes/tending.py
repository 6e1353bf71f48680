"""Tending notes by hand: listing a scope's notes, pinning, unpinning and archiving one.

These are a person's choices (``gleaner notes ...``), so pinning takes no provenance rule:
the person asking is the opt-in that ``write`` asks of untrusted text. Archiving is the only
"delete": the row, its links and its history stay; it leaves search and the index. A later
write to the same slug or topic key brings the note back with the new text (as for notes
housekeeping archived). Each change takes a new ``updated_seq`` so the scope's fingerprint
moves and a cached index text is rebuilt; ``updated_at`` (recency) stays as it was.

Listing reads through Core (``gleaner notes list`` never imports the ORM); a change loads the
note's row through the ORM, which it imports then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from sqlalchemy import Connection, select

from gleaner.store.errors import InvalidInput, NotFound
from gleaner.store.schema.sql import next_seq
from gleaner.store.schema.tables import ARCHIVED, LIVE, MEMORIES, SUPERSEDED
from gleaner.store.schemas import Note, NoteChange, Scope
from gleaner.store.text import quoted

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from gleaner.store.schema.models import Memory

STATUSES = (LIVE, ARCHIVED, SUPERSEDED)
MAX_LIST = 1000


def list_notes(
    conn: Connection,
    scope: Scope | tuple[str, str],
    *,
    status: str | None = LIVE,
    pinned: bool | None = None,
    limit: int = 100,
) -> list[Note]:
    """The scope's notes, most recently changed first; ``status`` None lists every status and
    ``pinned`` True or False keeps only pinned or unpinned ones."""
    scope = Scope.of(scope)
    if status is not None and status not in STATUSES:
        raise InvalidInput(
            f"status must be one of {', '.join(STATUSES)} (or None for all), got {quoted(status)}",
            reason="bad_status",
        )
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST:
        raise InvalidInput(f"limit must be 1..{MAX_LIST}, got {quoted(limit)}", reason="bad_limit")
    m = MEMORIES.c
    query = select(MEMORIES).where(m.scope_kind == scope.kind, m.scope_id == scope.id)
    if status is not None:
        query = query.where(m.status == status)
    if pinned is not None:
        query = query.where(m.pinned.is_(pinned))
    rows = conn.execute(query.order_by(m.updated_seq.desc()).limit(limit))
    # A memories row has every attribute from_row reads, by the same names.
    return [Note.from_row(cast("Memory", row)) for row in rows]


def _locked(session: Session, scope: Scope, slug: str) -> Memory:
    from gleaner.store.schema.models import Memory

    # FOR UPDATE: a concurrent writer of the same note waits, so neither change is lost.
    row = session.execute(
        select(Memory)
        .where(Memory.scope_kind == scope.kind, Memory.scope_id == scope.id, Memory.slug == slug)
        .with_for_update()
    ).scalar_one_or_none()
    if row is None:
        raise NotFound(f"no note {quoted(slug)} in scope {scope}")
    return row


def set_pinned(
    session: Session, scope: Scope | tuple[str, str], slug: str, pinned: bool
) -> NoteChange:
    """Pin or unpin a note; pinning refuses (``not_live``) a note that is archived or
    superseded, since only live notes reach the index."""
    scope = Scope.of(scope)
    row = _locked(session, scope, slug)
    if pinned and row.status != LIVE:
        raise InvalidInput(
            f"note {slug!r} is {row.status}, not live: only a live note can be pinned",
            reason="not_live",
        )
    if row.pinned == pinned:
        return NoteChange(memory=Note.from_row(row), changed=False)
    row.pinned = pinned
    row.updated_seq = next_seq(session)
    session.flush()
    return NoteChange(memory=Note.from_row(row), changed=True)


def archive(session: Session, scope: Scope | tuple[str, str], slug: str) -> NoteChange:
    """Archive a live note (``changed`` False when it already is archived or superseded)."""
    scope = Scope.of(scope)
    row = _locked(session, scope, slug)
    if row.status != LIVE:
        return NoteChange(memory=Note.from_row(row), changed=False)
    row.status = ARCHIVED
    row.updated_seq = next_seq(session)
    session.flush()
    return NoteChange(memory=Note.from_row(row), changed=True)
