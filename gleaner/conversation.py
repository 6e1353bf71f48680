"""One conversation handed over from Python, HTTP or MCP: read, bounded, taken in.

The bytes go through the same readers, formats and limits as a file given to
``gleaner enqueue``, then the one intake step (``harvest.intake.settle``: values checked,
redacted, owner settled); what is kept afterwards is the redacted transcript only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gleaner.errors import InvalidRequest, TooLarge, translated

if TYPE_CHECKING:
    from gleaner.harvest.intake import Settled
    from gleaner.harvest.transcript import Transcript
    from gleaner.store import Settings

# Stands for the file in the readers' labels and errors (there is none).
DOCUMENT_NAME = "conversation"

ConversationInput = Mapping[str, Any] | Sequence[Any] | str | bytes


@dataclass(frozen=True)
class Conversation:
    """A conversation ready to submit: ``owner`` is whose scope its notes go to, and
    ``transcript`` is already redacted (nothing after reading sees a ``<private>`` span)."""

    owner: str
    conversation_id: str
    transcript: Transcript
    # ``read(..., reassign_owner=True)`` put a transcript that names another owner in
    # ``owner``'s scope; without it ``submit`` refuses such a pair (built by hand, mixed up).
    reassigned: bool = False
    # What ``read`` took in (``harvest.intake``), which ``submit`` records as it is; one
    # built by hand (or changed since) has none that matches, and ``submit`` takes it in.
    settled: Settled | None = field(default=None, repr=False, compare=False)

    def taken_in(self) -> Settled | None:
        """What ``read`` took in, if this is still the conversation it made."""
        found = self.settled
        if found is None or found.transcript is not self.transcript:
            return None
        return found if found.owner == self.owner else None


def read_conversation(
    document: ConversationInput,
    settings: Settings,
    *,
    owner: str | None = None,
    reassign_owner: bool = False,
    upload: bool = False,
) -> Conversation:
    """``read_settled``'s conversation as a ``Conversation`` that ``submit`` takes."""
    settled = read_settled(
        document, settings, owner=owner, reassign_owner=reassign_owner, upload=upload
    )
    return Conversation(
        owner=settled.owner,
        conversation_id=settled.conversation_id,
        transcript=settled.transcript,
        reassigned=reassign_owner,
        settled=settled,
    )


def read_settled(
    document: ConversationInput,
    settings: Settings,
    *,
    owner: str | None = None,
    reassign_owner: bool = False,
    upload: bool = False,
) -> Settled:
    """Read exactly one conversation from ``document`` under the CLI's formats and limits.

    ``document`` is a file's bytes or text, or its parsed JSON (a native conversation, an
    OpenAI-style ``{"messages": [...]}``, a one-conversation export...). ``owner`` fills in a
    conversation that names none; ``reassign_owner`` puts it in ``owner``'s scope whatever it
    names. ``upload`` bounds the document (a zip's conversations.json inflated) by
    GLEANER_HTTP_MAX_BODY_BYTES too: a request body, not a file an operator chose.
    InvalidRequest (``bad_transcript``, ``no_owner``, ``bad_owner``,
    ``not_one_conversation``) or TooLarge when it cannot be taken as it is.
    """
    from gleaner.harvest.intake import settle
    from gleaner.harvest.readers import read_bytes
    from gleaner.harvest.transcript import Limits
    from gleaner.store.text import check_principal

    data = _as_bytes(document)
    with translated():
        if owner is not None:
            owner = check_principal(owner)  # refused even when the conversation names its own
        limits = Limits.from_settings(settings)
        if upload and settings.http_max_body_bytes < limits.file_bytes:
            limits = limits.model_copy(
                update={
                    "file_bytes": settings.http_max_body_bytes,
                    "file_bytes_setting": "GLEANER_HTTP_MAX_BODY_BYTES",
                }
            )
        found = read_bytes(data, DOCUMENT_NAME, limits=limits)
    if found.errors:
        _, why = found.errors[0]
        reason = why.split(":", 1)[0] if why.startswith(("too_large:", "too_deep:")) else None
        kind = TooLarge if reason == "too_large" else InvalidRequest
        raise kind(f"{DOCUMENT_NAME}: {why}", reason=reason or "bad_transcript")
    if len(found.transcripts) != 1:
        raise InvalidRequest(
            f"the document holds {len(found.transcripts)} conversations: submit one at a time",
            reason="not_one_conversation",
        )
    transcript = found.transcripts[0].model_copy(update={"source_path": None})
    with translated():  # the one intake step: values, redaction, owner
        return settle(transcript, owner, reassign_owner=reassign_owner)


def _as_bytes(document: ConversationInput) -> bytes:
    if isinstance(document, bytes | bytearray | memoryview):
        return bytes(document)
    if isinstance(document, str):
        return document.encode("utf-8", "surrogatepass")
    if isinstance(document, Mapping | list | tuple):
        try:
            return json.dumps(document, ensure_ascii=False).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(
                f"the conversation is not JSON-serializable ({exc})", reason="bad_transcript"
            ) from None
        except RecursionError:
            raise InvalidRequest(
                "the conversation is nested too deeply to be one", reason="too_deep"
            ) from None
    raise InvalidRequest(
        f"a conversation is bytes, text or its parsed JSON, got {type(document).__name__}",
        reason="bad_transcript",
    )
