"""The privacy strip for transcripts, and the hash that identifies a conversation's content."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from gleaner.harvest.transcript import Message, Transcript
from gleaner.privacy import REDACTED, redact_private, redact_secrets, strip_private
from gleaner.store.recall.index import strip_index_text

# Bump when the canonical form changes, so old and new hashes cannot collide by accident.
_HASH_VERSION = 1
# The longest conversation id a transcript (and the jobs, ledger and notes tables) holds.
_MAX_ID_CHARS = 255
REDACTED_ID_PREFIX = "redacted-"


def redact_text(text: str) -> str:
    """``text`` without injected memory-index blocks and with ``<private>`` spans and secrets
    redacted.

    The index goes first so a private span inside an injected block leaves no trace (one
    it leaves open stays open: see ``store.recall.index.strip_index_text``).
    """
    return strip_private(strip_index_text(text))


def redact_messages(messages: Sequence[Message]) -> list[Message]:
    """The messages redacted as one stream (``redact_messages_counted``)."""
    return redact_messages_counted(messages)[0]


def redact_messages_counted(messages: Sequence[Message]) -> tuple[list[Message], int]:
    """The messages redacted as one stream, in order, and how many secrets were redacted;
    messages left blank are dropped.

    A span a message leaves open goes on into the next messages: they are private up to the
    closing tag, and the message that closes it keeps only its text after the close. A span
    still open at the last message redacts to the end (fails closed). Memory-index blocks are
    removed from each message first; secrets (``privacy.secrets``) after the private spans,
    and a secret found in one message is redacted wherever a later message repeats it.
    """
    kept: list[Message] = []
    depth = secrets = 0
    known: frozenset[str] = frozenset()
    for message in messages:
        redacted, depth = redact_private(strip_index_text(message.content), depth)
        redacted, count, found = redact_secrets(redacted, known)
        secrets += count
        known |= found
        if not redacted.strip():
            continue
        # Messages are frozen: one without a span is shared, not copied (most turns).
        same = redacted == message.content
        kept.append(message if same else message.model_copy(update={"content": redacted}))
    return kept, secrets


def redact_conversation_id(conversation_id: str, messages: Sequence[Message]) -> str:
    """The conversation id under the privacy rule; ``messages`` are the redacted messages.

    An id without a private span is kept as it is. One with a span becomes its redacted form
    (``chat-[REDACTED]``), unless nothing else is left of it (blank, or only ``[REDACTED]``)
    or it grows past 255 characters: then it becomes ``redacted-`` and the first 16 hex
    digits of the transcript's content hash, an id that is stable (the same conversation gets
    the same id, whatever format it came in) and says nothing of the secret.
    """
    redacted = redact_text(conversation_id)
    if redacted == conversation_id:
        return conversation_id
    if redacted.strip() in ("", REDACTED) or len(redacted) > _MAX_ID_CHARS:
        return REDACTED_ID_PREFIX + _content_hash(messages)[:16]
    return redacted


def redact_transcript(t: Transcript) -> Transcript:
    """A copy of ``t`` with every text field that is stored or logged redacted.

    Messages go through redact_messages (one stream, so a span may run across messages);
    the title and the source path each through redact_text on their own, and either becomes
    None when left blank; the conversation id through redact_conversation_id. The owner is a
    principal, checked where it comes in, and is not changed. The secrets redacted are added
    to ``secrets_redacted`` (a transcript redacted again adds none). Idempotent.
    """
    messages, secrets = redact_messages_counted(t.messages)
    title = redact_text(t.title) if t.title is not None else None
    source = redact_text(t.source_path) if t.source_path is not None else None
    return t.model_copy(
        update={
            "conversation_id": redact_conversation_id(t.conversation_id, messages),
            "messages": messages,
            "title": title if title and title.strip() else None,
            "source_path": source if source and source.strip() else None,
            "secrets_redacted": t.secrets_redacted + secrets,
        }
    )


def _content_hash(messages: Sequence[Message]) -> str:
    said = [[m.role, m.content.strip()] for m in messages]
    canonical = json.dumps(
        {"v": _HASH_VERSION, "messages": said}, ensure_ascii=False, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def messages_hash(messages: Sequence[Message]) -> str:
    """sha256 hex of what ``messages`` say once redacted (see transcript_hash)."""
    return _content_hash(redact_messages(messages))


def transcript_hash(t: Transcript) -> str:
    """sha256 hex of what was said: the redacted roles and contents, in order.

    Ids, titles, timestamps, owner and source are left out, so one conversation read from any
    format (or re-exported later) hashes the same; edge whitespace of a turn does not count.
    """
    return messages_hash(t.messages)
