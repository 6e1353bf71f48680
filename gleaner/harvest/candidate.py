"""A note as the harvest model (or the offline extractor) proposes it, before it is written."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gleaner.store.text import unstorable

# A word: at least one letter or digit, in any script.
_WORD = re.compile(r"[^\W_]")
# Search keywords kept of a candidate (more are cut off, not a reason to drop the note).
MAX_KEYWORDS = 8


def has_word(text: str) -> bool:
    """Whether ``text`` holds a letter or a digit, not only punctuation, symbols and space."""
    return _WORD.search(text) is not None


# Template text a model sends instead of a value: a whole value in template brackets
# (``<title>``, ``{body}``, ``{{topic_key}}``, ``[insert title]``), or one of the words that
# stand for "no value" or name a JSON-schema type (what a model copies from a schema).
_TEMPLATE = re.compile(r"<[^<>]*>|\{\{?[^{}]*\}?\}|\[[^\[\]]*\]")
_NOTHING_WORDS = frozenset(
    {"none", "null", "nil", "n/a", "na", "undefined", "todo", "tbd", "tba"}
    | {"string", "number", "integer", "boolean", "object", "array"}
)


def placeholder(text: str) -> str | None:
    """Why ``text`` is template or placeholder text, not a value (None when it is a value):
    empty or wordless after stripping, a whole value in template brackets, or a null-ish
    word or JSON-schema type name (case, spaces and surrounding punctuation aside)."""
    stripped = text.strip()
    if not has_word(stripped):
        return "holds no word (no letter or digit)"
    if _TEMPLATE.fullmatch(stripped):
        return "is template text in brackets"
    if stripped.strip(" .:;,!?'\"`*_-").casefold() in _NOTHING_WORDS:
        return "is placeholder text (a null-ish word or a JSON type name)"
    return None


MAX_QUOTES = 2
MAX_QUOTE_CHARS = 300


class Quote(BaseModel):
    """One item of a candidate's evidence: a verbatim quote and who said it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    speaker: str = Field(default="", max_length=64)
    quote: str = Field(min_length=1)


Mark = Literal["new", "same", "update"]


class NoteCandidate(BaseModel):
    """One proposed note; the JSON shape the model is asked for, item by item.

    A title or body with no word ("...", "—", "?!") or that is template text ("<title>",
    "string", "N/A": :func:`placeholder`) is invalid: such a note says nothing, and with no
    words to compare it could never be found a duplicate; such a topic key is no key. Topics
    with no word are left out. A title, body or topic key holding what no stored text may
    hold (a NUL, which a JSON answer can carry as ``\\u0000``, or a lone surrogate) is
    invalid: the note is dropped, as the store would refuse it, before its key is looked up.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    type: str = Field(description="one of the observation types (GLEANER_OBSERVATION_TYPES)")
    title: str = Field(min_length=1, max_length=200)
    body: str = Field(min_length=1, max_length=4000)
    topics: list[str] = Field(default_factory=list, max_length=8)
    confidence: float = Field(default=0.5, ge=0.0, le=1.0)
    topic_key: str | None = Field(default=None, max_length=255)
    # Words a later question may use that the note does not hold (synonyms, categories).
    keywords: list[str] = Field(default_factory=list)
    # What in the conversation the note rests on (checked against the transcript before it
    # is written: harvest.grounding).
    evidence: list[Quote] = Field(default_factory=list)
    # The model's judgement against the owner's notes it was shown: a new fact, the same as
    # the shown note ``ref``, or an update of it. None: no judgement (an older model).
    mark: Mark | None = None
    ref: str | None = None

    @field_validator("title", "body")
    @classmethod
    def _needs_a_value(cls, value: str) -> str:
        problem = placeholder(value)
        if problem is not None:
            raise ValueError(problem)
        return _storable(value)

    @field_validator("topic_key")
    @classmethod
    def _placeholder_key_is_none(cls, value: str | None) -> str | None:
        # Small models send "" (or spaces, "null", "<topic_key>", "string") for no key: one
        # such key for every such note would make them all one note, each answer overwriting
        # the last. The note stays, keyless.
        value = value.strip() if value is not None else None
        return _storable(value) if value and placeholder(value) is None else None

    @field_validator("topics")
    @classmethod
    def _topics_with_words(cls, value: list[str]) -> list[str]:
        return [topic for topic in value if has_word(topic)]

    @field_validator("evidence", mode="before")
    @classmethod
    def _some_quotes(cls, value: object) -> object:
        # A malformed quote list is no evidence (the note is then ungrounded), not a reason
        # to refuse the whole answer; more than MAX_QUOTES are cut off.
        if not isinstance(value, list):
            return []
        kept = [
            q
            for q in value
            if isinstance(q, dict)
            and isinstance(q.get("quote"), str)
            and q["quote"].strip()
            and unstorable(q["quote"]) is None
            and isinstance(q.get("speaker", ""), str)
            and unstorable(q.get("speaker", "")) is None
        ]
        return [
            {"speaker": str(q.get("speaker", ""))[:64], "quote": q["quote"][:MAX_QUOTE_CHARS]}
            for q in kept[:MAX_QUOTES]
        ]

    @field_validator("mark", mode="before")
    @classmethod
    def _known_mark(cls, value: object) -> object:
        # An unknown or missing mark is no judgement: the lexical rule decides.
        if isinstance(value, str) and value.strip().lower() in ("new", "same", "update"):
            return value.strip().lower()
        return None

    @field_validator("ref", mode="before")
    @classmethod
    def _ref_text(cls, value: object) -> object:
        return value.strip() if isinstance(value, str) and value.strip() else None

    @field_validator("keywords")
    @classmethod
    def _some_keywords(cls, value: list[str]) -> list[str]:
        # Bounded here (the store normalizes each to 40 characters); unstorable ones dropped.
        kept = [k for k in value if has_word(k) and unstorable(k) is None]
        return kept[:MAX_KEYWORDS]


def _storable(value: str) -> str:
    problem = unstorable(value)
    if problem is not None:
        raise ValueError(f"holds {problem}, which no stored text may hold")
    return value
