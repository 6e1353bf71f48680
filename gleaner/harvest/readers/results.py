"""What reading a path returns: the conversations read and the ones skipped, each skipped
one under a label (where it was) and a reason (why)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from gleaner.harvest.errors import TranscriptFormatError
from gleaner.harvest.redact import redact_text
from gleaner.harvest.transcript import Transcript

# A conversation id is at most this long (the transcript refuses longer ones).
_MAX_LABEL_ID_CHARS = 255


@dataclass
class ReadResult:
    """The conversations read from one path, and the ones skipped as ``(label, reason)``.

    A label is the file, then ``[index]`` in a JSON list or ``:line`` in JSON Lines, then the
    conversation's id when it has one: ``export/conversations.json[3] 6634f0a0-...``. A
    reason is a format error's message; any other refusal starts with its machine-readable
    name (``too_large: ...``, ``too_deep: ...``).
    """

    transcripts: list[Transcript] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)

    def items(self) -> Iterator[Read]:
        for transcript in self.transcripts:
            yield Read(transcript)
        for label, reason in self.errors:
            yield Read(None, label, reason)


@dataclass(frozen=True)
class Read:
    """One conversation read from a path (:func:`iter_path`): its transcript, or the label
    and reason of one that was skipped (as in :class:`ReadResult`)."""

    transcript: Transcript | None
    label: str = ""
    error: str = ""


def label_of(base: str, obj: object) -> str:
    """``base`` (a path) and the conversation's id, each under the privacy rule, the id cut
    to 255 characters (a label is printed and stored whether or not the conversation could
    be read)."""
    for key in ("conversation_id", "uuid", "id"):
        value = obj.get(key) if isinstance(obj, Mapping) else None
        if isinstance(value, str | int) and not isinstance(value, bool) and value != "":
            shown = redact_text(str(value))
            if len(shown) > _MAX_LABEL_ID_CHARS:
                shown = shown[:_MAX_LABEL_ID_CHARS] + "…"
            return f"{redact_text(base)} {shown}"
    return redact_text(base)


def refusal(exc: TranscriptFormatError, where: str) -> str:
    """The reason recorded for a conversation: a format error's message, any other refusal
    named first (``too_large: line 3: conversation too large: ...``)."""
    if exc.reason == TranscriptFormatError.reason:
        return where + exc.message
    return f"{exc.reason}: {where}{exc.message}"
