"""The transcript model every reader produces, and the limits on how large one may be."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from gleaner.config.harvest import HarvestSettings
from gleaner.harvest.errors import TranscriptFormatError
from gleaner.store.settings import setting_field
from gleaner.store.text import quoted, unstorable

if TYPE_CHECKING:
    pass

Role = Literal["user", "assistant", "system", "tool"]


class Message(BaseModel):
    """One turn of a conversation."""

    model_config = ConfigDict(frozen=True)

    role: Role
    content: str
    at: datetime | None = None


class Transcript(BaseModel):
    """One finished conversation, whatever format it came in.

    ``started_at``/``ended_at`` are when the conversation happened (kept apart from when it
    is harvested); ``owner`` is None for exports that carry none (ChatGPT, Claude).
    """

    model_config = ConfigDict(frozen=True)

    conversation_id: str = Field(min_length=1, max_length=255)
    owner: str | None = None
    title: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    messages: list[Message]
    source_format: str = "native"
    source_path: str | None = None
    # How many secrets redaction replaced in the messages (harvest.redact): carried on a
    # queued job's transcript to the job's outcome (``secrets_redacted``).
    secrets_redacted: int = Field(default=0, ge=0)

    @property
    def happened_at(self) -> datetime | None:
        """When the conversation happened: its end, else its start, else its last message."""
        if self.ended_at or self.started_at:
            return self.ended_at or self.started_at
        stamps = [m.at for m in self.messages if m.at is not None]
        return max(stamps) if stamps else None


# --- size limits -------------------------------------------------------------------------


class Limits(BaseModel):
    """How much one transcript, and one file of them, may hold; built by :meth:`from_settings`.

    ``transcript_bytes`` counts the UTF-8 bytes of a conversation's message text,
    ``transcript_messages`` the messages it lists, ``file_bytes`` the bytes read from one file
    (a zip export's ``conversations.json`` counted inflated), ``zip_entries`` the entries a
    zip export declares. Each is checked before the text is tokenized or sent anywhere; each
    default and bound is the setting's (``GLEANER_MAX_*``).
    """

    model_config = ConfigDict(frozen=True)

    transcript_bytes: int = setting_field("max_transcript_bytes")
    transcript_messages: int = setting_field("max_transcript_messages")
    file_bytes: int = setting_field("max_file_bytes")
    zip_entries: int = setting_field("max_zip_entries")
    # The setting a too_large file names: an HTTP body is bounded by its own limit.
    file_bytes_setting: str = "GLEANER_MAX_FILE_BYTES"

    @classmethod
    def from_settings(cls, settings: HarvestSettings) -> Limits:
        """The limits a Settings object names; keys it lacks keep their defaults."""
        values = {
            field: value
            for field, setting in _LIMIT_SETTINGS.items()
            if (value := getattr(settings, setting, None)) is not None
        }
        return cls(**values)


DEFAULT_LIMITS = Limits()
_LIMIT_SETTINGS = {
    "transcript_bytes": "max_transcript_bytes",
    "transcript_messages": "max_transcript_messages",
    "file_bytes": "max_file_bytes",
    "zip_entries": "max_zip_entries",
}


def too_large(what: str, size: str, limit: int, setting: str) -> TranscriptFormatError:
    """The ``too_large`` error: what is too large, its size, the limit and the setting that
    sets it. ``size`` is a number, or ``more than N``; never the text itself."""
    return TranscriptFormatError(
        f"{what} too large: {size}, over the limit of {limit:,} ({setting}; raise it to "
        "accept this input)",
        reason="too_large",
    )


def text_bytes(text: str) -> int:
    """UTF-8 bytes of ``text`` (a lone surrogate counted as its 3 bytes)."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def check_message_count(count: int, limits: Limits) -> None:
    """Refuse (``too_large``) a conversation that lists more messages than the limit."""
    if count > limits.transcript_messages:
        raise too_large(
            "conversation",
            f"{count:,} messages",
            limits.transcript_messages,
            "GLEANER_MAX_TRANSCRIPT_MESSAGES",
        )


def check_size(messages: Sequence[Message], limits: Limits) -> None:
    """Refuse (``too_large``) messages over the message or byte limit; costs one pass over the
    text and never tokenizes it."""
    check_message_count(len(messages), limits)
    size = sum(text_bytes(m.content) for m in messages)
    if size > limits.transcript_bytes:
        raise too_large(
            "conversation",
            f"{size:,} bytes of message text",
            limits.transcript_bytes,
            "GLEANER_MAX_TRANSCRIPT_BYTES",
        )


def check_storable(transcript: Transcript) -> None:
    """Refuse (``refused_value``) a conversation that holds what no stored text may hold (a
    NUL, a lone surrogate) in its id, title, source path or a message's text, naming the
    field (the owner has a rule of its own: ``store.text.check_principal``).

    Checked at intake, before the conversation is recorded, queued or shown to a model, so
    one such conversation in a batch is refused alone (PostgreSQL would refuse the whole
    batch's insert, and a model call for it would be paid for nothing).
    """
    named = (
        ("conversation id", transcript.conversation_id),
        ("title", transcript.title),
        ("source path", transcript.source_path),
    )
    for field, value in named:
        problem = unstorable(value) if value else None
        if problem is not None:
            raise refused_value(f"{field} {quoted(value)}", problem)
    for number, message in enumerate(transcript.messages, start=1):
        problem = unstorable(message.content)
        if problem is not None:
            raise refused_value(f"the text of message {number} ({message.role})", problem)


def refused_value(what: str, problem: str) -> TranscriptFormatError:
    """The ``refused_value`` error: which field holds what (never a message's text)."""
    return TranscriptFormatError(
        f"conversation refused: {what} holds {problem}, which no stored text may hold",
        reason="refused_value",
    )
