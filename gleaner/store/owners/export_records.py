"""An export's records as a restore reads them (docs/EXPORT.md): the schema of each kind of
line, the write rules a note's fields obey, and the rows a checked record becomes.
``store.owners.restore`` checks a file with them and writes the rows."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, cast

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from gleaner.config.store import StoreSettings
from gleaner.store.errors import BadExport, InvalidInput
from gleaner.store.notes.drafts import Draft, validate_attrs
from gleaner.store.notes.history import REASONS
from gleaner.store.notes.instructions import instruction_flag
from gleaner.store.schema.tables import ARCHIVED, LIVE, SUPERSEDED
from gleaner.store.schemas import RELS
from gleaner.store.text import check_text, check_topic_key, content_hash, quoted

# Provenances a stored note (or version) can have: ``web``/``agent`` from attrs, the rest
# passed by code (store.notes.drafts).
PROVENANCES = ("agent", "web", "user", "compaction", "import")
STATUSES = (LIVE, SUPERSEDED, ARCHIVED)


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


class Header(_Strict):
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


class LinkRecord(_Strict):
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


def parsed(model: type[_Strict], data: Mapping[str, Any], what: str, number: int) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, rule = _fields_error(exc, what)
        raise BadExport(f"{what}: {message}", line=number, rule=rule) from None


def _attrs(
    data: Mapping[str, Any], keys: Sequence[str], settings: StoreSettings, what: str, n: int
) -> Draft:
    """``data``'s note content checked by the write rules (``store.notes.drafts.validate_attrs``);
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


def note_row(data: Mapping[str, Any], settings: StoreSettings, number: int) -> dict[str, Any]:
    """A note record as the ``memories`` columns a restore writes (no id, seq or indexes)."""
    what = f"note {quoted(data.get('slug'))}"
    _require(data, "note", what, number)
    draft = _attrs(data, _NOTE_ATTRS, settings, what, number)
    rest = {key: value for key, value in data.items() if key not in _NOTE_ATTRS}
    fields = cast(_NoteFields, parsed(_NoteFields, rest, what, number))
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


def version_row(data: Mapping[str, Any], settings: StoreSettings, number: int) -> dict[str, Any]:
    """A version record as ``memory_versions`` columns, ``slug`` naming its note."""
    what = f"version of {quoted(data.get('slug'))}"
    _require(data, "version", what, number)
    draft = _attrs(data, _VERSION_ATTRS, settings, what, number)
    rest = {key: value for key, value in data.items() if key not in _VERSION_ATTRS}
    fields = cast(_VersionFields, parsed(_VersionFields, rest, what, number))
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


def link_record(data: Mapping[str, Any], number: int) -> LinkRecord:
    what = f"link {quoted(data.get('from'))} {quoted(data.get('rel'))} {quoted(data.get('to'))}"
    _require(data, "link", what, number)
    return cast(LinkRecord, parsed(LinkRecord, data, what, number))


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"the key {key!r} appears twice")
        found[key] = value
    return found


def json_object(raw: bytes, number: int) -> dict[str, Any]:
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
