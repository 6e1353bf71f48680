"""Grounded notes: a harvested note must rest on what was said in its conversation.

Each candidate carries one or two short verbatim quotes with their speaker. A quote is
**found** when, case and whitespace aside (and curly quotes, dashes and ellipses read as
their plain forms), it is part of one message of the (redacted) transcript; the speaker kept
is that message's role, whatever the model said. A candidate is **grounded** when a quote is
found, and, for a ``profile`` or ``preference`` note (a fact about the user), when one is
found in the user's own words: an assistant's suggestion is not the user's preference.
Anything else is dropped and counted (``items_ungrounded``); the offline extractor quotes the
sentence it used, so its notes are grounded by construction.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from gleaner.harvest.candidate import NoteCandidate
from gleaner.harvest.transcript import Message
from gleaner.privacy import strip_private

# Facts about the user: they must rest on the user's own words.
USER_FACT_TYPES = frozenset({"profile", "preference"})
# A quote of fewer letters and digits than this (punctuation, one letter) grounds nothing.
MIN_QUOTE_CHARS = 2

_FOLD = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u2013": "-",
        "\u2014": "-",
        "\u2026": "...",
        "\u00a0": " ",
    }
)
_SPACE = re.compile(r"\s+")
_EDGES = re.compile(r"^[\s\"'.\u2026]+|[\s\"'.\u2026]+$")


def fold(text: str) -> str:
    """Text as quotes are compared: casefolded, typographic marks plain, spaces collapsed."""
    return _SPACE.sub(" ", text.translate(_FOLD).casefold()).strip()


@dataclass(frozen=True)
class Transcript:
    """The messages a harvest's quotes are looked up in, folded once."""

    messages: tuple[tuple[str, str], ...]  # (role, folded text)

    @classmethod
    def of(cls, messages: Sequence[Message]) -> Transcript:
        return cls(tuple((m.role, fold(m.content)) for m in messages if m.content.strip()))

    def speaker_of(self, quote: str) -> str | None:
        """The role of the first message holding ``quote`` (folded; its surrounding quote
        marks and ellipses aside), or None when none does or it says too little."""
        wanted = _EDGES.sub("", fold(quote))
        if sum(c.isalnum() for c in wanted) < MIN_QUOTE_CHARS:
            return None
        for role, text in self.messages:
            if wanted in text:
                return role
        return None


def grounded(candidate: NoteCandidate, transcript: Transcript) -> NoteCandidate | None:
    """The candidate with its evidence as found (each quote's speaker the message's role,
    quotes not found left out), or None when it is not grounded (see the module doc)."""
    found = []
    for item in candidate.evidence:
        quote = strip_private(item.quote).strip()
        speaker = transcript.speaker_of(quote)
        if speaker is not None:
            found.append(item.model_copy(update={"speaker": speaker, "quote": quote}))
    if not found:
        return None
    if candidate.type in USER_FACT_TYPES and all(q.speaker != "user" for q in found):
        return None
    return candidate.model_copy(update={"evidence": found})
