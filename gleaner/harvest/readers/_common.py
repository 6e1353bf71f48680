"""What every reader shares: timestamps, message text, roles, and building a checked Transcript."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from gleaner.harvest.errors import TranscriptFormatError
from gleaner.harvest.redact import redact_text, redact_transcript
from gleaner.harvest.transcript import DEFAULT_LIMITS, Limits, Message, Role, Transcript, check_size

# Roles as the formats spell them -> the transcript's four. OpenAI's "developer" is its new
# name for a system prompt; "function" is the old name for a tool result.
ROLES: dict[str, Role] = {
    "user": "user",
    "assistant": "assistant",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "function": "tool",
}
# Text part types of OpenAI chat content and of the Responses API.
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})


def name_of(value: object) -> str | None:
    """A field read as a name (a type, a role, a node id): the string, or None for any other
    JSON value. An export's list or object where a name belongs is then no known name, not
    a TypeError from a set or dict lookup (a list or object cannot be hashed)."""
    return value if isinstance(value, str) else None


def bad(message: str) -> TranscriptFormatError:
    """A TranscriptFormatError for one conversation (the caller adds which one).

    Messages name the field and its position and describe a bad value (see ``described``),
    never quote it: they end up in job records, import reports and logs, and a value may be
    private text.
    """
    return TranscriptFormatError(message)


def described(value: object) -> str:
    """What a bad value is, without its text: ``a string of 12 characters``, ``a number``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return f"a string of {len(value)} characters"
    if isinstance(value, Mapping):
        return f"an object of {len(value)} keys"
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    return type(value).__name__


def too_deep(what: str) -> TranscriptFormatError:
    """A file or line (``what`` names it) whose JSON is nested past what Python can parse."""
    # Python's JSON parser and any walk over the value recurse once per level; past the
    # interpreter's recursion limit (about 1,000) that is a RecursionError, not a transcript.
    return TranscriptFormatError(
        f"{what}JSON nested too deeply to read (no transcript format nests that deep)",
        reason="too_deep",
    )


def json_problem(exc: ValueError) -> str:
    """Why a JSON text did not parse, naming the position but never the text there: the
    decoder's message, or the one value Python's parser refuses in valid JSON, an integer
    over its digit limit (``sys.get_int_max_str_digits``; a ValueError naming no position)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    return f"a number of more than {sys.get_int_max_str_digits():,} digits"


def split_lines(text: str) -> list[str]:
    """The lines of JSON Lines text: split at "\\n" only, a trailing "\\r" dropped.

    Not ``str.splitlines``: it also splits at U+2028, U+2029, U+0085 and other characters a
    JSON string may hold raw, cutting one line's JSON in two.
    """
    return [line.removesuffix("\r") for line in text.split("\n")]


def parse_time(value: object, field: str) -> datetime | None:
    """A timestamp from an ISO 8601 string or unix seconds; None when absent.

    A naive ISO time is taken as UTC, so every datetime a reader returns is aware.
    """
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise bad(f"{field} is not a timestamp (got a boolean)")
    if isinstance(value, int | float):
        try:
            return datetime.fromtimestamp(value, UTC)
        except (OverflowError, OSError, ValueError):
            raise bad(f"{field} is not a timestamp (got a number out of range)") from None
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip())
        except ValueError:
            raise bad(f"{field} is not an ISO 8601 timestamp (got {described(value)})") from None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    raise bad(f"{field} is not a timestamp (got {described(value)})")


def text_of(content: object, field: str) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts.

    Parts that are not text (images, files, tool calls) are skipped; None is no text.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping):
        content = [content]
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and name_of(part.get("type", "text")) in TEXT_PART_TYPES:
                text = part.get("text")
                if isinstance(text, str):
                    texts.append(text)
        return "\n".join(texts)
    raise bad(f"{field} must be text or a list of parts (got {described(content)})")


def optional_str(value: object, field: str) -> str | None:
    """A string field that may be missing or empty (then None)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise bad(f"{field} must be a string (got {described(value)})")
    return value


def identifier(value: object, field: str) -> str | None:
    """An id that some exports write as a number: a non-empty string, or None when absent."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return optional_str(value, field)


def _without_nul(message: Message) -> Message:
    if "\0" not in message.content:
        return message
    return message.model_copy(update={"content": message.content.replace("\0", "")})


def _check_unicode(text: str, field: str) -> None:
    """Refuse ``text`` when it holds a lone surrogate: it is no Unicode text, and UTF-8 (the
    store, the model's request, JSON out) cannot encode it."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise bad(
            f"{field} is not Unicode text: it holds a lone surrogate at character {exc.start + 1} "
            "(half of a UTF-16 pair, such as \\ud800 in JSON)"
        ) from None


def build(
    *,
    conversation_id: str,
    owner: str | None,
    messages: Iterable[Message],
    source_format: str,
    path: Path,
    title: str | None = None,
    started_at: datetime | None = None,
    ended_at: datetime | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> Transcript:
    """A Transcript, refused when it holds no user or assistant text, or (``too_large``) more
    than ``limits`` allow.

    Blank messages are dropped here so every reader treats them alike. Text is kept as it is,
    except NUL characters, which are taken out of messages and the title (no text column of
    PostgreSQL holds one, and they are no part of what anyone said), and the conversation
    id, which gets the privacy rule at once (see ``harvest.redact.redact_conversation_id``):
    it names the conversation in reports and errors long before the transcript is redacted.
    Text holding a lone surrogate (``"\\ud800"`` in JSON: half of a UTF-16 pair, no character
    at all) is refused, naming where, never quoting it: nothing downstream can encode it.
    """
    messages = [_without_nul(m) for m in messages]
    check_size(messages, limits)
    for number, message in enumerate(messages, 1):
        _check_unicode(message.content, f"message {number} content")
    _check_unicode(conversation_id, "conversation id")
    if title is not None:
        title = title.replace("\0", "")
        _check_unicode(title, "title")
    kept = [m for m in messages if m.content.strip()]
    if not any(m.role in ("user", "assistant") for m in kept):
        raise bad("empty conversation: no user or assistant text")
    try:
        transcript = Transcript(
            conversation_id=conversation_id,
            owner=owner,
            title=title,
            started_at=started_at,
            ended_at=ended_at,
            messages=kept,
            source_format=source_format,
            source_path=str(path),
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise bad(f"{where}: {first['msg']}") from None
    if redact_text(conversation_id) != conversation_id:
        # The id is printed and stored from here on, before any job redacts the transcript.
        redacted = redact_transcript(transcript).conversation_id
        transcript = transcript.model_copy(update={"conversation_id": redacted})
    return transcript
