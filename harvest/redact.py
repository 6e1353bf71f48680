"""The privacy strip for transcripts, and the hash that identifies a conversation's content."""

from __future__ import annotations

import hashlib
import json

from harvest.transcript import Transcript
from store.index import strip_index_text
from store.text import strip_private

# Bump when the canonical form changes, so old and new hashes cannot collide by accident.
_HASH_VERSION = 1


def redact_text(text: str) -> str:
    """``text`` without injected memory-index blocks and with ``<private>`` spans redacted.

    The index goes first so a private tag inside an injected block leaves no trace.
    """
    return strip_private(strip_index_text(text))


def redact_transcript(t: Transcript) -> Transcript:
    """A copy of ``t`` whose title and messages went through redact_text.

    Messages left blank (a turn that was only a memory index) are dropped; a title left blank
    becomes None. Idempotent.
    """
    messages = [
        m.model_copy(update={"content": redacted})
        for m in t.messages
        if (redacted := redact_text(m.content)).strip()
    ]
    title = redact_text(t.title) if t.title is not None else None
    return t.model_copy(
        update={"messages": messages, "title": title if title and title.strip() else None}
    )


def transcript_hash(t: Transcript) -> str:
    """sha256 hex of what was said: the redacted roles and contents, in order.

    Ids, titles, timestamps, owner and source are left out, so one conversation read from any
    format (or re-exported later) hashes the same; edge whitespace of a turn does not count.
    """
    said = [[m.role, m.content.strip()] for m in redact_transcript(t).messages]
    canonical = json.dumps(
        {"v": _HASH_VERSION, "messages": said}, ensure_ascii=False, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
