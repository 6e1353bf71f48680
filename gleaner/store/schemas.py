"""What the store hands back: frozen, detached values (never live ORM rows)."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic.json_schema import SkipJsonSchema

from gleaner.store.errors import InvalidInput
from gleaner.store.text import check_principal, quoted

if TYPE_CHECKING:
    from gleaner.store.schema.models import Memory  # the ORM: not loaded by the read commands

RELS: tuple[str, ...] = ("related", "derived_from", "supersedes")
ScopeKind = Literal["owner", "global"]
MAX_SCOPE_ID_CHARS = 255


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


def _scope_id(value: str, info: ValidationInfo) -> str:
    """The id a scope of its kind may have: an owner under the one owner rule (see
    ``store.text.check_principal``, which also normalizes it), the global scope's ''."""
    kind = info.data.get("kind")
    if kind == "owner":
        value = check_principal(value)
    elif kind == "global" and value:
        raise InvalidInput("the global scope's id is ''", reason="bad_scope")
    if len(value) > MAX_SCOPE_ID_CHARS or "\x00" in value:
        raise InvalidInput("scope id is too long or holds NUL", reason="bad_scope")
    return value


class Scope(Frozen):
    """Where a note lives: ``("owner", principal)`` or the global scope ``("global", "")``.

    Checked strictly when built (``Scope(kind=..., id=...)`` or :meth:`of`); a scope read
    back from the database is not checked again (:meth:`stored`).
    """

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    kind: ScopeKind
    id: Annotated[str, AfterValidator(_scope_id)]

    GLOBAL_KIND: ClassVar[str] = "global"

    @classmethod
    def owner(cls, principal: str) -> Scope:
        return cls.of(("owner", principal))

    @classmethod
    def global_(cls) -> Scope:
        return cls.of(("global", ""))

    @classmethod
    def stored(cls, kind: str, ident: str) -> Scope:
        """A scope as the database holds it: checked when its notes were written, so not
        again. One value per scope is shared (a read builds one per row it returns)."""
        return _stored_scope(kind, ident)

    @classmethod
    def of(cls, value: Scope | tuple[str, str] | object) -> Scope:
        """Accept a Scope or a ``(kind, id)`` pair; anything else is InvalidInput."""
        if isinstance(value, Scope):
            return value
        if not (isinstance(value, tuple | list) and len(value) == 2):
            raise InvalidInput(f"a scope is (kind, id), got {quoted(value)}", reason="bad_scope")
        kind, ident = value
        try:
            return cls.model_validate({"kind": kind, "id": ident})
        except ValidationError as exc:
            raise _scope_refusal(exc, kind, ident) from None

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}" if self.id else self.kind


@functools.lru_cache(maxsize=4_096)
def _stored_scope(kind: str, ident: str) -> Scope:
    return Scope.model_construct(kind=cast("ScopeKind", kind), id=ident)


def _scope_refusal(exc: ValidationError, kind: object, ident: object) -> InvalidInput:
    """The first rule a ``(kind, id)`` pair broke, as InvalidInput(reason="bad_scope")."""
    first = exc.errors(include_url=False)[0]  # fields are checked in order: kind, then id
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, InvalidInput):  # an owner's own rule keeps its message
        return InvalidInput(str(cause), reason="bad_scope")
    if first["loc"] == ("kind",):
        return InvalidInput(
            f"unknown scope kind {quoted(kind)}: expected 'owner' or 'global'", reason="bad_scope"
        )
    return InvalidInput(f"scope id must be a string, got {quoted(ident)}", reason="bad_scope")


def _aware(value: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; everything stored is UTC.
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


class Evidence(Frozen):
    """One short verbatim quote of the conversation a note rests on, and who said it."""

    speaker: str
    quote: str


class Note(Frozen):
    """One note as stored. ``id`` and ``updated_seq`` count every owner's writes: they are
    for the store's own use and never serialized (no HTTP, MCP, CLI or JSON output shows
    them, which would tell an owner how much the others write), nor in the JSON schemas the
    services publish (OpenAPI, MCP output schemas); ``slug`` names a note."""

    id: SkipJsonSchema[int] = Field(exclude=True)
    scope: Scope
    slug: str
    title: str
    body: str
    type: str | None
    topics: list[str]
    topic_key: str | None
    # Search keywords the harvest model gave (words a later question may use).
    keywords: list[str] = []
    session_id: str | None
    provenance: str
    source: dict[str, Any] | None
    confidence: float | None
    # "instruction": the note reads as an instruction to the assistant (store.notes.instructions);
    # it is data all the same, never to be followed.
    flag: str | None = None
    # What the note rests on (harvested notes): quotes of its conversation with their speaker.
    evidence: list[Evidence] = []
    pinned: bool
    status: str
    conversation_id: str | None
    content_hash: str
    occurred_at: datetime | None
    created_at: datetime
    updated_at: datetime
    updated_seq: SkipJsonSchema[int] = Field(exclude=True)
    weight: float
    # When the fact was said: the conversation's time, else when the text was last written.
    said_at: datetime | None = None

    @field_validator("occurred_at", "created_at", "updated_at", "said_at")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return _aware(value)

    @classmethod
    def from_row(cls, row: Memory) -> Note:
        return cls(
            id=row.id,
            scope=Scope.stored(row.scope_kind, row.scope_id),
            slug=row.slug,
            title=row.title,
            body=row.body,
            type=row.type,
            topics=row.topics.split(),
            topic_key=row.topic_key,
            keywords=(getattr(row, "keywords", "") or "").split(),
            session_id=row.session_id,
            provenance=row.provenance,
            source=row.source,
            confidence=row.confidence,
            flag=getattr(row, "flag", None),
            evidence=getattr(row, "evidence", None) or [],
            pinned=row.pinned,
            status=row.status,
            conversation_id=row.conversation_id,
            content_hash=row.content_hash,
            occurred_at=row.occurred_at,
            created_at=row.created_at,
            updated_at=row.updated_at,
            updated_seq=row.updated_seq,
            weight=row.weight,
            said_at=row.occurred_at or row.updated_at,
        )


class Similar(Frozen):
    slug: str
    title: str
    score: float


class WriteResult(Frozen):
    memory: Note
    created: bool
    similar: list[Similar]


class LinkedNote(Frozen):
    rel: str
    note: Note


class NoteWithLinks(Frozen):
    memory: Note
    links: list[LinkedNote]
    backlinks: list[LinkedNote]
    superseded_by: str | None


class LinkResult(Frozen):
    from_: Note
    to: Note
    rel: str
    created: bool


class ScoreParts(Frozen):
    """A hit's score as the sum of its three terms: ``(1 - recency_weight) * lexical``,
    ``recency_weight * recency`` and ``pinned_bonus`` when pinned (else 0)."""

    lexical: float
    recency: float
    pinned: float


class SearchHit(Frozen):
    """One search result. ``lexical`` and ``recency`` are the raw factors (0..1); ``parts``
    are their shares of ``score`` (set by ``Store.search``); ``bm25`` is the note's raw
    relevance to the query (``lexical`` is it over the best hit's). When the fact was said
    is ``memory.said_at``."""

    memory: Note
    score: float
    lexical: float
    recency: float
    snippet: str
    backend: str
    parts: ScoreParts | None = None
    bm25: float = 0.0
    # Cosine similarity of the note's vector to the query's (hybrid search; None otherwise).
    semantic: float | None = None


class NoteChange(Frozen):
    """A note after a change by hand (pin, unpin, archive); ``changed`` False when it already
    was so."""

    memory: Note
    changed: bool


class SaveResult(Frozen):
    """What mem_save did: ``created``, ``updated`` (topic key) or ``deduped`` (same content).
    ``id`` (seed 003's observation id) counts every owner's writes, so it is never serialized:
    the note's ``slug`` (what ``mem_read`` takes) names it in every output."""

    id: SkipJsonSchema[int] = Field(exclude=True)
    slug: str
    outcome: Literal["created", "updated", "deduped"]
    session_id: str
    topic_key: str | None


class NoteVersion(Frozen):
    """A note's text as it was before a change, and the change that replaced it.

    ``written_*``: when, by which provenance and which conversation this text was written;
    ``changed_*`` and ``reason``: the change that replaced it (``reason`` one of
    ``slug_upsert``, ``topic_key_upsert``, ``mem_save_upsert``, ``harvest_same_fact``).
    """

    slug: str
    title: str
    body: str
    topics: list[str]
    keywords: list[str] = []
    type: str | None
    pinned: bool
    confidence: float | None
    evidence: list[Evidence] = []
    # When this version's fact was said (its conversation's time), if known.
    occurred_at: datetime | None = None
    written_provenance: str
    written_conversation_id: str | None
    written_at: datetime
    reason: str
    changed_provenance: str
    changed_conversation_id: str | None
    changed_at: datetime

    @field_validator("written_at", "changed_at", "occurred_at")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return _aware(value)

    @field_validator("evidence", mode="before")
    @classmethod
    def _no_evidence(cls, value: object) -> object:
        return [] if value is None else value

    @field_validator("topics", "keywords", mode="before")
    @classmethod
    def _topic_list(cls, value: object) -> object:
        # Stored as the normalized topic string.
        return value.split() if isinstance(value, str) else value
