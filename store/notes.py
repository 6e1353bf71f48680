"""Writing and reading notes: validation, the slug and topic-key upserts, the term index.

Functions here take the caller's session and never commit: one transaction per unit of work,
owned by the caller (``Store`` for single calls, the harvest job for a batch).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import delete, func, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from store.errors import InvalidInput, StorageFailure
from store.models import ARCHIVED, LIVE, Memory, MemoryTerm, utcnow
from store.schemas import Note, Scope, Similar, WriteResult
from store.settings import Settings
from store.text import (
    check_text,
    content_hash,
    is_slug,
    normalize_topics,
    similarity_terms,
    slugify,
)

ATTR_KEYS = frozenset({"title", "body", "slug", "topics", "pinned", "confidence", "source"})
SOURCE_KEYS = frozenset({"url", "artifact", "note"})
CODE_PROVENANCES = frozenset({"user", "compaction", "import"})
MAX_TITLE_BYTES = 1_000
SIMILAR_LIMIT = 5
# More attempts than this at a free slug means something is wrong, not a race.
MAX_WRITE_ATTEMPTS = 100

Outcome = Literal["created", "updated", "deduped"]


@dataclass(frozen=True)
class Draft:
    """A note's validated attrs."""

    title: str
    body: str
    slug: str | None
    topics: str
    pinned: bool
    confidence: float | None
    source: dict[str, str] | None


def validate_attrs(attrs: Mapping[str, object], settings: Settings) -> Draft:
    """Check attrs against every write rule; raise InvalidInput naming the first one broken."""
    if not isinstance(attrs, Mapping):
        raise InvalidInput(
            f"attrs must be a mapping, got {type(attrs).__name__}", reason="bad_type"
        )
    unknown = sorted(str(key) for key in attrs if key not in ATTR_KEYS)
    if unknown:
        raise InvalidInput(
            f"unknown attrs key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(ATTR_KEYS))}",
            reason="unknown_attr",
        )
    if "title" not in attrs or "body" not in attrs:
        raise InvalidInput("attrs need both 'title' and 'body'", reason="missing_attr")
    title = check_text(attrs["title"], "title", max_bytes=MAX_TITLE_BYTES)
    if not title.strip():
        raise InvalidInput("title is empty", reason="empty_title")
    body = check_text(attrs["body"], "body", max_bytes=settings.max_body_bytes)
    if not body.strip():
        raise InvalidInput("body is empty", reason="empty_body")

    slug = attrs.get("slug")
    if slug is not None and not (isinstance(slug, str) and is_slug(slug)):
        raise InvalidInput(
            f"slug {slug!r} must be lowercase ASCII words joined by '-' (at most 100 chars)",
            reason="bad_slug",
        )

    raw_topics = attrs.get("topics")
    if raw_topics is not None and not (
        isinstance(raw_topics, list | tuple) and all(isinstance(t, str) for t in raw_topics)
    ):
        raise InvalidInput(
            f"topics must be a list of strings, got {raw_topics!r}", reason="bad_topics"
        )
    for topic in raw_topics or ():
        check_text(topic, "topic")

    pinned = attrs.get("pinned", False)
    if not isinstance(pinned, bool):
        raise InvalidInput(f"pinned must be true or false, got {pinned!r}", reason="bad_pinned")

    confidence = attrs.get("confidence")
    if confidence is not None:
        if (
            isinstance(confidence, bool)
            or not isinstance(confidence, int | float)
            or not math.isfinite(confidence)
            or not 0 <= confidence <= 1
        ):
            raise InvalidInput(
                f"confidence must be a number from 0 to 1, got {confidence!r}",
                reason="bad_confidence",
            )
        confidence = float(confidence)

    source = attrs.get("source")
    if source is not None:
        if not isinstance(source, Mapping):
            raise InvalidInput(f"source must be a mapping, got {source!r}", reason="bad_source")
        extra = sorted(str(key) for key in source if key not in SOURCE_KEYS)
        if extra:
            raise InvalidInput(
                f"unknown source key(s) {', '.join(extra)}; allowed: url, artifact, note",
                reason="bad_source",
            )
        source = {
            str(key): check_text(value, f"source.{key}", max_bytes=4_000)
            for key, value in source.items()
            if value is not None
        } or None
    return Draft(
        title=title,
        body=body,
        slug=slug,
        topics=normalize_topics(raw_topics),
        pinned=pinned,
        confidence=confidence,
        source=source,
    )


def resolve_provenance(provenance: str | None, source: Mapping[str, str] | None) -> str:
    """Provenance comes from code, never from attrs: ``web`` with a source URL, else ``agent``."""
    if provenance is None:
        return "web" if source and source.get("url") else "agent"
    if provenance not in CODE_PROVENANCES:
        raise InvalidInput(
            f"provenance {provenance!r} cannot be passed; code may pass user, compaction, import",
            reason="bad_provenance",
        )
    return provenance


def check_pin(draft: Draft, provenance: str, *, allow_pin_untrusted: bool) -> None:
    """A pinned body reaches system prompts: untrusted text needs an explicit opt-in."""
    if not draft.pinned or allow_pin_untrusted:
        return
    if provenance == "compaction":
        raise InvalidInput(
            "pinned is refused for compaction provenance (pass allow_pin_untrusted=True)",
            reason="pin_refused",
        )
    if draft.source and draft.source.get("url"):
        raise InvalidInput(
            "pinned is refused for a note with source.url (pass allow_pin_untrusted=True)",
            reason="pin_refused",
        )


def next_seq(session: Session) -> int:
    """The next value of the store-wide, monotonic ``updated_seq``."""
    if session.get_bind().dialect.name == "postgresql":
        return int(session.execute(select(func.nextval("memories_updated_seq_seq"))).scalar_one())
    # SQLite transactions are BEGIN IMMEDIATE: no other writer runs between read and write.
    current = session.execute(select(func.max(Memory.updated_seq))).scalar_one()
    return int(current or 0) + 1


def _insert_ignoring_conflicts(session: Session, values: dict[str, Any]) -> int | None:
    """INSERT ... ON CONFLICT DO NOTHING RETURNING id: the id, or None when a unique key is taken.

    On PostgreSQL a conflicting insert still in flight is waited for, so the loser sees the
    winner's row once this returns None.
    """
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        stmt: Any = postgresql.insert(Memory).values(**values).on_conflict_do_nothing()
    elif dialect == "sqlite":
        stmt = sqlite.insert(Memory).values(**values).on_conflict_do_nothing()
    else:  # pragma: no cover - the engine factory only builds the two
        stmt = insert(Memory).values(**values)
    return session.execute(stmt.returning(Memory.id)).scalar_one_or_none()


def _next_free_slug(session: Session, scope: Scope, base: str) -> str:
    taken = set(
        session.execute(
            select(Memory.slug).where(
                Memory.scope_kind == scope.kind,
                Memory.scope_id == scope.id,
                (Memory.slug == base) | Memory.slug.like(f"{base}-%"),
            )
        ).scalars()
    )
    if base not in taken:
        return base
    n = 2
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


def _by_key(session: Session, scope: Scope, **key: str) -> Memory | None:
    conditions = [Memory.scope_kind == scope.kind, Memory.scope_id == scope.id]
    conditions += [getattr(Memory, name) == value for name, value in key.items()]
    if "session_id" in key:
        conditions.append(Memory.topic_key.is_(None))
    return session.execute(
        select(Memory)
        .where(*conditions)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).scalar_one_or_none()


def save_note(
    session: Session,
    settings: Settings,
    scope: Scope,
    draft: Draft,
    *,
    provenance: str,
    conversation_id: str | None = None,
    note_type: str | None = None,
    topic_key: str | None = None,
    session_id: str | None = None,
    occurred_at: datetime | None = None,
) -> tuple[Memory, Outcome]:
    """Insert or update one validated note and its terms; the caller owns the transaction.

    An explicit slug or a topic key upserts; a derived slug takes the next free ``-N``; with a
    session and no topic key, content already saved in that session is ``deduped``.
    """
    now = utcnow()
    digest = content_hash(draft.body)
    fields: dict[str, Any] = {
        "title": draft.title,
        "body": draft.body,
        "topics": draft.topics,
        "pinned": draft.pinned,
        "confidence": draft.confidence,
        "source": draft.source,
        "provenance": provenance,
        "content_hash": digest,
        "updated_at": now,
    }
    if note_type is not None:
        fields["type"] = note_type
    key: dict[str, str] = {}
    if draft.slug is not None:
        key = {"slug": draft.slug}
    elif topic_key is not None:
        key = {"topic_key": topic_key}
    base_slug = draft.slug or slugify(draft.title)
    candidate = base_slug

    for _ in range(MAX_WRITE_ATTEMPTS):
        existing = _by_key(session, scope, **key) if key else None
        if existing is not None:
            for name, value in fields.items():
                setattr(existing, name, value)
            if conversation_id is not None:
                existing.conversation_id = conversation_id
            if session_id is not None:
                existing.session_id = session_id
            if occurred_at is not None:
                existing.occurred_at = occurred_at
            if existing.status == ARCHIVED:
                existing.status = LIVE  # rewritten: fresh again (a superseded note stays so)
            existing.updated_seq = next_seq(session)
            session.flush()
            _index_terms(session, existing)
            return existing, "updated"
        new_id = _insert_ignoring_conflicts(
            session,
            {
                **fields,
                "scope_kind": scope.kind,
                "scope_id": scope.id,
                "slug": candidate,
                "type": note_type,
                "topic_key": topic_key,
                "session_id": session_id,
                "conversation_id": conversation_id,
                "occurred_at": occurred_at,
                "created_at": now,
                "updated_seq": next_seq(session),
                "status": LIVE,
            },
        )
        if new_id is not None:
            row = session.get(Memory, new_id, populate_existing=True)
            assert row is not None
            _index_terms(session, row)
            return row, "created"
        if key:
            continue  # the keyed row appeared meanwhile: update it on the next pass
        if session_id is not None and topic_key is None:
            twin = _by_key(session, scope, session_id=session_id, content_hash=digest)
            if twin is not None:
                return twin, "deduped"
        candidate = _next_free_slug(session, scope, base_slug)
    raise StorageFailure(
        f"could not find a free slug for {base_slug!r} after {MAX_WRITE_ATTEMPTS} attempts",
        reason="slug_exhausted",
    )


def _index_terms(session: Session, row: Memory) -> None:
    """Replace the note's rows in the term index (same transaction as the write)."""
    terms = sorted(similarity_terms(row.title, row.topics))
    session.execute(delete(MemoryTerm).where(MemoryTerm.memory_id == row.id))
    if terms:
        session.execute(
            insert(MemoryTerm),
            [
                {
                    "memory_id": row.id,
                    "term": term,
                    "scope_kind": row.scope_kind,
                    "scope_id": row.scope_id,
                }
                for term in terms
            ],
        )
    row.term_count = len(terms)


def similar_notes(
    session: Session,
    scope: Scope,
    title: str,
    topic_string: str,
    *,
    threshold: float,
    exclude_id: int | None = None,
    limit: int = SIMILAR_LIMIT,
) -> list[Similar]:
    """Live notes of the scope whose title+topic Jaccard score reaches ``threshold``, best first.

    The term index does the work in SQL: a note sharing ``s`` of this note's ``a`` terms and
    having ``b`` of its own scores ``s / (a + b - s)``; one with a score of ``t`` or more shares
    at least ``ceil(t * a)`` terms, which bounds the groups kept.
    """
    mine = similarity_terms(title, topic_string)
    if not mine:
        return []
    a = len(mine)
    shared = func.count().label("shared")
    rows = session.execute(
        select(Memory.slug, Memory.title, shared, Memory.term_count)
        .join(MemoryTerm, MemoryTerm.memory_id == Memory.id)
        .where(
            MemoryTerm.scope_kind == scope.kind,
            MemoryTerm.scope_id == scope.id,
            MemoryTerm.term.in_(sorted(mine)),
            Memory.status == LIVE,
            Memory.id != (exclude_id if exclude_id is not None else -1),
        )
        .group_by(Memory.id, Memory.slug, Memory.title, Memory.term_count)
        .having(func.count() >= max(1, math.ceil(threshold * a - 1e-9)))
        .order_by((shared * 1.0 / (a + Memory.term_count - shared)).desc(), Memory.slug)
        .limit(limit)
    ).all()
    found = []
    for slug, other_title, common, size in rows:
        score = common / (a + size - common)
        if score >= threshold - 1e-9:
            found.append(Similar(slug=slug, title=other_title, score=round(score, 4)))
    return found


def write(
    session: Session,
    settings: Settings,
    scope: Scope | tuple[str, str],
    attrs: Mapping[str, object],
    *,
    conversation_id: str | None = None,
    provenance: str | None = None,
    allow_pin_untrusted: bool = False,
    note_type: str | None = None,
    topic_key: str | None = None,
    occurred_at: datetime | None = None,
    with_similar: bool = True,
) -> WriteResult:
    """Validate and write one note (see ``Store.write``); the caller owns the transaction.

    ``note_type``, ``topic_key`` (upserts like an explicit slug) and ``occurred_at`` are for
    code that writes typed notes, such as harvest; a batch writer that does not show
    ``similar`` to anyone passes ``with_similar=False`` to skip that query.
    """
    scope = Scope.of(scope)
    draft = validate_attrs(attrs, settings)
    resolved = resolve_provenance(provenance, draft.source)
    check_pin(draft, resolved, allow_pin_untrusted=allow_pin_untrusted)
    if conversation_id is not None:
        conversation_id = check_text(conversation_id, "conversation_id", max_bytes=255)
    row, outcome = save_note(
        session,
        settings,
        scope,
        draft,
        provenance=resolved,
        conversation_id=conversation_id,
        note_type=note_type,
        topic_key=topic_key,
        occurred_at=occurred_at,
    )
    if not with_similar:
        return WriteResult(memory=Note.from_row(row), created=outcome == "created", similar=[])
    similar = similar_notes(
        session,
        scope,
        row.title,
        row.topics,
        threshold=settings.similar_threshold,
        exclude_id=row.id,
    )
    return WriteResult(memory=Note.from_row(row), created=outcome == "created", similar=similar)


def get(session: Session, scope: Scope | tuple[str, str], slug: str) -> Note | None:
    """The note with ``slug`` in the scope, or None."""
    scope = Scope.of(scope)
    row = session.execute(
        select(Memory).where(
            Memory.scope_kind == scope.kind, Memory.scope_id == scope.id, Memory.slug == slug
        )
    ).scalar_one_or_none()
    return None if row is None else Note.from_row(row)


def fingerprint(session: Session, scope: Scope | tuple[str, str]) -> tuple[int, int]:
    """``(live note count, max updated_seq)`` of the scope: cheap proof index_text is current."""
    scope = Scope.of(scope)
    in_scope = (Memory.scope_kind == scope.kind, Memory.scope_id == scope.id)
    count = session.execute(
        select(func.count()).select_from(Memory).where(*in_scope, Memory.status == LIVE)
    ).scalar_one()
    top = session.execute(select(func.max(Memory.updated_seq)).where(*in_scope)).scalar_one()
    return int(count), int(top or 0)
