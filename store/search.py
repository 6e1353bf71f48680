"""Lexical search with recency and pinning in the ranking.

    score = (1 - recency_weight) * lexical + recency_weight * recency + pinned_bonus * pinned
    lexical = r / (1 + r)                       r = the engine's raw relevance, >= 0
    recency = 0.5 ** (age_days / half_life_days) age since the note was last updated

``r`` is ``ts_rank_cd`` on PostgreSQL and ``-bm25`` on SQLite FTS5 (title weighs 10, topics 5,
body 1). The LIKE fallback, used when the engine cannot use the query (a parse error, or a
word the engine takes for a stop word), scores the share of query words found. Only live notes
match.

A query is searched by its **content words** (``content_words``): its words less English stop
words (the ``stopwords`` package's list, apostrophe-free entries, and the pieces contractions
split into). A query with none (``the``, ``-``, ``?!``) matches nothing: it returns no hit
rather than every note holding ``the`` (callers say why: see ``content_words``).

The score is computed for a bounded candidate set: the newest ``RANK_CANDIDATES`` matches of
the scope (by ``updated_seq`` on PostgreSQL, by note id on SQLite); the top ``limit`` of those
by the formula is returned. A scope with fewer matches is ranked in full.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import stopwords
from sqlalchemy import BigInteger, Connection, Float, Row, TextClause, column, select, text
from sqlalchemy.exc import OperationalError

from store.errors import InvalidInput
from store.schemas import Note, Scope, ScoreParts, SearchHit
from store.sql import recency_sql
from store.tables import LIVE, MEMORIES
from store.text import check_text, quoted, snippet, words

if TYPE_CHECKING:
    from store.models import Memory
    from store.settings import Settings

MAX_LIMIT = 100
MAX_QUERY_WORDS = 32
# Words that carry no meaning on their own; a contraction splits into a word and one of the
# trailing pieces ("don't" -> "don", "t"), which are no words either.
SEARCH_STOP_WORDS = frozenset(
    w for w in stopwords.get_stopwords("english") if w and "'" not in w
) | frozenset({"s", "t", "d", "ll", "re", "ve", "m"})


def content_words(query: str) -> list[str]:
    """The words of ``query`` that search looks for (lowercased, in order, at most 32).

    Empty when the query holds only stop words or no word at all: ``search`` then returns no
    hit, and a caller that shows results says the query had nothing to look for.
    """
    return [w for w in words(query) if w not in SEARCH_STOP_WORDS][:MAX_QUERY_WORDS]


def search_params(settings: Settings, scope: Scope, limit: int) -> dict[str, Any]:
    """The parameters every search statement takes (scope, ranking settings, limit)."""
    return {
        "kind": scope.kind,
        "sid": scope.id,
        "live": LIVE,
        "w": settings.recency_weight,
        "half": settings.half_life_days,
        "bonus": settings.pinned_bonus,
        "limit": limit,
        "candidates": RANK_CANDIDATES,
    }


# Only the newest RANK_CANDIDATES matches are ranked: a common word in a large scope matches
# tens of thousands of notes, and fetching and ranking each one costs far more than the query.
# For a common query the planner walks the scope's notes newest first and stops after that
# many matches; for a rarer one the scoped GIN index (scope_id, search_vector) yields the
# scope's matches alone. ts_rank_cd runs only on the candidates.
RANK_CANDIDATES = 100

# The recency fragment is the store's own SQL (store.sql), no input: every value is bound.
_PG_FTS = text(
    f"""
    SELECT id, lexical, recency,
           (1 - :w) * lexical + :w * recency + CASE WHEN pinned THEN :bonus ELSE 0 END AS score
    FROM (
        SELECT m.id, m.pinned,
               ts_rank_cd(m.search_vector, q, 32) AS lexical,
               {recency_sql("postgresql", "m.updated_at")} AS recency
        FROM (
            SELECT c.id
            FROM memories c
            WHERE c.scope_kind = :kind AND c.scope_id = :sid AND c.status = :live
              AND c.search_vector @@ websearch_to_tsquery('english', :q)
            ORDER BY c.updated_seq DESC
            LIMIT :candidates
        ) newest
        JOIN memories m ON m.id = newest.id,
        websearch_to_tsquery('english', :q) q
    ) ranked
    ORDER BY score DESC, id DESC
    LIMIT :limit
    """  # noqa: S608
)

# FTS5 hands matches out by rowid (the note id, so creation order) and stops after the newest
# RANK_CANDIDATES in the scope; bm25 is computed only for those.
_PG_CUSTOM_PLAN = text("SET LOCAL plan_cache_mode = force_custom_plan")
_PG_EMPTY = text("SELECT numnode(websearch_to_tsquery('english', :q)) = 0")

_SQLITE_FTS = text(
    f"""
    SELECT id, lexical, recency,
           (1 - :w) * lexical + :w * recency + CASE WHEN pinned THEN :bonus ELSE 0 END AS score
    FROM (
        SELECT m.id, m.pinned,
               (-bm25(memories_fts, 10.0, 5.0, 1.0)) / (1 - bm25(memories_fts, 10.0, 5.0, 1.0))
                   AS lexical,
               {recency_sql("sqlite", "m.updated_at")} AS recency
        FROM memories_fts JOIN memories m ON m.id = memories_fts.rowid
        WHERE memories_fts MATCH :q
          AND m.scope_kind = :kind AND m.scope_id = :sid AND m.status = :live
        ORDER BY memories_fts.rowid DESC
        LIMIT :candidates
    ) ranked
    ORDER BY score DESC, id DESC
    LIMIT :limit
    """  # noqa: S608
)


def _fts5_query(tokens: list[str]) -> str:
    # Each word quoted: FTS5 operators and punctuation in the user's text stay literal.
    return " ".join('"' + token.replace('"', '""') + '"' for token in tokens)


def _like_query(
    dialect: str, settings: Settings, scope: Scope, needles: list[str], limit: int
) -> tuple[TextClause, dict[str, Any]]:
    recency = recency_sql(dialect)
    params = search_params(settings, scope, limit)
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
    return text(sql), params


def _ranked(conn: Connection, sql: TextClause, params: dict[str, Any]) -> list[Row[Any]]:
    """The notes the ranking query picks, read with their scores in the same round trip:
    each row is a ``memories`` row (Core, no ORM) plus ``lexical``, ``recency``, ``score``."""
    ranked = sql.columns(
        column("id", BigInteger),
        column("lexical", Float),
        column("recency", Float),
        column("score", Float),
    ).subquery("ranked")
    return list(
        conn.execute(
            select(MEMORIES, ranked.c.lexical, ranked.c.recency, ranked.c.score)
            .join(ranked, MEMORIES.c.id == ranked.c.id)
            .order_by(ranked.c.score.desc(), ranked.c.id.desc()),
            params,
        ).all()
    )


def search(
    conn: Connection,
    settings: Settings,
    scope: Scope | tuple[str, str],
    query: str,
    limit: int = 10,
) -> list[SearchHit]:
    """Ranked live notes of the scope matching ``query`` (see the module doc for the score).

    Reads through Core on ``conn`` (a session's is ``session.connection()``)."""
    scope = Scope.of(scope)
    query = check_text(query, "query", max_bytes=4_000)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"limit must be 1..{MAX_LIMIT}, got {quoted(limit)}", reason="bad_limit")
    tokens = content_words(query)
    if not tokens:
        return []  # only stop words or punctuation: nothing to look for
    dialect = conn.dialect.name
    rows: list[Row[Any]] | None = None
    backend = "like"
    if settings.search != "like":
        params = search_params(settings, scope, limit)
        if dialect == "postgresql":
            params["q"] = " ".join(tokens)
            # The driver prepares a statement run often, and PostgreSQL may then settle on one
            # generic plan; the best plan here depends on how common the words are.
            conn.execute(_PG_CUSTOM_PLAN)
            rows, backend = _ranked(conn, _PG_FTS, params), "postgres-fts"
            # No hit may mean only stop words: nothing for full text to match on.
            if not rows and conn.execute(_PG_EMPTY, params).scalar_one():
                rows, backend = None, "like"
        else:
            params["q"] = _fts5_query(tokens)
            try:
                with conn.begin_nested():
                    rows = _ranked(conn, _SQLITE_FTS, params)
                backend = "sqlite-fts5"
            except OperationalError as exc:
                # Only FTS5 refusing the query sends it to LIKE: a missing table or a locked
                # database is a failure to report, not a reason to search another way.
                if "fts5" not in str(exc.orig).lower():
                    raise
                rows, backend = None, "like"
    if rows is None:
        sql, params = _like_query(dialect, settings, scope, tokens, limit)
        rows = _ranked(conn, sql, params)
    weight, bonus = settings.recency_weight, settings.pinned_bonus
    return [
        SearchHit(
            # A memories row has every attribute from_row reads, by the same names.
            memory=Note.from_row(cast("Memory", row)),
            score=round(float(row.score), 6),
            lexical=round(float(row.lexical), 6),
            recency=round(float(row.recency), 6),
            snippet=snippet(row.body, tokens),
            backend=backend,
            # The score's three terms, from values already fetched: no work for the database.
            parts=ScoreParts(
                lexical=round((1 - weight) * float(row.lexical), 6),
                recency=round(weight * float(row.recency), 6),
                pinned=bonus if row.pinned else 0.0,
            ),
        )
        for row in rows
    ]
