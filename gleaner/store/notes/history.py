"""Note history: every text a change replaces is kept (``memory_versions``).

Writers call ``keep`` with the row as it was, before they change its title or body, in the
same transaction as the change; only ``forget`` deletes a version (with its note).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from gleaner.store.errors import NotFound
from gleaner.store.schema.models import Memory, MemoryVersion
from gleaner.store.schemas import NoteVersion, Scope
from gleaner.store.text import quoted

if TYPE_CHECKING:
    from gleaner.store.schema.sql import Executor

# Why a note's text changed: an explicit-slug or topic-key upsert, mem_save's topic-key
# upsert, or harvest rewriting a note with a candidate holding the same fact.
REASONS = (
    "slug_upsert",
    "topic_key_upsert",
    "mem_save_upsert",
    "harvest_same_fact",
    "older_fact",  # a fact said before the live one: kept in history at its time
)


def upsert_reason(reason: str | None, *, explicit_slug: bool) -> str:
    """``reason`` when the caller gave one, else which key the upsert went by."""
    return reason or ("slug_upsert" if explicit_slug else "topic_key_upsert")


# The columns of ``memories`` a version copies (the replaced text and who wrote it).
VERSIONED = (
    Memory.id,
    Memory.scope_kind,
    Memory.scope_id,
    Memory.slug,
    Memory.title,
    Memory.body,
    Memory.topics,
    Memory.keywords,
    Memory.topic_key,
    Memory.type,
    Memory.pinned,
    Memory.confidence,
    Memory.evidence,
    Memory.provenance,
    Memory.conversation_id,
    Memory.occurred_at,
    Memory.updated_at,
)


@dataclass(frozen=True)
class Change:
    """Why a note's text changes and who changes it."""

    reason: str
    provenance: str
    conversation_id: str | None
    at: datetime


def version_values(row: Mapping[str, Any], change: Change) -> dict[str, Any]:
    """The ``memory_versions`` row keeping ``row`` (a mapping of ``VERSIONED`` columns)."""
    return {
        "memory_id": row["id"],
        "scope_kind": row["scope_kind"],
        "scope_id": row["scope_id"],
        "slug": row["slug"],
        "title": row["title"],
        "body": row["body"],
        "topics": row["topics"] or "",
        "keywords": row.get("keywords") or "",
        "type": row["type"],
        "pinned": bool(row["pinned"]),
        "confidence": row["confidence"],
        "evidence": row.get("evidence"),
        "occurred_at": row.get("occurred_at"),
        "written_provenance": row["provenance"],
        "written_conversation_id": row["conversation_id"],
        "written_at": row["updated_at"],
        "reason": change.reason,
        "changed_provenance": change.provenance,
        "changed_conversation_id": change.conversation_id,
        "changed_at": change.at,
    }


def of_note(note: Memory) -> dict[str, Any]:
    """``VERSIONED`` columns of a loaded note, before it is changed."""
    return {column.key: getattr(note, column.key) for column in VERSIONED}


def keep(session: Executor, versions: Sequence[dict[str, Any]]) -> None:
    """Insert version rows (``version_values``); the caller owns the transaction."""
    if versions:
        session.execute(insert(MemoryVersion), list(versions))


def changes_text(row: Mapping[str, Any], title: str, body: str) -> bool:
    """Whether writing ``title``/``body`` over ``row`` changes its text (and so needs a version)."""
    return bool(row["title"] != title or row["body"] != body)


def history(session: Session, scope: Scope | tuple[str, str], slug: str) -> list[NoteVersion]:
    """The note's earlier versions, newest first; NotFound when the scope has no such slug."""
    scope = Scope.of(scope)
    note_id = session.execute(
        select(Memory.id).where(
            Memory.scope_kind == scope.kind, Memory.scope_id == scope.id, Memory.slug == slug
        )
    ).scalar_one_or_none()
    if note_id is None:
        raise NotFound(f"no note {quoted(slug)} in scope {scope}")
    # By when each version's fact was said, newest first (an older fact imported later
    # takes its place in time), then by when it was kept.
    said = func.coalesce(MemoryVersion.occurred_at, MemoryVersion.written_at)
    rows = session.execute(
        select(MemoryVersion)
        .where(MemoryVersion.memory_id == note_id)
        .order_by(said.desc(), MemoryVersion.id.desc())
    ).scalars()
    return [NoteVersion.model_validate(v, from_attributes=True) for v in rows]
