"""A note's attrs checked against every write rule, and the columns a write of them sets.

``validate_attrs`` turns a caller's attrs into a ``Draft`` or raises ``InvalidInput`` naming
the first rule broken; provenance comes from code, never from attrs; a pinned body reaches
system prompts, so untrusted text pins only by explicit opt-in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from store.errors import InvalidInput
from store.settings import Settings
from store.text import check_text, content_hash, is_slug, normalize_topics, slugify

ATTR_KEYS = frozenset({"title", "body", "slug", "topics", "pinned", "confidence", "source"})
SOURCE_KEYS = frozenset({"url", "artifact", "note"})
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
        "pinned": draft.pinned,
        "confidence": draft.confidence,
        "source": draft.source,
        "provenance": provenance,
        "content_hash": content_hash(draft.body),
        "updated_at": now,
        "term_count": term_count,
    }
