"""Restoring an owner's export (``store.owners.export``, docs/EXPORT.md) into an empty scope.

Two passes over the file, which is read a line at a time (never whole):

1. **Check**: every line is parsed and validated (the file's schema, the write rules a note's
   text, slug, topics, source and evidence obey, the unique keys of a scope, links between
   notes above them, the ``supersedes`` rules, the header's counts). The first bad line
   raises ``BadExport`` naming its number; nothing is written.
2. **Write**, in one transaction: the notes (new ids and ``updated_seq`` in file order, so
   the order of their changes is kept), their term and search index rows built as a write
   builds them, their versions, their links (a ``supersedes`` link sets its target's
   ``superseded_by_id``). Any failure rolls it all back.

The target scope must hold no note, checked before the first pass and again, under a lock,
in the write's transaction. What the file says of each note is what was stored, and is
written as it is: provenance, pinning, status, times and weight (they were settled by the
store's rules when the note was written, and a restore puts back what was). No vector is
written: restored notes wait for ``gleaner embed --backfill``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any, cast

from sqlalchemy import Connection, Table, bindparam, func, insert, select, text, update

from gleaner.config.store import StoreSettings
from gleaner.store.errors import BadExport, InvalidInput
from gleaner.store.notes.fact_terms import similarity_terms
from gleaner.store.notes.term_index import insert_terms
from gleaner.store.owners.export_records import (
    REQUIRED,
    LinkRecord,
    json_object,
    link_record,
    note_row,
    version_row,
)
from gleaner.store.owners.restore_check import check_records, raw_lines, read_header
from gleaner.store.recall.search_index import Postings, insert_postings, postings_of
from gleaner.store.schema.models import Link, MemoryVersion
from gleaner.store.schema.sql import dialect_name, next_seqs
from gleaner.store.schema.tables import MEMORIES
from gleaner.store.schemas import Scope
from gleaner.store.text import check_principal, quoted

# Rows per multi-row INSERT: well under SQLite's bound-parameter limit.
WRITE_CHUNK = 400
# Records between two progress reports.
PROGRESS_EVERY = 1_000
# The longest line read: far over any record the store can hold (a body of max_body_bytes,
# every character a six-byte JSON escape, plus the rest), far under what would hurt.
MIN_LINE_LIMIT = 1 << 20

_VERSIONS = cast(Table, MemoryVersion.__table__)
_LINKS = cast(Table, Link.__table__)

Begin = Callable[[], AbstractContextManager[Connection]]
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class RestoreResult:
    """What a restore wrote, and whose export it was."""

    owner: str
    notes: int
    versions: int
    links: int
    exported_owner: str
    exported_at: datetime


# --- the second pass ---------------------------------------------------------------------


class _Writer:
    """Writes the records of one file, in order, into one scope, in batches of one kind."""

    def __init__(self, conn: Connection, scope: Scope) -> None:
        self.conn = conn
        self.scope = scope
        self.ids: dict[str, int] = {}
        self.kind: str | None = None
        self.batch: list[Any] = []

    def add(self, kind: str, item: Any) -> None:
        if kind != self.kind or len(self.batch) >= WRITE_CHUNK:
            self.flush()
            self.kind = kind
        self.batch.append(item)

    def flush(self) -> None:
        batch, self.batch = self.batch, []
        if not batch:
            return
        if self.kind == "note":
            self._notes(batch)
        elif self.kind == "version":
            self._versions(batch)
        else:
            self._links(batch)

    def _notes(self, rows: list[dict[str, Any]]) -> None:
        """Insert notes with what a write keeps beside them: similarity terms, search
        postings and the lengths they give (``store.notes.writer``'s rules)."""
        scope = self.scope
        terms: dict[str, list[str]] = {}
        postings: dict[str, Postings] = {}
        values = []
        for row, seq in zip(rows, next_seqs(self.conn, len(rows)), strict=True):
            slug = row["slug"]
            terms[slug] = sorted(similarity_terms(row["title"], row["topics"]))
            postings[slug] = postings_of(row)
            values.append(
                {
                    **row,
                    "scope_kind": scope.kind,
                    "scope_id": scope.id,
                    "superseded_by_id": None,
                    "updated_seq": seq,
                    "term_count": len(terms[slug]),
                    "search_length": postings[slug].length,
                }
            )
        returned = self.conn.execute(
            insert(MEMORIES).returning(MEMORIES.c.id, MEMORIES.c.slug), values
        )
        new = {str(slug): int(note_id) for note_id, slug in returned}
        self.ids.update(new)
        insert_terms(
            self.conn, scope, [(new[slug], term) for slug in terms for term in terms[slug]]
        )
        insert_postings(self.conn, scope, [(new[slug], postings[slug]) for slug in postings])

    def _versions(self, rows: list[dict[str, Any]]) -> None:
        self.conn.execute(
            insert(_VERSIONS),
            [
                {
                    **row,
                    "memory_id": self.ids[row["slug"]],
                    "scope_kind": self.scope.kind,
                    "scope_id": self.scope.id,
                }
                for row in rows
            ],
        )

    def _links(self, links: list[tuple[LinkRecord, datetime]]) -> None:
        self.conn.execute(
            insert(_LINKS),
            [
                {
                    "from_id": self.ids[found.from_],
                    "to_id": self.ids[found.to],
                    "rel": found.rel,
                    "created_at": found.created_at or now,
                }
                for found, now in links
            ],
        )
        superseding = [
            {"keeper": self.ids[found.from_], "loser": self.ids[found.to]}
            for found, _ in links
            if found.rel == "supersedes"
        ]
        if superseding:
            # The note's status, times and seq are the file's: only the pointer is derived.
            self.conn.execute(
                update(MEMORIES)
                .where(MEMORIES.c.id == bindparam("loser"))
                .values(superseded_by_id=bindparam("keeper")),
                superseding,
            )


def _notes_held(conn: Connection, scope: Scope) -> int:
    return int(
        conn.execute(
            select(func.count())
            .select_from(MEMORIES)
            .where(MEMORIES.c.scope_kind == scope.kind, MEMORIES.c.scope_id == scope.id)
        ).scalar_one()
    )


def _refuse_held(conn: Connection, scope: Scope) -> None:
    held = _notes_held(conn, scope)
    if held:
        raise InvalidInput(
            f"owner {quoted(scope.id)} already has {held} note(s): a restore needs an owner "
            "with none. Restore under another owner (--owner NAME --reassign-owner), or "
            f"forget this one first (gleaner forget --owner {quoted(scope.id)})",
            reason="scope_not_empty",
        )


def write(
    conn: Connection,
    scope: Scope,
    lines: Iterator[bytes],
    settings: StoreSettings,
    *,
    on_record: Callable[[int], None] | None = None,
) -> dict[str, int]:
    """The second pass, on ``conn`` inside the caller's transaction: every record of a file
    ``check`` passed, written into ``scope``, which must still hold no note."""
    if dialect_name(conn) == "postgresql":
        from gleaner.store.owners.forget import lock_key

        # The lock a forget holds: no harvest of the owner commits between this check that
        # the scope is empty and this transaction's commit (a harvest takes it shared).
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": lock_key(scope)})
    _refuse_held(conn, scope)
    next(lines)  # the header, checked in the first pass
    writer = _Writer(conn, scope)
    written = {"note": 0, "version": 0, "link": 0}
    now = datetime.now(UTC)
    for number, raw in enumerate(lines, start=2):
        data = json_object(raw, number)
        kind = data.get("kind")
        if kind == "note":
            writer.add("note", note_row(data, settings, number))
        elif kind == "version":
            writer.add("version", version_row(data, settings, number))
        elif kind == "link":
            writer.add("link", (link_record(data, number), now))
        else:  # the file changed since it was checked
            raise BadExport(f"unknown record kind {quoted(kind)}", line=number)
        written[str(kind)] += 1
        if on_record is not None:
            on_record(number - 1)
    writer.flush()
    return written


# --- the whole restore -------------------------------------------------------------------


def restore(
    begin: Begin,
    settings: StoreSettings,
    fp: IO[bytes] | IO[str],
    *,
    owner: str | None = None,
    reassign_owner: bool = False,
    progress: Progress | None = None,
) -> RestoreResult:
    """Restore the export ``fp`` (read from where it is; a binary file, or text) into the
    file's owner, or ``owner``: another owner than the file's only with ``reassign_owner``.
    ``begin()`` opens one transaction on a Core connection (``Store.connection``).

    ``progress`` gets ``(steps done, steps in all)``: each record is a step when checked
    and another when written. Raises ``BadExport`` (a line is bad: nothing written),
    ``InvalidInput`` (``bad_owner``: the owner; ``scope_not_empty``: the owner has notes).
    """
    limit = max(MIN_LINE_LIMIT, 8 * settings.max_body_bytes)
    with ExitStack() as stack:
        source = raw_lines(fp, limit)
        spool: IO[bytes] | None = None
        start = 0
        if fp.seekable():
            start = fp.tell()
        else:
            # A pipe is read once: copied to a temporary file as it is checked, written from
            # there (on disk: a large owner's file is never held in memory).
            spool = stack.enter_context(tempfile.TemporaryFile())
            source = _copied(source, spool)
        header = read_header(next(source, None))
        file_owner = check_principal(header.owner)
        target = _target(file_owner, owner, reassign_owner)
        with begin() as conn:
            _refuse_held(conn, target)
        total = 2 * (header.counts.notes + header.counts.versions + header.counts.links)
        report = _reporter(progress, total)
        checked = sum(check_records(source, header, settings, on_record=report).counts.values())
        (spool or fp).seek(start)
        again = raw_lines(spool or fp, limit)
        with begin() as conn:
            written = write(conn, target, again, settings, on_record=lambda n: report(checked + n))
        if progress is not None:
            progress(total, total)
    return RestoreResult(
        owner=target.id,
        notes=written["note"],
        versions=written["version"],
        links=written["link"],
        exported_owner=file_owner,
        exported_at=header.exported_at,
    )


def _copied(lines: Iterator[bytes], spool: IO[bytes]) -> Iterator[bytes]:
    for raw in lines:
        spool.write(raw)
        yield raw


def _target(file_owner: str, owner: str | None, reassign_owner: bool) -> Scope:
    """The scope to restore into: the file's owner, unless reassigned explicitly."""
    if owner is None:
        if reassign_owner:
            raise InvalidInput(
                "reassign_owner needs the owner to reassign to (--owner NAME)", reason="bad_owner"
            )
        return Scope.owner(file_owner)
    target = Scope.owner(check_principal(owner))  # a bad name is bad_owner, as elsewhere
    if target.id != file_owner and not reassign_owner:
        raise InvalidInput(
            f"the file holds the notes of {quoted(file_owner)}, not {quoted(target.id)}: to "
            "restore them as another owner's, say so (--reassign-owner; "
            "reassign_owner=True)",
            reason="bad_owner",
        )
    return target


def _reporter(progress: Progress | None, total: int) -> Callable[[int], None]:
    def report(done: int) -> None:
        if progress is not None and done % PROGRESS_EVERY == 0:
            progress(done, total)

    return report


# The public names; callers import those of store.owners.export_records from here too.
__all__ = [
    "MIN_LINE_LIMIT",
    "PROGRESS_EVERY",
    "REQUIRED",
    "WRITE_CHUNK",
    "Begin",
    "Progress",
    "RestoreResult",
    "restore",
    "write",
]
