"""Writing and reading notes: ``write`` (one), ``write_batch`` (many), ``get``.

Both writes validate with ``store.notes.drafts`` and go through the one writer,
``store.notes.writer``:
a single write is a batch of one. Functions here take the caller's session and never commit:
one transaction per unit of work, owned by the caller (``Store`` for single calls, the
harvest job for a batch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from gleaner.config.store import StoreSettings
from gleaner.store.errors import InvalidInput
from gleaner.store.notes.drafts import (
    Draft,
    check_instruction,
    check_pin,
    resolve_provenance,
    validate_attrs,
)
from gleaner.store.notes.similar import similar_notes
from gleaner.store.notes.write_item import Expect as _Expect
from gleaner.store.notes.write_item import Item, Written
from gleaner.store.notes.writer import write_items
from gleaner.store.schema.models import Memory
from gleaner.store.schemas import Note, Scope, WriteResult
from gleaner.store.text import check_text, check_topic_key

# What a harvest's rewrite of a stored note assumed of it (``BatchItem.expect``).
Expect = _Expect

if TYPE_CHECKING:
    from gleaner.store.schema.sql import Executor


def write(
    session: Session,
    settings: StoreSettings,
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
    code that writes typed notes, such as harvest; a caller that does not show ``similar``
    to anyone passes ``with_similar=False`` to skip that query.
    """
    scope = Scope.of(scope)
    draft = validate_attrs(attrs, settings)
    check_instruction(draft.title, draft.body, settings)
    resolved = resolve_provenance(provenance, draft.source)
    check_pin(draft, resolved, allow_pin_untrusted=allow_pin_untrusted)
    if conversation_id is not None:
        conversation_id = check_text(conversation_id, "conversation_id", max_bytes=255)
    if topic_key is not None:
        check_topic_key(topic_key)
    (written,) = write_items(
        session,
        scope,
        [Item(draft, resolved, note_type=note_type, topic_key=topic_key)],
        conversation_id=conversation_id,
        occurred_at=occurred_at,
        rows=True,
    )
    assert written.row is not None  # rows=True
    note = Note.from_row(written.row)
    created = written.outcome == "created"
    if not with_similar:
        return WriteResult(memory=note, created=created, similar=[])
    similar = similar_notes(
        session,
        scope,
        draft.title,
        draft.topics,
        threshold=settings.similar_threshold,
        exclude_id=note.id,
    )
    return WriteResult(memory=note, created=created, similar=similar)


def save_draft(
    session: Session,
    scope: Scope,
    draft: Draft,
    *,
    provenance: str,
    note_type: str | None = None,
    topic_key: str | None = None,
    session_id: str | None = None,
    reason: str | None = None,
) -> Written:
    """Write one draft its caller checked by its own rules (``mem_save``'s observations)."""
    (written,) = write_items(
        session,
        scope,
        [Item(draft, provenance, note_type=note_type, topic_key=topic_key, reason=reason)],
        session_id=session_id,
    )
    return written


def get(session: Session, scope: Scope | tuple[str, str], slug: str) -> Note | None:
    """The note with ``slug`` in the scope, or None."""
    scope = Scope.of(scope)
    row = session.execute(
        select(Memory).where(
            Memory.scope_kind == scope.kind, Memory.scope_id == scope.id, Memory.slug == slug
        )
    ).scalar_one_or_none()
    return None if row is None else Note.from_row(row)


@dataclass(frozen=True)
class BatchItem:
    """One note of a batch: its attrs and, for typed notes, its type and topic key."""

    attrs: Mapping[str, object]
    note_type: str | None = None
    topic_key: str | None = None
    # Why an update replaces a note's text (history); default slug_upsert / topic_key_upsert.
    reason: str | None = None
    # A harvest's rewrite of a note it read without a lock: what it assumed of that note.
    expect: Expect | None = None


@dataclass(frozen=True)
class BatchResult:
    """What became of one batch item: ``created``/``updated`` with the note, or ``invalid``."""

    outcome: Literal["created", "updated", "invalid"]
    slug: str | None = None
    id: int | None = None
    error: InvalidInput | None = None


def write_batch(
    session: Executor,
    settings: StoreSettings,
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
    written); items interact as sequential writes would (``store.notes.writer``). The caller owns
    the transaction. ``similar`` is not computed.
    """
    scope = Scope.of(scope)
    if conversation_id is not None:
        conversation_id = check_text(conversation_id, "conversation_id", max_bytes=255)
    results: list[BatchResult | None] = [None] * len(items)
    valid: list[tuple[int, Item]] = []
    for n, item in enumerate(items):
        try:
            draft = validate_attrs(item.attrs, settings)
            check_instruction(draft.title, draft.body, settings)
            resolved = resolve_provenance(provenance, draft.source)
            check_pin(draft, resolved, allow_pin_untrusted=allow_pin_untrusted)
            if item.topic_key is not None:
                check_topic_key(item.topic_key)
        except InvalidInput as exc:
            results[n] = BatchResult(outcome="invalid", error=exc)
            continue
        valid.append(
            (n, Item(draft, resolved, item.note_type, item.topic_key, item.reason, item.expect))
        )
    written = write_items(
        session,
        scope,
        [item for _, item in valid],
        conversation_id=conversation_id,
        occurred_at=occurred_at,
    )
    for (n, _), done in zip(valid, written, strict=True):
        outcome: Literal["created", "updated"] = (
            "created" if done.outcome == "created" else "updated"
        )
        results[n] = BatchResult(outcome=outcome, slug=done.slug, id=done.id or None)
    return [r for r in results if r is not None]
