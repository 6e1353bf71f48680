"""``gleaner eval``'s baseline, BM25 over the haystack's turns, and the memory entries
(Gleaner's notes or the baseline's turns) the answer model is shown."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gleaner.eval_items import Item, said
from gleaner.eval_prompts import NO_ENTRIES

if TYPE_CHECKING:
    from gleaner.store import SearchHit

# Characters of each retrieved text kept in a record (the answer model sees all of it).
RECORD_TEXT_CHARS = 300
_WORD = re.compile(r"[a-z0-9]+")


def stop_words() -> frozenset[str]:
    from gleaner.store.notes.terms import CLASSIC_STOP_WORDS

    return frozenset(word for entry in CLASSIC_STOP_WORDS for word in _WORD.findall(entry))


def bm25_tokens(text: str, stop: frozenset[str]) -> list[str]:
    """Lowercase words (letters and digits) less English stop words."""
    return [word for word in _WORD.findall(text.lower()) if word not in stop]


@dataclass(frozen=True)
class Entry:
    """One retrieved text as the answer model sees it, and as a record keeps it."""

    when: datetime | None
    text: str
    ref: str
    score: float

    def line(self) -> str:
        return f"({said(self.when)}) {self.text}"

    def record(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "said": said(self.when),
            "score": round(self.score, 4),
            "text": self.text[:RECORD_TEXT_CHARS],
        }


class TurnIndex:
    """BM25Okapi (``rank_bm25``) over every turn of an item's haystack, one turn a document."""

    def __init__(self, item: Item, stop: frozenset[str]) -> None:
        from rank_bm25 import BM25Okapi

        self.stop = stop
        self.turns = [
            (session, number, turn)
            for session in item.sessions
            for number, turn in enumerate(session.turns)
        ]
        corpus = [bm25_tokens(turn.content, stop) for _, _, turn in self.turns]
        # rank_bm25 divides by the corpus's words: a haystack with none has nothing to rank.
        self.bm25 = BM25Okapi(corpus) if any(corpus) else None

    def search(self, query: str, limit: int) -> list[Entry]:
        """The ``limit`` best turns for ``query``, best first (ties in haystack order)."""
        if self.bm25 is None:
            return []
        scores = [float(s) for s in self.bm25.get_scores(bm25_tokens(query, self.stop))]
        best = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:limit]
        return [
            Entry(
                when=self.turns[i][0].when,
                text=f"{self.turns[i][2].role}: {self.turns[i][2].content}",
                ref=f"{self.turns[i][0].id}#{self.turns[i][1]}",
                score=scores[i],
            )
            for i in best
        ]


def note_entries(hits: Sequence[SearchHit]) -> list[Entry]:
    """Gleaner's hits as entries: title and body, said when the fact was said (else when
    the note was made)."""
    return [
        Entry(
            when=hit.memory.occurred_at or hit.memory.created_at,
            text=f"{hit.memory.title}: {hit.memory.body}",
            ref=hit.memory.slug,
            score=hit.score,
        )
        for hit in hits
    ]


def context_text(entries: Sequence[Entry]) -> str:
    """The entries oldest first, numbered, one a line (a text's own lines indented)."""
    known = [e for e in entries if e.when is not None]
    ordered = sorted(known, key=lambda e: e.when or datetime.min) + [
        e for e in entries if e.when is None
    ]
    lines = [
        f"[{number}] " + entry.line().replace("\n", "\n    ")
        for number, entry in enumerate(ordered, 1)
    ]
    return "\n".join(lines) or NO_ENTRIES
