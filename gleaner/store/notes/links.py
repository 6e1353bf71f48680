"""Links between notes and reading a note with them."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, aliased

from gleaner.store.errors import InvalidInput, LinkRefused, NotFound
from gleaner.store.notes.supersede import lock_scopes
from gleaner.store.notes.supersede import write as write_supersedes
from gleaner.store.schema.models import Link, Memory
from gleaner.store.schema.sql import dialect_insert, scope_key
from gleaner.store.schema.tables import utcnow
from gleaner.store.schemas import RELS, LinkedNote, LinkResult, Note, NoteWithLinks, Scope
from gleaner.store.text import quoted

# A supersedes chain longer than this is corrupt data, not a real history.
MAX_CHAIN = 10_000


def scope_lock_key(scope: Scope, purpose: str) -> int:
    """A signed 64-bit key for a PostgreSQL advisory lock on (purpose, scope)."""
    return scope_key(purpose, scope.kind, scope.id)


def _note_row(session: Session, scope: Scope, slug: str, *, lock: bool = False) -> Memory:
    stmt = select(Memory).where(
        Memory.scope_kind == scope.kind, Memory.scope_id == scope.id, Memory.slug == slug
    )
    if lock:
        stmt = stmt.with_for_update()
    row = session.execute(stmt.execution_options(populate_existing=True)).scalar_one_or_none()
    if row is None:
        raise NotFound(f"no note {quoted(slug)} in scope {scope}")
    return row


def link(
    session: Session, scope: Scope | tuple[str, str], from_slug: str, to_slug: str, rel: str
) -> LinkResult:
    """Add a ``rel`` edge from one note to another; an existing edge is left as it is.

    ``supersedes`` marks the target superseded by the source; it refuses a cycle and a target
    that another note already supersedes.
    """
    scope = Scope.of(scope)
    if rel not in RELS:
        raise InvalidInput(f"rel {quoted(rel)} is not one of {', '.join(RELS)}", reason="bad_rel")
    if from_slug == to_slug:
        raise LinkRefused(f"a note cannot link to itself ({quoted(from_slug)})", reason="self_link")
    if rel == "supersedes":
        lock_scopes(session, [scope])
    source = _note_row(session, scope, from_slug, lock=rel == "supersedes")
    target = _note_row(session, scope, to_slug, lock=rel == "supersedes")

    exists = session.execute(
        select(Link.id).where(Link.from_id == source.id, Link.to_id == target.id, Link.rel == rel)
    ).first()
    if exists is not None:
        return LinkResult(
            from_=Note.from_row(source), to=Note.from_row(target), rel=rel, created=False
        )

    if rel == "supersedes":
        if target.superseded_by_id is not None and target.superseded_by_id != source.id:
            holder = session.get(Memory, target.superseded_by_id)
            raise LinkRefused(
                f"{to_slug!r} is already superseded by {holder.slug if holder else '?'!r}",
                reason="already_superseded",
            )
        _refuse_cycle(session, source, target)
        write_supersedes(session, [(source.id, target.id)])
        session.refresh(target)
        return LinkResult(
            from_=Note.from_row(source), to=Note.from_row(target), rel=rel, created=True
        )

    values = {"from_id": source.id, "to_id": target.id, "rel": rel, "created_at": utcnow()}
    session.execute(dialect_insert(session, Link).values(**values).on_conflict_do_nothing())
    session.flush()
    return LinkResult(from_=Note.from_row(source), to=Note.from_row(target), rel=rel, created=True)


def _refuse_cycle(session: Session, source: Memory, target: Memory) -> None:
    """Refuse ``source supersedes target`` when target already supersedes source, however far."""
    current: Memory | None = source
    for _ in range(MAX_CHAIN):
        if current is None or current.superseded_by_id is None:
            return
        if current.superseded_by_id == target.id:
            raise LinkRefused(
                f"{source.slug!r} supersedes {target.slug!r} would form a cycle: "
                f"{target.slug!r} already supersedes {source.slug!r}",
                reason="cycle",
            )
        current = session.get(Memory, current.superseded_by_id)
    raise LinkRefused("supersedes chain is too long to check", reason="cycle")


def read(session: Session, scope: Scope | tuple[str, str], slug: str) -> NoteWithLinks:
    """The note with its outgoing links, backlinks and the slug of its superseder."""
    scope = Scope.of(scope)
    row = _note_row(session, scope, slug)
    other = aliased(Memory)
    outgoing = session.execute(
        select(Link.rel, other)
        .join(other, other.id == Link.to_id)
        .where(Link.from_id == row.id)
        .order_by(Link.id)
    ).all()
    incoming = session.execute(
        select(Link.rel, other)
        .join(other, other.id == Link.from_id)
        .where(Link.to_id == row.id)
        .order_by(Link.id)
    ).all()
    superseder = (
        session.execute(select(Memory.slug).where(Memory.id == row.superseded_by_id)).scalar()
        if row.superseded_by_id is not None
        else None
    )
    return NoteWithLinks(
        memory=Note.from_row(row),
        links=[LinkedNote(rel=rel, note=Note.from_row(note)) for rel, note in outgoing],
        backlinks=[LinkedNote(rel=rel, note=Note.from_row(note)) for rel, note in incoming],
        superseded_by=superseder,
    )
