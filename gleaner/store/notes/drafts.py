"""A note's attrs checked against every write rule, and the columns a write of them sets.

``validate_attrs`` turns a caller's attrs into a ``Draft`` or raises ``InvalidInput`` naming
the first rule broken; provenance comes from code, never from attrs; a pinned body reaches
system prompts, so untrusted text pins only by explicit opt-in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
)

from gleaner.config.store import StoreSettings
from gleaner.store.errors import InvalidInput
from gleaner.store.notes.instructions import instruction_flag
from gleaner.store.text import (
    MAX_BODY_BYTES_SETTING,
    check_text,
    content_hash,
    is_slug,
    normalize_topics,
    quoted,
    slugify,
)

CODE_PROVENANCES = frozenset({"user", "compaction", "import"})
MAX_TITLE_BYTES = 1_000


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
    # Search keywords (normalized as topics are): searchable, not part of the same-fact rule.
    keywords: str = ""
    # What the note rests on: [{"speaker": ..., "quote": ...}], at most MAX_EVIDENCE.
    evidence: tuple[dict[str, str], ...] | None = None


def text_field(field: str, max_bytes: int | None = None, *, optional: bool = False) -> Any:
    """A before-validator: the value as text under ``check_text``'s rules (bytes decoded);
    ``optional`` lets None through. Without ``max_bytes`` the limit is the body limit the
    caller's settings give (the validation context)."""

    def check(value: object, info: ValidationInfo) -> object:
        if optional and value is None:
            return None
        limit, setting = max_bytes, None
        if limit is None and info.context is not None:
            limit = info.context.get("max_body_bytes")
            setting = MAX_BODY_BYTES_SETTING
        return check_text(value, field, max_bytes=limit, setting=setting)

    return BeforeValidator(check)


def _slug(value: object) -> object:
    if value is not None and not (isinstance(value, str) and is_slug(value)):
        raise InvalidInput(
            f"slug {quoted(value)} must be lowercase ASCII words joined by '-' (at most 100 chars)",
            reason="bad_slug",
        )
    return value


def _words_list(field: str, reason: str) -> Any:
    """A before-validator: a list of short texts (``topics``, ``keywords``)."""

    def check(value: object) -> object:
        if value is None:
            return value
        if not (isinstance(value, list | tuple) and all(isinstance(t, str) for t in value)):
            raise InvalidInput(
                f"{field} must be a list of strings, got {quoted(value)}", reason=reason
            )
        return [check_text(item, field.rstrip("s")) for item in value]

    return BeforeValidator(check)


def _source(value: object) -> object:
    if value is not None and not isinstance(value, Mapping):
        raise InvalidInput(f"source must be a mapping, got {quoted(value)}", reason="bad_source")
    return value


class _Source(BaseModel):
    """``source``: where a note came from; a key left None is dropped."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    url: Annotated[str | None, text_field("source.url", 4_000, optional=True)] = None
    artifact: Annotated[str | None, text_field("source.artifact", 4_000, optional=True)] = None
    note: Annotated[str | None, text_field("source.note", 4_000, optional=True)] = None


MAX_EVIDENCE = 3
MAX_QUOTE_CHARS = 500


class _Quote(BaseModel):
    """One item of ``evidence``: a verbatim quote and who said it."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    speaker: Annotated[str, text_field("evidence.speaker", 64)]
    quote: Annotated[str, text_field("evidence.quote", MAX_QUOTE_CHARS * 4)]


def _evidence(value: object) -> object:
    if value is None:
        return value
    if not isinstance(value, list | tuple) or len(value) > MAX_EVIDENCE:
        raise InvalidInput(
            f"evidence must be a list of at most {MAX_EVIDENCE} {{speaker, quote}} items, "
            f"got {quoted(value)}",
            reason="bad_evidence",
        )
    return value


class _Attrs(BaseModel):
    """A caller's attrs, checked strictly: no unknown key, no coercion between types."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    title: Annotated[str, text_field("title", MAX_TITLE_BYTES)]
    body: Annotated[str, text_field("body")]
    slug: Annotated[str | None, BeforeValidator(_slug)] = None
    topics: Annotated[list[str] | None, _words_list("topics", "bad_topics")] = None
    keywords: Annotated[list[str] | None, _words_list("keywords", "bad_keywords")] = None
    pinned: bool = False
    confidence: Annotated[float | None, Field(ge=0, le=1, allow_inf_nan=False)] = None
    source: Annotated[_Source | None, BeforeValidator(_source)] = None
    evidence: Annotated[list[_Quote] | None, BeforeValidator(_evidence)] = None


# What a field's own type or bound refused means (a rule's InvalidInput keeps its reason).
_FIELD_REASONS = {
    "title": "bad_type",
    "body": "bad_type",
    "slug": "bad_slug",
    "topics": "bad_topics",
    "keywords": "bad_keywords",
    "pinned": "bad_pinned",
    "confidence": "bad_confidence",
    "source": "bad_source",
    "evidence": "bad_evidence",
}
_FIELD_RULES = {
    "pinned": "pinned must be true or false",
    "confidence": "confidence must be a number from 0 to 1",
}


def _refusal(exc: ValidationError, attrs: object) -> InvalidInput:
    """The first rule ``attrs`` broke, in the order they are documented: the shape, unknown
    keys, missing keys, then field by field."""
    errors = exc.errors(include_url=False)
    if any(e["type"] == "model_type" for e in errors):
        return InvalidInput(
            f"attrs must be a mapping, got {type(attrs).__name__}", reason="bad_type"
        )
    extra = sorted(
        str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden" and len(e["loc"]) == 1
    )
    if extra:
        return InvalidInput(
            f"unknown attrs key(s) {', '.join(extra)}; "
            f"allowed: {', '.join(sorted(_Attrs.model_fields))}",
            reason="unknown_attr",
        )
    if any(e["type"] == "missing" and len(e["loc"]) == 1 for e in errors):
        return InvalidInput("attrs need both 'title' and 'body'", reason="missing_attr")
    order = list(_Attrs.model_fields)
    first = min(errors, key=lambda e: order.index(str(e["loc"][0])) if e["loc"] else -1)
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, InvalidInput):
        return cause
    field = str(first["loc"][0])
    if field == "source":
        keys = sorted(str(e["loc"][1]) for e in errors if e["type"] == "extra_forbidden")
        if keys:
            return InvalidInput(
                f"unknown source key(s) {', '.join(keys)}; allowed: url, artifact, note",
                reason="bad_source",
            )
    value = attrs.get(field) if isinstance(attrs, Mapping) else None
    rule = _FIELD_RULES.get(field, f"{field} is not valid ({first['msg']})")
    return InvalidInput(
        f"{rule}, got {quoted(value)}", reason=_FIELD_REASONS.get(field, "bad_type")
    )


def validate_attrs(attrs: Mapping[str, object], settings: StoreSettings) -> Draft:
    """Check attrs against every write rule; raise InvalidInput naming the first one broken."""
    try:
        checked = _Attrs.model_validate(attrs, context={"max_body_bytes": settings.max_body_bytes})
    except ValidationError as exc:
        raise _refusal(exc, attrs) from None
    if not checked.title.strip():
        raise InvalidInput("title is empty", reason="empty_title")
    if not checked.body.strip():
        raise InvalidInput("body is empty", reason="empty_body")
    source = None
    if checked.source is not None:
        source = checked.source.model_dump(exclude_none=True) or None
    return Draft(
        title=checked.title,
        body=checked.body,
        slug=checked.slug,
        topics=normalize_topics(checked.topics),
        pinned=checked.pinned,
        confidence=checked.confidence,
        source=source,
        keywords=normalize_topics(checked.keywords),
        evidence=None
        if not checked.evidence
        else tuple({"speaker": q.speaker, "quote": q.quote} for q in checked.evidence),
    )


def check_instruction(title: str, body: str, settings: StoreSettings) -> None:
    """Under ``GLEANER_INSTRUCTION_NOTES=drop`` a note that reads as an instruction to the
    assistant is not stored (``store.notes.instructions``); under ``flag`` it is, marked."""
    if settings.instruction_notes == "drop" and instruction_flag(title, body) is not None:
        raise InvalidInput(
            "the note reads as an instruction to the assistant (an override phrase, a "
            "directive to the assistant, or sending a secret somewhere) and "
            "GLEANER_INSTRUCTION_NOTES=drop keeps such notes out; state it as a fact "
            "about the user",
            reason="instruction_note",
        )


def resolve_provenance(provenance: str | None, source: Mapping[str, str] | None) -> str:
    """Provenance comes from code, never from attrs: ``web`` with a source URL, else ``agent``."""
    if provenance is None:
        return "web" if source and source.get("url") else "agent"
    if provenance not in CODE_PROVENANCES:
        raise InvalidInput(
            f"provenance {quoted(provenance)} cannot be passed; "
            "code may pass user, compaction, import",
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


def base_slug_of(title: str, topic_key: str | None) -> str:
    """The slug a new note derives: from its topic key when it has one, else its title.

    A topic-keyed note is rewritten in place as its fact changes ("Lives in Lisbon" ->
    "Moved to Porto"): a slug naming the key stays true, one naming the first title would not.
    """
    return slugify(topic_key if topic_key is not None else title)


def draft_columns(draft: Draft, provenance: str, now: datetime, term_count: int) -> dict[str, Any]:
    """The columns every write of ``draft`` sets, insert or update alike."""
    return {
        "title": draft.title,
        "body": draft.body,
        "topics": draft.topics,
        "keywords": draft.keywords,
        "evidence": None if draft.evidence is None else list(draft.evidence),
        "pinned": draft.pinned,
        "confidence": draft.confidence,
        # Every write, whoever writes: a note that reads as an instruction is marked so.
        "flag": instruction_flag(draft.title, draft.body),
        "source": draft.source,
        "provenance": provenance,
        "content_hash": content_hash(draft.body),
        "updated_at": now,
        "term_count": term_count,
    }
