"""Restoring an owner's export (``store.export``, docs/EXPORT.md) into an empty scope.

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

import json
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Annotated, Any, Literal, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
)
from sqlalchemy import Connection, Table, bindparam, func, insert, select, text, update

from store.drafts import Draft, validate_attrs
from store.errors import BadExport, InvalidInput
from store.export import FORMAT as EXPORT_FORMAT
from store.export import VERSION as EXPORT_VERSION
from store.fact_terms import similarity_terms
from store.history import REASONS
from store.instructions import instruction_flag
from store.models import Link, MemoryVersion
from store.schemas import RELS, Scope
from store.search_index import Postings, insert_postings, postings_of
from store.settings import Settings
from store.sql import dialect_name, next_seqs
from store.tables import ARCHIVED, LIVE, MEMORIES, SUPERSEDED
from store.term_index import insert_terms
from store.text import check_principal, check_text, check_topic_key, content_hash, quoted

# Provenances a stored note (or version) can have: ``web``/``agent`` from attrs, the rest
# passed by code (store.drafts).
PROVENANCES = ("agent", "web", "user", "compaction", "import")
STATUSES = (LIVE, SUPERSEDED, ARCHIVED)
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


# --- the records' schema ---------------------------------------------------------------


def _when(value: object) -> object:
    """An ISO 8601 time with its UTC offset, as a UTC datetime."""
    if not isinstance(value, str):
        raise InvalidInput(f"a time is an ISO 8601 string, got {quoted(value)}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInput(f"{quoted(value)} is not an ISO 8601 time") from None
    if parsed.tzinfo is None:
        raise InvalidInput(f"the time {quoted(value)} has no UTC offset (write +00:00)")
    return parsed.astimezone(UTC)


def _text(name: str, max_bytes: int) -> Any:
    """A before-validator: optional text under ``check_text``'s rules (no NUL, UTF-8)."""

    def check(value: object) -> object:
        return None if value is None else check_text(value, name, max_bytes=max_bytes)

    return BeforeValidator(check)


def _one_of(allowed: Sequence[str]) -> Any:
    def check(value: str) -> str:
        if value not in allowed:
            raise InvalidInput(f"{quoted(value)} is not one of {', '.join(allowed)}")
        return value

    return AfterValidator(check)


def _topic_key(value: object) -> object:
    return None if value is None else check_topic_key(cast(str, value))


When = Annotated[datetime, BeforeValidator(_when)]
NoteType = Annotated[str | None, _text("type", 32)]
Provenance = Annotated[str, _one_of(PROVENANCES)]
ConversationId = Annotated[str | None, _text("conversation_id", 255)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _Counts(_Strict):
    notes: int = Field(ge=0)
    versions: int = Field(ge=0)
    links: int = Field(ge=0)


class _Header(_Strict):
    kind: str
    version: int
    owner: str
    exported_at: When
    counts: _Counts


class _NoteFields(_Strict):
    """A note record's keys besides those ``validate_attrs`` checks."""

    kind: Literal["note"]
    type: NoteType = None
    topic_key: Annotated[str | None, BeforeValidator(_topic_key)] = None
    provenance: Provenance
    status: Annotated[str, _one_of(STATUSES)] = LIVE
    conversation_id: ConversationId = None
    session_id: Annotated[str | None, _text("session_id", 64)] = None
    occurred_at: When | None = None
    created_at: When
    updated_at: When
    weight: float = Field(default=1.0, ge=0, allow_inf_nan=False)


class _VersionFields(_Strict):
    """A version record's keys besides those ``validate_attrs`` checks."""

    kind: Literal["version"]
    slug: str
    type: NoteType = None
    occurred_at: When | None = None
    written_provenance: Provenance
    written_conversation_id: ConversationId = None
    written_at: When
    reason: Annotated[str, _one_of(REASONS)]
    changed_provenance: Provenance
    changed_conversation_id: ConversationId = None
    changed_at: When


class _LinkRecord(_Strict):
    kind: Literal["link"]
    from_: str = Field(alias="from")
    to: str
    rel: Annotated[str, _one_of(RELS)]
    created_at: When | None = None


# The keys ``validate_attrs`` checks (the write rules of a note's content), per record kind.
_NOTE_ATTRS = (
    "slug",
    "title",
    "body",
    "topics",
    "keywords",
    "pinned",
    "confidence",
    "source",
    "evidence",
)
_VERSION_ATTRS = ("title", "body", "topics", "keywords", "pinned", "confidence", "evidence")
REQUIRED = {
    "note": ("slug", "title", "body", "provenance", "created_at", "updated_at"),
    "version": (
        "slug",
        "title",
        "body",
        "written_provenance",
        "written_at",
        "reason",
        "changed_provenance",
        "changed_at",
    ),
    "link": ("from", "to", "rel"),
}


def _fields_error(exc: ValidationError, what: str) -> tuple[str, str | None]:
    """The first problem pydantic found, as a message and the rule's reason if one said."""
    errors = exc.errors(include_url=False)
    extra = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
    if extra:
        return f"unknown key(s) {', '.join(extra)} (docs/EXPORT.md lists each record's)", None
    first = errors[0]
    cause = (first.get("ctx") or {}).get("error")
    name = ".".join(str(part) for part in first["loc"])
    if isinstance(cause, InvalidInput):
        reason = cause.reason if cause.reason != InvalidInput.reason else None
        # A rule's message names its field, or else is told which.
        named = cause.message.startswith(name)
        return cause.message if named else f"{name}: {cause.message}", reason
    return f"{name}: {first['msg']}" if name else first["msg"], None


def _model(model: type[_Strict], data: Mapping[str, Any], what: str, number: int) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, rule = _fields_error(exc, what)
        raise BadExport(f"{what}: {message}", line=number, rule=rule) from None


def _attrs(
    data: Mapping[str, Any], keys: Sequence[str], settings: Settings, what: str, n: int
) -> Draft:
    """``data``'s note content checked by the write rules (``store.drafts.validate_attrs``);
    a version has no slug of its own, so it is checked as a draft without one."""
    attrs = {key: data[key] for key in keys if key in data}
    try:
        return validate_attrs(attrs, settings)
    except InvalidInput as exc:
        raise BadExport(f"{what}: {exc.message} ({exc.reason})", line=n, rule=exc.reason) from None


def _require(data: Mapping[str, Any], kind: str, what: str, number: int) -> None:
    missing = [key for key in REQUIRED[kind] if key not in data]
    if missing:
        raise BadExport(f"{what} has no {', '.join(map(repr, missing))}", line=number)


def _note_row(data: Mapping[str, Any], settings: Settings, number: int) -> dict[str, Any]:
    """A note record as the ``memories`` columns a restore writes (no id, seq or indexes)."""
    what = f"note {quoted(data.get('slug'))}"
    _require(data, "note", what, number)
    draft = _attrs(data, _NOTE_ATTRS, settings, what, number)
    rest = {key: value for key, value in data.items() if key not in _NOTE_ATTRS}
    fields = cast(_NoteFields, _model(_NoteFields, rest, what, number))
    return {
        "slug": draft.slug,
        "title": draft.title,
        "body": draft.body,
        "type": fields.type,
        "topics": draft.topics,
        "keywords": draft.keywords,
        "topic_key": fields.topic_key,
        "session_id": fields.session_id,
        "provenance": fields.provenance,
        "source": draft.source,
        "evidence": None if draft.evidence is None else list(draft.evidence),
        "confidence": draft.confidence,
        "flag": instruction_flag(draft.title, draft.body),
        "pinned": draft.pinned,
        "status": fields.status,
        "conversation_id": fields.conversation_id,
        "content_hash": content_hash(draft.body),
        "occurred_at": fields.occurred_at,
        "created_at": fields.created_at,
        "updated_at": fields.updated_at,
        "weight": fields.weight,
    }


def _version_row(data: Mapping[str, Any], settings: Settings, number: int) -> dict[str, Any]:
    """A version record as ``memory_versions`` columns, ``slug`` naming its note."""
    what = f"version of {quoted(data.get('slug'))}"
    _require(data, "version", what, number)
    draft = _attrs(data, _VERSION_ATTRS, settings, what, number)
    rest = {key: value for key, value in data.items() if key not in _VERSION_ATTRS}
    fields = cast(_VersionFields, _model(_VersionFields, rest, what, number))
    return {
        "slug": fields.slug,
        "title": draft.title,
        "body": draft.body,
        "topics": draft.topics,
        "keywords": draft.keywords,
        "type": fields.type,
        "pinned": draft.pinned,
        "confidence": draft.confidence,
        "evidence": None if draft.evidence is None else list(draft.evidence),
        "occurred_at": fields.occurred_at,
        "written_provenance": fields.written_provenance,
        "written_conversation_id": fields.written_conversation_id,
        "written_at": fields.written_at,
        "reason": fields.reason,
        "changed_provenance": fields.changed_provenance,
        "changed_conversation_id": fields.changed_conversation_id,
        "changed_at": fields.changed_at,
    }


def _link(data: Mapping[str, Any], number: int) -> _LinkRecord:
    what = f"link {quoted(data.get('from'))} {quoted(data.get('rel'))} {quoted(data.get('to'))}"
    _require(data, "link", what, number)
    return cast(_LinkRecord, _model(_LinkRecord, data, what, number))


# --- reading lines ---------------------------------------------------------------------


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"the key {key!r} appears twice")
        found[key] = value
    return found


def _object(raw: bytes, number: int) -> dict[str, Any]:
    """One line as a JSON object."""
    try:
        line = raw.removesuffix(b"\n").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadExport(f"not UTF-8 (byte {exc.start})", line=number) from None
    if not line.strip():
        raise BadExport("the line is empty: every line is one JSON object", line=number)
    try:
        found = json.loads(line, parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise BadExport(f"not JSON ({exc.msg}, column {exc.colno})", line=number) from None
    except ValueError as exc:
        raise BadExport(f"not valid JSON here: {exc}", line=number) from None
    if not isinstance(found, dict):
        raise BadExport("not a JSON object: every line is one", line=number)
    return found


def _raw_lines(fp: IO[bytes] | IO[str], limit: int) -> Iterator[bytes]:
    """The file's lines as bytes, none over ``limit`` bytes (nor read whole into memory)."""
    number = 0
    while True:
        chunk = fp.readline(limit + 1)
        if not chunk:
            return
        number += 1
        raw = chunk.encode("utf-8", "surrogatepass") if isinstance(chunk, str) else chunk
        if len(raw) > limit and not raw.endswith(b"\n"):
            raise BadExport(
                f"the line is over {limit:,} bytes: no record of this store is that long",
                line=number,
            )
        yield raw


# --- the first pass ----------------------------------------------------------------------


@dataclass
class _Check:
    """What the first pass learns: the header, and what later lines are checked against."""

    header: _Header
    slugs: dict[str, int] = field(default_factory=dict)  # slug -> its line
    topic_keys: dict[str, int] = field(default_factory=dict)
    session_hashes: dict[tuple[str, str], int] = field(default_factory=dict)
    edges: set[tuple[str, str, str]] = field(default_factory=set)
    superseded_by: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: {"note": 0, "version": 0, "link": 0})


def read_header(raw: bytes | None) -> _Header:
    """The first line, checked: a Gleaner export of a version this Gleaner reads."""
    if raw is None:
        raise BadExport("the file is empty: an export starts with its header line", line=1)
    data = _object(raw, 1)
    if data.get("kind") != EXPORT_FORMAT:
        raise BadExport(
            "not a Gleaner export: its first line must be the header "
            f'{{"kind": "{EXPORT_FORMAT}", "version": {EXPORT_VERSION}, ...}}',
            line=1,
        )
    version = data.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > EXPORT_VERSION:
        raise BadExport(
            f"the file is export version {version}, written by a newer Gleaner; this one "
            f"reads version {EXPORT_VERSION}: restore it with that Gleaner",
            line=1,
        )
    found = cast(_Header, _model(_Header, data, "the header", 1))
    if found.version != EXPORT_VERSION:
        raise BadExport(f"unknown export version {found.version}", line=1)
    try:
        check_principal(found.owner)
    except InvalidInput as exc:
        raise BadExport(f"the header's owner: {exc.message}", line=1, rule=exc.reason) from None
    return found


def _check_record(state: _Check, data: dict[str, Any], settings: Settings, number: int) -> str:
    """Check one record line against the schema, the write rules and the lines above it;
    returns its kind."""
    kind = data.get("kind")
    if kind == "note":
        row = _note_row(data, settings, number)
        slug = row["slug"]
        _unique(state.slugs, slug, number, f"the slug {quoted(slug)}")
        if row["topic_key"] is not None:
            key = row["topic_key"]
            _unique(state.topic_keys, key, number, f"the topic key {quoted(key)}")
        elif row["session_id"] is not None:
            pair = (row["session_id"], row["content_hash"])
            _unique(state.session_hashes, pair, number, "the same body in the same session")
    elif kind == "version":
        row = _version_row(data, settings, number)
        _known(state, row["slug"], number, f"version of {quoted(row['slug'])}")
    elif kind == "link":
        _check_link(state, _link(data, number), number)
    else:
        raise BadExport(
            f"unknown record kind {quoted(kind)}: a line is a note, version or link", line=number
        )
    state.counts[kind] += 1
    return str(kind)


def _unique(seen: dict[Any, int], key: Any, number: int, what: str) -> None:
    if key in seen:
        raise BadExport(f"{what} is on line {seen[key]} already", line=number)
    seen[key] = number


def _known(state: _Check, slug: str, number: int, what: str) -> None:
    if slug not in state.slugs:
        raise BadExport(
            f"{what}: no note {quoted(slug)} above this line (notes come first)", line=number
        )


def _check_link(state: _Check, found: _LinkRecord, number: int) -> None:
    """Both ends are notes above; no self-link, no edge twice; ``supersedes`` keeps rule 7."""
    what = f"link {quoted(found.from_)} {found.rel} {quoted(found.to)}"
    _known(state, found.from_, number, what)
    _known(state, found.to, number, what)
    if found.from_ == found.to:
        raise BadExport(f"{what}: a note cannot link to itself", line=number, rule="self_link")
    edge = (found.from_, found.to, found.rel)
    if edge in state.edges:
        raise BadExport(f"{what} is in the file twice", line=number)
    if found.rel == "supersedes":
        holder = state.superseded_by.get(found.to)
        if holder is not None:
            raise BadExport(
                f"{what}: {quoted(found.to)} is already superseded by {quoted(holder)}",
                line=number,
                rule="already_superseded",
            )
        current: str | None = found.from_
        while current is not None:
            if current == found.to:
                raise BadExport(f"{what} would form a cycle", line=number, rule="cycle")
            current = state.superseded_by.get(current)
        state.superseded_by[found.to] = found.from_
    state.edges.add(edge)


def check_records(
    lines: Iterator[bytes],
    header: _Header,
    settings: Settings,
    *,
    on_record: Callable[[int], None] | None = None,
) -> _Check:
    """The first pass over the records (the lines after the header); ``on_record`` gets the
    count checked so far. Ends by holding the records to the header's counts."""
    state = _Check(header)
    number = 1
    for number, raw in enumerate(lines, start=2):
        _check_record(state, _object(raw, number), settings, number)
        if on_record is not None:
            on_record(number - 1)
    said = header.counts
    for kind, expected in (("note", said.notes), ("version", said.versions), ("link", said.links)):
        if state.counts[kind] != expected:
            raise BadExport(
                f"the header counts {expected} {kind}(s), the file holds {state.counts[kind]}: "
                "it is incomplete or was edited (end of file)",
                line=number + 1,
            )
    return state


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
        postings and the lengths they give (``store.writer``'s rules)."""
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

    def _links(self, links: list[tuple[_LinkRecord, datetime]]) -> None:
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
    settings: Settings,
    *,
    on_record: Callable[[int], None] | None = None,
) -> dict[str, int]:
    """The second pass, on ``conn`` inside the caller's transaction: every record of a file
    ``check`` passed, written into ``scope``, which must still hold no note."""
    if dialect_name(conn) == "postgresql":
        from store.forget import lock_key

        # The lock a forget holds: no harvest of the owner commits between this check that
        # the scope is empty and this transaction's commit (a harvest takes it shared).
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": lock_key(scope)})
    _refuse_held(conn, scope)
    next(lines)  # the header, checked in the first pass
    writer = _Writer(conn, scope)
    written = {"note": 0, "version": 0, "link": 0}
    now = datetime.now(UTC)
    for number, raw in enumerate(lines, start=2):
        data = _object(raw, number)
        kind = data.get("kind")
        if kind == "note":
            writer.add("note", _note_row(data, settings, number))
        elif kind == "version":
            writer.add("version", _version_row(data, settings, number))
        elif kind == "link":
            writer.add("link", (_link(data, number), now))
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
    settings: Settings,
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
        source = _raw_lines(fp, limit)
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
        again = _raw_lines(spool or fp, limit)
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
