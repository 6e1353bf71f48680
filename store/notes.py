"""Writing and reading notes: validation, the slug and topic-key upserts, the term index.

Functions here take the caller's session and never commit: one transaction per unit of work,
owned by the caller (``Store`` for single calls, the harvest job for a batch).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, cast

from sqlalchemy import (
    Table,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.orm import Session

from store import history
from store.errors import InvalidInput, StorageFailure
from store.models import ARCHIVED, LIVE, Memory, MemoryTerm, utcnow
from store.schemas import Note, Scope, WriteResult
from store.settings import Settings
from store.similar import similar_notes
from store.sql import ID_CHUNK, dialect_insert, next_seq, next_seqs, seq_expression
from store.terms import similarity_terms
from store.text import (
    check_text,
    content_hash,
    is_slug,
    normalize_topics,
    slugify,
)

ATTR_KEYS = frozenset({"title", "body", "slug", "topics", "pinned", "confidence", "source"})
SOURCE_KEYS = frozenset({"url", "artifact", "note"})
CODE_PROVENANCES = frozenset({"user", "compaction", "import"})
MAX_TITLE_BYTES = 1_000
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


_INSERTS: dict[str, Any] = {}


def _insert_ignoring_conflicts(session: Session, values: dict[str, Any]) -> Memory | None:
    """INSERT ... ON CONFLICT DO NOTHING RETURNING the row, or None when a unique key is taken.

    ``updated_seq`` is computed in the statement (``seq_expression``). The statement is built
    once per dialect; only the values change. On PostgreSQL a conflicting insert still in
    flight is waited for, so the loser sees the winner's row once this returns None. The row
    comes back as a detached ``Memory`` built from the returned columns: callers only read it,
    and loading it through the ORM cost as much as the rest of the write.
    """
    dialect = session.get_bind().dialect.name
    stmt = _INSERTS.get(dialect)
    if stmt is None:
        table = cast(Table, Memory.__table__)
        stmt = dialect_insert(session, table).values(updated_seq=seq_expression(session))
        if hasattr(stmt, "on_conflict_do_nothing"):
            stmt = stmt.on_conflict_do_nothing()
        stmt = _INSERTS[dialect] = stmt.returning(*table.c)
    row = session.execute(stmt, values).first()
    return None if row is None else Memory(**row._mapping)


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


def base_slug_of(title: str, topic_key: str | None) -> str:
    """The slug a new note derives: from its topic key when it has one, else its title.

    A topic-keyed note is rewritten in place as its fact changes ("Lives in Lisbon" ->
    "Moved to Porto"): a slug naming the key stays true, one naming the first title would not.
    """
    return slugify(topic_key if topic_key is not None else title)


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


def _draft_columns(draft: Draft, provenance: str, now: datetime, term_count: int) -> dict[str, Any]:
    """The columns every write of ``draft`` sets, insert or update alike."""
    return {
        "title": draft.title,
        "body": draft.body,
        "topics": draft.topics,
        "pinned": draft.pinned,
        "confidence": draft.confidence,
        "source": draft.source,
        "provenance": provenance,
        "content_hash": content_hash(draft.body),
        "updated_at": now,
        "term_count": term_count,
    }


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
    reason: str | None = None,
) -> tuple[Memory, Outcome]:
    """Insert or update one validated note and its terms; the caller owns the transaction.

    An explicit slug or a topic key upserts; a derived slug takes the next free ``-N``; with a
    session and no topic key, content already saved in that session is ``deduped``. An update
    that changes the title or body keeps the text it replaces (``store.history``) with
    ``reason`` (default: ``slug_upsert`` or ``topic_key_upsert``).
    """
    now = utcnow()
    terms = sorted(similarity_terms(draft.title, draft.topics))
    fields = _draft_columns(draft, provenance, now, len(terms))
    digest = fields["content_hash"]
    if note_type is not None:
        fields["type"] = note_type
    key: dict[str, str] = {}
    if draft.slug is not None:
        key = {"slug": draft.slug}
    elif topic_key is not None:
        key = {"topic_key": topic_key}
    base_slug = draft.slug or base_slug_of(draft.title, topic_key)
    candidate = base_slug

    for _ in range(MAX_WRITE_ATTEMPTS):
        # A derived slug never overwrites: no lookup, the insert below is the whole write.
        existing = _by_key(session, scope, **key) if key else None
        if existing is not None:
            if history.changes_text(history.of_note(existing), draft.title, draft.body):
                change = history.Change(
                    history.upsert_reason(reason, explicit_slug=draft.slug is not None),
                    provenance,
                    conversation_id,
                    now,
                )
                history.keep(session, [history.version_values(history.of_note(existing), change)])
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
            _index_terms(session, existing.id, scope, terms, replace=True)
            return existing, "updated"
        row = _insert_ignoring_conflicts(
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
                "status": LIVE,
            },
        )
        if row is not None:
            _index_terms(session, row.id, scope, terms, replace=False)
            return row, "created"
        if draft.slug is not None:
            continue  # the slug's row appeared meanwhile: update it on the next pass
        if session_id is not None and topic_key is None:
            twin = _by_key(session, scope, session_id=session_id, content_hash=digest)
            if twin is not None:
                return twin, "deduped"
        # The derived slug is taken (or, with a topic key, the keyed row appeared: the next
        # pass finds and updates it).
        candidate = _next_free_slug(session, scope, base_slug)
    raise StorageFailure(
        f"could not find a free slug for {base_slug!r} after {MAX_WRITE_ATTEMPTS} attempts",
        reason="slug_exhausted",
    )


def _index_terms(
    session: Session, memory_id: int, scope: Scope, terms: Sequence[str], *, replace: bool
) -> None:
    """Write the note's rows in the term index (same transaction as the write).

    ``replace`` drops its old rows first; a fresh insert has none.
    """
    if replace:
        session.execute(delete(MemoryTerm).where(MemoryTerm.memory_id == memory_id))
    insert_terms(session, scope, [(memory_id, term) for term in terms])


_TERMS = cast(Table, MemoryTerm.__table__)
# PostgreSQL: every row in one statement (arrays unnested side by side), not one per row.
_UNNEST_TERMS = text(
    "INSERT INTO memory_terms (memory_id, term, scope_kind, scope_id)"
    " SELECT unnest(CAST(:ids AS bigint[])), unnest(CAST(:terms AS varchar[])), :kind, :sid"
)


def insert_terms(session: Session, scope: Scope, rows: Sequence[tuple[int, str]]) -> None:
    """Add ``(memory_id, term)`` rows of the scope to the term index."""
    if not rows:
        return
    if session.get_bind().dialect.name == "postgresql":
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


# Batch writes --------------------------------------------------------------------------------

# Rows per multi-row INSERT: well under SQLite's bound-parameter limit (25 columns a row).
BATCH_CHUNK = 400


@dataclass(frozen=True)
class BatchItem:
    """One note of a batch: its attrs and, for typed notes, its type and topic key."""

    attrs: Mapping[str, object]
    note_type: str | None = None
    topic_key: str | None = None
    # Why an update replaces a note's text (history); default slug_upsert / topic_key_upsert.
    reason: str | None = None


@dataclass(frozen=True)
class BatchResult:
    """What became of one batch item: ``created``/``updated`` with the note, or ``invalid``."""

    outcome: Literal["created", "updated", "invalid"]
    slug: str | None = None
    id: int | None = None
    error: InvalidInput | None = None


@dataclass(eq=False)
class _Op:
    """One row the batch writes: an update of ``row_id`` or, without one, an insert."""

    slug: str
    values: dict[str, Any]
    items: list[tuple[int, Draft, BatchItem]]
    row_id: int | None = None
    revive: bool = False  # an archived note rewritten is live again
    inserted: bool = False
    # The note's text as the last write left it (``history.VERSIONED`` columns), and the
    # versions its writes replace (``memory_id`` filled in once an inserted row has an id).
    current: dict[str, Any] | None = None
    versions: list[dict[str, Any]] = field(default_factory=list)


def write_batch(
    session: Session,
    settings: Settings,
    scope: Scope | tuple[str, str],
    items: Sequence[BatchItem],
    *,
    provenance: str | None = None,
    conversation_id: str | None = None,
    occurred_at: datetime | None = None,
    allow_pin_untrusted: bool = False,
) -> list[BatchResult]:
    """Write ``items`` as if by one ``write`` call each, in order, in a handful of statements.

    Every write rule holds per item (an invalid item is reported ``invalid`` and the rest are
    written); items interact as sequential writes would: a derived slug skips the slugs of
    earlier items, an explicit slug or topic key upserts an earlier item's note. The caller
    owns the transaction. ``similar`` is not computed. A unique key taken by a concurrent
    writer between the lookup and the insert sends that item through ``save_note``.
    """
    scope = Scope.of(scope)
    if conversation_id is not None:
        conversation_id = check_text(conversation_id, "conversation_id", max_bytes=255)
    results: list[BatchResult | None] = [None] * len(items)
    valid: list[tuple[int, Draft, BatchItem, str]] = []
    for n, item in enumerate(items):
        try:
            draft = validate_attrs(item.attrs, settings)
            resolved = resolve_provenance(provenance, draft.source)
            check_pin(draft, resolved, allow_pin_untrusted=allow_pin_untrusted)
            if item.topic_key is not None:
                check_text(item.topic_key, "topic_key", max_bytes=255)
        except InvalidInput as exc:
            results[n] = BatchResult(outcome="invalid", error=exc)
            continue
        valid.append((n, draft, item, resolved))
    if not valid:
        return [r for r in results if r is not None]

    ops = _plan(session, scope, valid, conversation_id, occurred_at)
    # PostgreSQL inserts take theirs from the sequence inside the INSERT (no round trip).
    inline = session.get_bind().dialect.name == "postgresql"
    numbered = [op for op in ops if not (inline and op.inserted)]
    for op, seq in zip(numbered, next_seqs(session, len(numbered)), strict=True):
        op.values["updated_seq"] = seq
    retry = _apply(session, scope, ops)
    for op in ops:
        if op in retry:
            continue
        for position, (n, _draft, _item) in enumerate(op.items):
            created = position == 0 and op.inserted
            results[n] = BatchResult(
                outcome="created" if created else "updated", slug=op.slug, id=op.row_id
            )
    # Lost a race for a unique key: replay those items one by one (rare).
    for op in retry:
        for n, draft, item in op.items:
            row, outcome = save_note(
                session,
                settings,
                scope,
                draft,
                provenance=str(op.values["provenance"]),
                conversation_id=conversation_id,
                note_type=item.note_type,
                topic_key=item.topic_key,
                occurred_at=occurred_at,
            )
            results[n] = BatchResult(
                outcome="updated" if outcome == "updated" else "created", slug=row.slug, id=row.id
            )
    return [r for r in results if r is not None]


def _plan(
    session: Session,
    scope: Scope,
    valid: Sequence[tuple[int, Draft, BatchItem, str]],
    conversation_id: str | None,
    occurred_at: datetime | None,
) -> list[_Op]:
    """The rows to write, simulating the items' single writes in order."""
    by_slug_row, by_topic_row, taken = _batch_lookup(session, scope, valid)
    now = utcnow()
    ops: list[_Op] = []
    by_slug: dict[str, _Op] = {}
    by_topic: dict[str, _Op] = {}
    by_row: dict[int, _Op] = {}

    def update_op(row: dict[str, Any]) -> _Op:
        row_id = int(row["id"])
        if row_id not in by_row:
            by_row[row_id] = _Op(
                row["slug"],
                {},
                [],
                row_id=row_id,
                revive=row["status"] == ARCHIVED,
                current={c.key: row[c.key] for c in history.VERSIONED},
            )
            ops.append(by_row[row_id])
        return by_row[row_id]

    for n, draft, item, resolved in valid:
        terms = similarity_terms(draft.title, draft.topics)
        values = _draft_columns(draft, resolved, now, len(terms))
        if item.note_type is not None:
            values["type"] = item.note_type
        if conversation_id is not None:
            values["conversation_id"] = conversation_id
        if occurred_at is not None:
            values["occurred_at"] = occurred_at
        target: _Op | None = None
        if draft.slug is not None:
            target = by_slug.get(draft.slug)
            if target is None and draft.slug in by_slug_row:
                target = update_op(by_slug_row[draft.slug])
                by_slug[draft.slug] = target
        elif item.topic_key is not None:
            target = by_topic.get(item.topic_key)
            if target is None and item.topic_key in by_topic_row:
                target = update_op(by_topic_row[item.topic_key])
                by_topic[item.topic_key] = by_slug[target.slug] = target
        if target is not None:
            _write_over(
                target, scope, draft, item, values, conversation_id=conversation_id, now=now
            )
            target.items.append((n, draft, item))
            continue
        slug = draft.slug or _free_slug(base_slug_of(draft.title, item.topic_key), taken)
        taken.add(slug)
        op = _Op(
            slug,
            {
                **values,
                "type": item.note_type,
                "topic_key": item.topic_key,
                "conversation_id": conversation_id,
                "occurred_at": occurred_at,
            },
            [(n, draft, item)],
            inserted=True,
        )
        _write_over(op, scope, draft, item, {}, conversation_id=conversation_id, now=now)
        ops.append(op)
        by_slug[slug] = op
        if item.topic_key is not None:
            by_topic.setdefault(item.topic_key, op)
    return ops


def _write_over(
    op: _Op,
    scope: Scope,
    draft: Draft,
    item: BatchItem,
    values: dict[str, Any],
    *,
    conversation_id: str | None,
    now: datetime,
) -> None:
    """Fold a later write of the same note into ``op``, keeping the text it replaces."""
    if op.current is not None and history.changes_text(op.current, draft.title, draft.body):
        reason = history.upsert_reason(item.reason, explicit_slug=draft.slug is not None)
        change = history.Change(reason, str(values["provenance"]), conversation_id, now)
        op.versions.append(history.version_values(op.current, change))
    op.values.update(values)  # the later write wins, as in sequence
    op.current = {
        **(op.current or {}),
        **{key: op.values[key] for key in _TEXT_KEYS if key in op.values},
        "id": op.row_id,
        "scope_kind": scope.kind,
        "scope_id": scope.id,
        "slug": op.slug,
        "updated_at": now,
    }


# What a version needs of a planned write besides the note's identity.
_TEXT_KEYS = (
    "title",
    "body",
    "topics",
    "type",
    "pinned",
    "confidence",
    "provenance",
    "conversation_id",
)


def _apply(session: Session, scope: Scope, ops: list[_Op]) -> list[_Op]:
    """Write the planned rows and their terms; return the inserts a concurrent writer beat."""
    now = utcnow()
    updates = [op for op in ops if not op.inserted]
    if updates:
        session.execute(
            update(Memory).execution_options(synchronize_session=False),
            [
                {"id": op.row_id, **op.values, **({"status": LIVE} if op.revive else {})}
                for op in updates
            ],
        )
        session.execute(
            delete(MemoryTerm).where(MemoryTerm.memory_id.in_([op.row_id for op in updates]))
        )
    inserts = [op for op in ops if op.inserted]
    retry: list[_Op] = []
    for start in range(0, len(inserts), BATCH_CHUNK):
        chunk = inserts[start : start + BATCH_CHUNK]
        rows = [
            {
                **op.values,
                "scope_kind": scope.kind,
                "scope_id": scope.id,
                "slug": op.slug,
                "session_id": None,
                "superseded_by_id": None,
                "created_at": now,
                "status": LIVE,
                "weight": 1.0,
            }
            for op in chunk
        ]
        # executemany with RETURNING: one compiled statement, sent as multi-row INSERTs.
        stmt = dialect_insert(session, Memory.__table__)
        if "updated_seq" not in rows[0]:
            stmt = stmt.values(updated_seq=seq_expression(session))
        if hasattr(stmt, "on_conflict_do_nothing"):
            stmt = stmt.on_conflict_do_nothing()
        ids = {
            slug: int(row_id)
            for row_id, slug in session.execute(stmt.returning(Memory.id, Memory.slug), rows)
            if row_id is not None
        }
        for op in chunk:
            if op.slug in ids:
                op.row_id = ids[op.slug]
            else:
                retry.append(op)
    insert_terms(
        session,
        scope,
        [
            (int(op.row_id), term)
            for op in ops
            if op not in retry and op.row_id is not None
            for term in sorted(similarity_terms(op.values["title"], op.values["topics"]))
        ],
    )
    # The texts the batch replaced (an inserted note's id is known only now).
    history.keep(
        session,
        [{**v, "memory_id": op.row_id} for op in ops if op not in retry for v in op.versions],
    )
    return retry


def _free_slug(base: str, taken: set[str]) -> str:
    if base not in taken:
        return base
    n = 2
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


_IN_SCOPE = (Memory.scope_kind == bindparam("kind"), Memory.scope_id == bindparam("sid"))
# Built once: only the parameters change from batch to batch. Rows are locked as ``_by_key``
# locks them.
_BY_SLUGS, _BY_TOPIC_KEYS = (
    select(*history.VERSIONED, Memory.status, column.label("wanted_value"))
    .where(*_IN_SCOPE, column.in_(bindparam("wanted", expanding=True)))
    .order_by(Memory.id)
    .with_for_update()
    for column in (Memory.slug, Memory.topic_key)
)
_TAKEN_SLUGS = select(Memory.slug).where(
    *_IN_SCOPE, Memory.slug.in_(bindparam("wanted", expanding=True))
)


def _batch_lookup(
    session: Session, scope: Scope, valid: Sequence[tuple[int, Draft, BatchItem, str]]
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], set[str]]:
    """The scope's rows holding the batch's explicit slugs and topic keys (locked, as
    ``_by_key`` does; what history keeps of each, and ``status``), and every slug taken among
    the derived bases and their ``-N`` forms."""
    explicit = sorted({d.slug for _, d, _, _ in valid if d.slug is not None})
    keys = sorted({i.topic_key for _, d, i, _ in valid if d.slug is None and i.topic_key})
    bases = sorted({base_slug_of(d.title, i.topic_key) for _, d, i, _ in valid if d.slug is None})
    in_scope = {"kind": scope.kind, "sid": scope.id}
    by_slug: dict[str, dict[str, Any]] = {}
    by_topic: dict[str, dict[str, Any]] = {}
    for stmt, wanted, found in ((_BY_SLUGS, explicit, by_slug), (_BY_TOPIC_KEYS, keys, by_topic)):
        for start in range(0, len(wanted), ID_CHUNK):
            rows = session.execute(stmt, {**in_scope, "wanted": wanted[start : start + ID_CHUNK]})
            for row in rows:
                found[str(row.wanted_value)] = dict(row._mapping)
    taken: set[str] = set(by_slug)
    # Most bases are free: look them up exactly (an index probe each), and only for the
    # taken ones list their -N forms.
    busy: set[str] = set()
    for start in range(0, len(bases), ID_CHUNK):
        busy.update(
            session.execute(
                _TAKEN_SLUGS, {**in_scope, "wanted": bases[start : start + ID_CHUNK]}
            ).scalars()
        )
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
