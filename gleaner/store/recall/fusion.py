"""Hybrid search's ranking: a lexical (BM25) ranking and a vector (cosine) ranking of the same
query fused into one, then recency and pins added as in the lexical score (``store.recall.search``
has the formulas)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Connection, Row, select

from gleaner.store.schema.sql import ID_CHUNK, MAX_HALF_LIVES, one_of
from gleaner.store.schema.tables import MEMORIES
from gleaner.store.schemas import Note, ScoreParts, SearchHit
from gleaner.store.text import snippet

if TYPE_CHECKING:
    from gleaner.config.store import StoreSettings
    from gleaner.store.schema.models import Memory


# Hybrid search: how deep each ranking is read, and how the two are fused (the bench's
# recall scenario measures both ways on the development part of its labelled set: mix won).
FUSION_DEPTH = 50
FUSION = "mix"
RRF_K = 60
MIX_LEXICAL = 0.5


def _recency(said: datetime, half_life_days: float, now: datetime) -> float:
    """``0.5 ** (age_days / half_life_days)``, as the SQL computes it (a future time is
    now; at most MAX_HALF_LIVES half-lives)."""
    said = said if said.tzinfo is not None else said.replace(tzinfo=UTC)
    days = max((now - said).total_seconds(), 0.0) / 86400.0
    return float(0.5 ** min(days / half_life_days, MAX_HALF_LIVES))


def fused_hits(
    conn: Connection,
    settings: StoreSettings,
    lexical: list[Row[Any]],
    nearest: list[tuple[int, float]],
    *,
    limit: int,
    needles: list[str],
    fusion: str,
) -> list[SearchHit]:
    """The hybrid ranking: each note's relevance from both rankings (see the module doc),
    over the best of the best, then recency and pins as in the lexical score."""
    rows: dict[int, Any] = {int(row.id): row for row in lexical}
    lexical_rank = {int(row.id): rank for rank, row in enumerate(lexical, 1)}
    bm25 = {int(row.id): float(row.bm25) for row in lexical}
    cosine = dict(nearest)
    vector_rank = {note_id: rank for rank, (note_id, _) in enumerate(nearest, 1)}
    missing = [note_id for note_id in cosine if note_id not in rows]
    for start in range(0, len(missing), ID_CHUNK):
        found = conn.execute(
            select(MEMORIES).where(one_of(MEMORIES.c.id, "ids")),
            {"ids": missing[start : start + ID_CHUNK]},
        )
        rows.update((int(row.id), row) for row in found)
    top_bm25 = max(bm25.values(), default=0.0)
    top_cosine = max((max(c, 0.0) for c in cosine.values()), default=0.0)
    relevance: dict[int, float] = {}
    for note_id in rows:
        if fusion == "mix":
            lexical_part = bm25.get(note_id, 0.0) / top_bm25 if top_bm25 > 0 else 0.0
            semantic_part = max(cosine.get(note_id, 0.0), 0.0) / top_cosine if top_cosine else 0.0
            relevance[note_id] = MIX_LEXICAL * lexical_part + (1 - MIX_LEXICAL) * semantic_part
        else:
            relevance[note_id] = sum(
                1 / (RRF_K + ranks[note_id])
                for ranks in (lexical_rank, vector_rank)
                if note_id in ranks
            )
    best = max(relevance.values(), default=0.0) or 1.0
    weight, bonus = settings.recency_weight, settings.pinned_bonus
    now = datetime.now(UTC)
    hits = []
    for note_id, row in rows.items():
        note = Note.from_row(cast("Memory", row))
        factor = relevance[note_id] / best
        recency = _recency(note.said_at or note.updated_at, settings.half_life_days, now)
        parts = ScoreParts(
            lexical=round((1 - weight) * factor, 6),
            recency=round(weight * recency, 6),
            pinned=bonus if note.pinned else 0.0,
        )
        hits.append(
            SearchHit(
                memory=note,
                score=round(parts.lexical + parts.recency + parts.pinned, 6),
                lexical=round(factor, 6),
                recency=round(recency, 6),
                bm25=round(bm25.get(note_id, 0.0), 6),
                semantic=None if note_id not in cosine else round(cosine[note_id], 6),
                snippet=snippet(note.body, needles),
                backend="hybrid",
                parts=parts,
            )
        )
    hits.sort(key=lambda h: (-h.score, -h.memory.id))
    return hits[:limit]
