"""Lexical search with recency and pinning in the ranking.

    score = (1 - recency_weight) * lexical + recency_weight * recency + pinned_bonus * pinned
    lexical = r / (1 + r)                       r = the engine's raw relevance, >= 0
    recency = 0.5 ** (age_days / half_life_days) age since the note was last updated

``r`` is ``ts_rank_cd`` on PostgreSQL and ``-bm25`` on SQLite FTS5 (title weighs 10, topics 5,
body 1). The LIKE fallback, used when the engine cannot use the query (no word in it, only
stop words, or a parse error), scores the share of query words found. Only live notes match.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from store.errors import InvalidInput
from store.models import LIVE, Memory
from store.schemas import Note, Scope, SearchHit
from store.settings import Settings
from store.text import check_text, snippet, words

MAX_LIMIT = 100
MAX_QUERY_WORDS = 32
LN2 = 0.6931471805599453


def _params(settings: Settings, scope: Scope, limit: int) -> dict[str, Any]:
    return {
        "kind": scope.kind,
        "sid": scope.id,
        "live": LIVE,
        "w": settings.recency_weight,
        "half": settings.half_life_days,
        "bonus": settings.pinned_bonus,
        "limit": limit,
    }


_PG_FTS = text(
    """
    SELECT id, lexical, recency,
           (1 - :w) * lexical + :w * recency + CASE WHEN pinned THEN :bonus ELSE 0 END AS score
    FROM (
        SELECT m.id, m.pinned,
               ts_rank_cd(m.search_vector, q, 32) AS lexical,
               power(0.5, least(extract(epoch FROM (now() - m.updated_at)) / 86400.0 / :half, 1000))
                   AS recency
        FROM memories m, websearch_to_tsquery('english', :q) q
        WHERE m.scope_kind = :kind AND m.scope_id = :sid AND m.status = :live
          AND m.search_vector @@ q
    ) ranked
    ORDER BY score DESC, id DESC
    LIMIT :limit
    """
)

_SQLITE_FTS = text(
    """
    SELECT id, lexical, recency,
           (1 - :w) * lexical + :w * recency + CASE WHEN pinned THEN :bonus ELSE 0 END AS score
    FROM (
        SELECT m.id, m.pinned,
               (-bm25(memories_fts, 10.0, 5.0, 1.0)) / (1 - bm25(memories_fts, 10.0, 5.0, 1.0))
                   AS lexical,
               exp(-0.6931471805599453 * (julianday('now') - julianday(m.updated_at)) / :half)
                   AS recency
        FROM memories_fts JOIN memories m ON m.id = memories_fts.rowid
        WHERE memories_fts MATCH :q
          AND m.scope_kind = :kind AND m.scope_id = :sid AND m.status = :live
    ) ranked
    ORDER BY score DESC, id DESC
    LIMIT :limit
    """
)


def _fts5_query(tokens: list[str]) -> str:
    # Each word quoted: FTS5 operators and punctuation in the user's text stay literal.
    return " ".join('"' + token.replace('"', '""') + '"' for token in tokens)


def _like_rows(
    session: Session, settings: Settings, scope: Scope, needles: list[str], limit: int
) -> list[Row[Any]]:
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        # Capped at 1000 half-lives: PostgreSQL's power() raises on underflow.
        recency = (
            "power(0.5, least(extract(epoch FROM (now() - updated_at)) / 86400.0 / :half, 1000))"
        )
    else:
        recency = f"exp(-{LN2} * (julianday('now') - julianday(updated_at)) / :half)"
    params = _params(settings, scope, limit)
    hits = []
    for i, needle in enumerate(needles):
        params[f"n{i}"] = (
            "%" + needle.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        )
        hits.append(
            " OR ".join(
                f"lower({col}) LIKE :n{i} ESCAPE '\\'" for col in ("title", "topics", "body")
            )
        )
    matched = " + ".join(f"(CASE WHEN {h} THEN 1 ELSE 0 END)" for h in hits)
    sql = f"""
        SELECT id, lexical, recency,
               (1 - :w) * lexical + :w * recency
               + CASE WHEN pinned THEN :bonus ELSE 0 END AS score
        FROM (
            SELECT id, pinned, ({matched}) * 1.0 / {len(needles)} AS lexical,
                   {recency} AS recency
            FROM memories
            WHERE scope_kind = :kind AND scope_id = :sid AND status = :live
        ) ranked
        WHERE lexical > 0
        ORDER BY score DESC, id DESC
        LIMIT :limit
    """  # noqa: S608 - only generated placeholders are interpolated; values are bound
    return list(session.execute(text(sql), params).all())


def search(
    session: Session,
    settings: Settings,
    scope: Scope | tuple[str, str],
    query: str,
    limit: int = 10,
) -> list[SearchHit]:
    """Ranked live notes of the scope matching ``query`` (see the module doc for the score)."""
    scope = Scope.of(scope)
    query = check_text(query, "query", max_bytes=4_000)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"limit must be 1..{MAX_LIMIT}, got {limit!r}", reason="bad_limit")
    if not query.strip():
        return []
    tokens = words(query)[:MAX_QUERY_WORDS]
    dialect = session.get_bind().dialect.name
    rows: list[Row[Any]] | None = None
    backend = "like"
    if settings.search != "like" and tokens:
        params = _params(settings, scope, limit)
        if dialect == "postgresql":
            params["q"] = " ".join(tokens)
            empty = session.execute(
                text("SELECT numnode(websearch_to_tsquery('english', :q)) = 0"), params
            ).scalar_one()
            if not empty:  # only stop words: nothing for full text to match on
                rows, backend = list(session.execute(_PG_FTS, params).all()), "postgres-fts"
        else:
            params["q"] = _fts5_query(tokens)
            try:
                with session.begin_nested():
                    rows = list(session.execute(_SQLITE_FTS, params).all())
                backend = "sqlite-fts5"
            except OperationalError:
                rows = None  # the engine could not parse it: fall back to LIKE
    if rows is None:
        rows = _like_rows(session, settings, scope, tokens or [query.strip()], limit)
    by_id = {
        row.id: row
        for row in session.execute(
            select(Memory).where(Memory.id.in_([r.id for r in rows]))
        ).scalars()
    }
    return [
        SearchHit(
            memory=Note.from_row(by_id[r.id]),
            score=round(float(r.score), 6),
            lexical=round(float(r.lexical), 6),
            recency=round(float(r.recency), 6),
            snippet=snippet(by_id[r.id].body, tokens),
            backend=backend,
        )
        for r in rows
    ]
