"""An owner's notes, history and links as JSON Lines (``gleaner export``; docs/EXPORT.md).

The file is a header line, then one line per record, notes first (by ``updated_seq``, so the
order of their changes), then the notes' earlier versions (oldest first), then the links
(in the order they were made)::

    {"kind": "gleaner-export", "version": 1, "owner": ..., "exported_at": ..., "counts": ...}
    {"kind": "note", "slug": ..., "title": ..., "body": ..., ...}
    {"kind": "version", "slug": ..., "title": ..., ...}
    {"kind": "link", "from": ..., "to": ..., "rel": ..., "created_at": ...}

Every line is one JSON object in UTF-8 (characters as they are, not ``\\u`` escapes) ending
in ``\\n``; control characters (``\\r``, ``\\n``, tabs) inside text are JSON escapes, so a
line never breaks inside a record. Keys come in a fixed order and times are UTC ISO 8601
with microseconds: the same rows give the same bytes, whichever database they come from.

Left out, because the store assigns or derives them (``store.owners.restore`` rebuilds them as a
write does): row ids, ``updated_seq``, ``content_hash``, ``term_count``, ``search_length``,
the term and search index, ``superseded_by_id`` (the ``supersedes`` link says it). Not
exported at all: vectors (re-embedded), sessions, the harvest ledger, jobs, API keys.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any, cast

from sqlalchemy import Connection, Select, Table, func, select
from sqlalchemy.orm import aliased
from sqlalchemy.sql import FromClause

from gleaner.store.schema.models import Link, Memory, MemoryVersion
from gleaner.store.schema.tables import MEMORIES, utcnow
from gleaner.store.schemas import Scope

FORMAT = "gleaner-export"
VERSION = 1
# Rows fetched per round trip (a server-side cursor on PostgreSQL), and records between two
# progress reports.
FETCH = 1_000
PROGRESS_EVERY = 1_000

# The keys of each record, in the order they are written (docs/EXPORT.md).
NOTE_KEYS = (
    "kind",
    "slug",
    "title",
    "body",
    "type",
    "topics",
    "keywords",
    "topic_key",
    "provenance",
    "source",
    "evidence",
    "confidence",
    "pinned",
    "status",
    "conversation_id",
    "session_id",
    "occurred_at",
    "created_at",
    "updated_at",
    "weight",
)
VERSION_KEYS = (
    "kind",
    "slug",
    "title",
    "body",
    "type",
    "topics",
    "keywords",
    "evidence",
    "confidence",
    "pinned",
    "occurred_at",
    "written_provenance",
    "written_conversation_id",
    "written_at",
    "reason",
    "changed_provenance",
    "changed_conversation_id",
    "changed_at",
)
LINK_KEYS = ("kind", "from", "to", "rel", "created_at")
HEADER_KEYS = ("kind", "version", "owner", "exported_at", "counts")
SOURCE_KEYS = ("url", "artifact", "note")

_VERSIONS = cast(Table, MemoryVersion.__table__)
_LINKS = cast(Table, Link.__table__)
# A link's two notes.
_SOURCE, _TARGET = MEMORIES.alias("source"), MEMORIES.alias("target")


@dataclass(frozen=True)
class ExportCounts:
    """How many records of each kind an export holds (its header's ``counts``)."""

    notes: int
    versions: int
    links: int

    @property
    def records(self) -> int:
        return self.notes + self.versions + self.links

    def as_dict(self) -> dict[str, int]:
        return {"notes": self.notes, "versions": self.versions, "links": self.links}


def stamp(value: datetime | None) -> str | None:
    """A stored time as the file writes it: UTC ISO 8601 with microseconds (SQLite hands back
    naive UTC, PostgreSQL the session's zone: both give the same text)."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def line(record: Mapping[str, Any]) -> bytes:
    """One record as a line of the file."""
    text = json.dumps(record, ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8") + b"\n"


def _in_scope(table: FromClause, scope: Scope) -> tuple[Any, Any]:
    return table.c.scope_kind == scope.kind, table.c.scope_id == scope.id


def counts(conn: Connection, scope: Scope) -> ExportCounts:
    """The scope's notes, versions and links (a link counts with the scope of its source)."""

    def count(query: Any) -> int:
        return int(conn.execute(query).scalar_one())

    return ExportCounts(
        notes=count(select(func.count()).select_from(MEMORIES).where(*_in_scope(MEMORIES, scope))),
        versions=count(
            select(func.count()).select_from(_VERSIONS).where(*_in_scope(_VERSIONS, scope))
        ),
        links=count(_scope_links(select(func.count()), scope)),
    )


def _scope_links(query: Select[Any], scope: Scope) -> Select[Any]:
    """``query`` over the links whose source note is in ``scope`` (a link's two notes are
    always of one scope: ``store.notes.links``), the target joined by its id alone.

    Filtering the target by the scope too would invite PostgreSQL, when its statistics say
    the scope holds about one note (they lag behind an import), to join the two filtered
    sets first, every note by every note: measured, minutes at 20,000 notes."""
    return (
        query.select_from(_LINKS)
        .join(_SOURCE, _SOURCE.c.id == _LINKS.c.from_id)
        .join(_TARGET, _TARGET.c.id == _LINKS.c.to_id)
        .where(*_in_scope(_SOURCE, scope))
    )


def _source(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not value:
        return None
    known = {key: value[key] for key in SOURCE_KEYS if key in value}
    return known | {key: value[key] for key in sorted(value) if key not in SOURCE_KEYS}


def _evidence(value: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not value:
        return None
    return [{"speaker": item.get("speaker"), "quote": item.get("quote")} for item in value]


def _words(value: str | None) -> list[str]:
    return (value or "").split()


def note_record(row: Mapping[Any, Any]) -> dict[str, Any]:
    """The ``note`` record of a ``memories`` row."""
    return {
        "kind": "note",
        "slug": row["slug"],
        "title": row["title"],
        "body": row["body"],
        "type": row["type"],
        "topics": _words(row["topics"]),
        "keywords": _words(row["keywords"]),
        "topic_key": row["topic_key"],
        "provenance": row["provenance"],
        "source": _source(row["source"]),
        "evidence": _evidence(row["evidence"]),
        "confidence": row["confidence"],
        "pinned": bool(row["pinned"]),
        "status": row["status"],
        "conversation_id": row["conversation_id"],
        "session_id": row["session_id"],
        "occurred_at": stamp(row["occurred_at"]),
        "created_at": stamp(row["created_at"]),
        "updated_at": stamp(row["updated_at"]),
        "weight": float(row["weight"]),
    }


def version_record(row: Mapping[Any, Any]) -> dict[str, Any]:
    """The ``version`` record of a ``memory_versions`` row; ``slug`` is its note's."""
    return {
        "kind": "version",
        "slug": row["note_slug"],
        "title": row["title"],
        "body": row["body"],
        "type": row["type"],
        "topics": _words(row["topics"]),
        "keywords": _words(row["keywords"]),
        "evidence": _evidence(row["evidence"]),
        "confidence": row["confidence"],
        "pinned": bool(row["pinned"]),
        "occurred_at": stamp(row["occurred_at"]),
        "written_provenance": row["written_provenance"],
        "written_conversation_id": row["written_conversation_id"],
        "written_at": stamp(row["written_at"]),
        "reason": row["reason"],
        "changed_provenance": row["changed_provenance"],
        "changed_conversation_id": row["changed_conversation_id"],
        "changed_at": stamp(row["changed_at"]),
    }


def records(conn: Connection, scope: Scope) -> Iterator[dict[str, Any]]:
    """The scope's records in file order (no header), fetched ``FETCH`` rows at a time."""
    notes = (
        select(MEMORIES)
        .where(*_in_scope(MEMORIES, scope))
        .order_by(MEMORIES.c.updated_seq, MEMORIES.c.id)
    )
    for row in conn.execute(notes.execution_options(yield_per=FETCH)):
        yield note_record(row._mapping)
    # A version's own slug column is always its note's (slugs never change): the join says it.
    note = aliased(Memory)
    versions = (
        select(_VERSIONS, note.slug.label("note_slug"))
        .join(note, note.id == _VERSIONS.c.memory_id)
        .where(*_in_scope(_VERSIONS, scope))
        .order_by(_VERSIONS.c.id)
    )
    for row in conn.execute(versions.execution_options(yield_per=FETCH)):
        yield version_record(row._mapping)
    links = _scope_links(
        select(_SOURCE.c.slug, _TARGET.c.slug, _LINKS.c.rel, _LINKS.c.created_at), scope
    ).order_by(_LINKS.c.id)
    for from_slug, to_slug, rel, created_at in conn.execute(
        links.execution_options(yield_per=FETCH)
    ):
        yield {
            "kind": "link",
            "from": from_slug,
            "to": to_slug,
            "rel": rel,
            "created_at": stamp(created_at),
        }


def header(scope: Scope, found: ExportCounts, exported_at: datetime) -> dict[str, Any]:
    """The first line: what the file is, whose notes, when, and how many records follow."""
    return {
        "kind": FORMAT,
        "version": VERSION,
        "owner": scope.id,
        "exported_at": stamp(exported_at),
        "counts": found.as_dict(),
    }


def lines(conn: Connection, scope: Scope) -> Iterator[bytes]:
    """The whole file, line by line, read on ``conn`` (one snapshot: ``Store.snapshot``)."""
    found = counts(conn, scope)
    yield line(header(scope, found, utcnow()))
    for record in records(conn, scope):
        yield line(record)


def write(
    conn: Connection,
    scope: Scope,
    out: IO[bytes] | IO[str],
    *,
    progress: Callable[[int, int], None] | None = None,
) -> ExportCounts:
    """Write the scope's export to ``out`` (binary, or text: then UTF-8 is its encoding's
    business); ``progress`` gets ``(records written, records in all)`` every
    ``PROGRESS_EVERY`` records and at the end."""
    found = counts(conn, scope)
    put = _writer(out)
    put(line(header(scope, found, utcnow())))
    done = 0
    for record in records(conn, scope):
        put(line(record))
        done += 1
        if progress is not None and done % PROGRESS_EVERY == 0:
            progress(done, found.records)
    if progress is not None:
        progress(done, found.records)
    return found


def _writer(out: IO[bytes] | IO[str]) -> Callable[[bytes], object]:
    if isinstance(out, io.TextIOBase):
        text = cast(IO[str], out)
        return lambda data: text.write(data.decode("utf-8"))
    return cast(IO[bytes], out).write
