"""Ranked any-word search: BM25 over the store's own postings, with recency and pinning.

A query is looked up by its **search terms** (``store.search_terms``: stemmed words less
stop words). A note matching *any* of them is a hit; hits rank by

    score    = (1 - recency_weight) * lexical + recency_weight * recency + pinned_bonus * pinned
    lexical  = bm25 / (the highest bm25 among the query's hits)       1.0 for the best match
    bm25     = sum over the query's terms t in the note of
               idf(t) * f * (k1 + 1) / (f + k1 * (1 - b + b * length / avg_length))
    idf(t)   = ln(1 + (N - df + 0.5) / (df + 0.5))
    recency  = 0.5 ** (age_days / half_life_days)       age since the fact was said

with ``k1`` = 1.2 and ``b`` = 0.75 (Okapi BM25's usual values); ``f`` the term's weighted
frequency in the note (a title word counts 2, a topic, topic-key or keyword word 1.5, a body
word 1); ``length`` the note's weighted length; ``N``, ``avg_length`` and ``df`` counted in
the owner's scope (``N`` and ``avg_length`` over its live notes, ``df`` over the notes
holding the term). The fact was said at ``occurred_at`` (the conversation's time), else when
the note's text was last written (``updated_at``). Only live notes match; ``since`` and
``until`` bound when the fact was said.

Bounds that keep a heavy user's search fast (a scope of 100,000 notes):

- a term's postings are read newest first, at most ``TERM_CANDIDATES`` of them: a note
  holding only words that common, and older than that many notes holding them, is not a
  candidate (its words are weak evidence anyway: their idf is low);
- ``df`` is counted up to ``DF_CAP`` (a term in more notes is scored as if in that many);
- the ``RANK_POOL`` best candidates by BM25 are scored by the whole formula (recency and
  pins re-rank them); with a time window every candidate is, its time being needed first;
- ``N`` and ``avg_length`` of a scope of ``CACHED_SCOPE_NOTES`` notes or more are read at
  most once every ``STATS_SECONDS`` per process (a minute's writes barely move them).

**Hybrid** (the caller passes the query's vector: ``GLEANER_EMBED_MODEL`` is set): the
``FUSION_DEPTH`` best notes by BM25 and the ``FUSION_DEPTH`` live notes whose vectors are
nearest the query's (cosine, ``store.vectors``; the same time window) are merged, and
``lexical`` above becomes their fused relevance over the best note's:

    mix (the default):  0.5 * bm25 / best bm25 + 0.5 * cosine / best cosine
    rrf:                sum over both rankings of 1 / (60 + rank)

``mix`` was the better of the two on the development part of the labelled recall set
(``python -m bench --only recall``). Recency and pins are added as above; the LIKE fallback
does not run (the vectors find what words miss).

The LIKE backend (``GLEANER_SEARCH=like``) and the fallback when the index finds nothing
(a query of words the tokenizer cannot match inside longer words: ``postgres`` in
``PostgreSQL``, a run of Chinese characters) score the share of query words found as
substrings of title, topics, keywords or body. A query with no content word (``the``,
``?!``) matches nothing; no query is ever a syntax error.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import BigInteger, Connection, Float, Row, TextClause, column, select, text

from store.errors import InvalidInput
from store.schemas import Note, Scope, ScoreParts, SearchHit
from store.search_terms import STOP_WORDS, query_terms
from store.sql import ID_CHUNK, MAX_HALF_LIVES, one_of, recency_sql
from store.tables import LIVE, MEMORIES
from store.text import check_text, quoted, snippet, words
from store.vectors import nearest as nearest_vectors

if TYPE_CHECKING:
    from store.models import Memory
    from store.settings import Settings

MAX_LIMIT = 100
MAX_QUERY_WORDS = 32
K1 = 1.2
B = 0.75
TERM_CANDIDATES = 2_000
DF_CAP = 10_000
RANK_POOL = 200
# Hybrid search: how deep each ranking is read, and how the two are fused (the bench's
# recall scenario measures both ways on the development part of its labelled set: mix won).
FUSION_DEPTH = 50
FUSION = "mix"
RRF_K = 60
MIX_LEXICAL = 0.5
CACHED_SCOPE_NOTES = 10_000
STATS_SECONDS = 60.0
# Words that carry no meaning on their own (the search tokenizer's list).
SEARCH_STOP_WORDS = STOP_WORDS
# When the fact was said: the conversation's time, else when the text was last written.
SAID_AT = "coalesce(m.occurred_at, m.updated_at)"


def content_words(query: str) -> list[str]:
    """The words of ``query`` that search looks for (lowercased, in order, at most 32), as
    written: snippets and the LIKE backend use them; the index uses their stems.

    Empty when the query holds only stop words or no word at all: ``search`` then returns no
    hit, and a caller that shows results says the query had nothing to look for.
    """
    return [w for w in words(query) if w not in SEARCH_STOP_WORDS][:MAX_QUERY_WORDS]


@dataclass(frozen=True)
class Bounds:
    """How much of a large scope a search reads (see the module doc)."""

    term_candidates: int = TERM_CANDIDATES
    df_cap: int = DF_CAP
    pool: int = RANK_POOL


# What the benchmark compares the bounded search with: every match, every count exact.
UNBOUNDED = Bounds(term_candidates=2**62, df_cap=2**62, pool=2**62)


@dataclass(frozen=True)
class _Stats:
    notes: int
    avg_length: float
    at: float


# Statistics of large scopes, by (database, scope); bounded (see _remember).
_STATS: dict[tuple[str, str, str], _Stats] = {}
_STATS_LOCK = threading.Lock()
_STATS_MAX = 4_096

_SCOPE_NOTES = (
    "FROM memories WHERE scope_kind = :kind AND scope_id = :sid AND status = :live"
    " AND search_length IS NOT NULL"
)
_SCOPE_COUNT = f"(SELECT count(*) {_SCOPE_NOTES})"
_SCOPE_LENGTH = f"(SELECT avg(search_length) {_SCOPE_NOTES})"


def _stats_and_frequencies(
    conn: Connection, scope: Scope, terms: list[str], cap: int
) -> tuple[int, float, list[int]]:
    """``N`` and ``avg_length`` of the scope's live indexed notes, and how many of its notes
    hold each term (counted up to ``cap``): one statement (the scope's statistics come from
    the cache for a large scope)."""
    key = (conn.engine.url.render_as_string(hide_password=True), scope.kind, scope.id)
    now = time.monotonic()
    cached = _STATS.get(key)
    fresh = cached if cached is not None and now - cached.at < STATS_SECONDS else None
    columns = [] if fresh else [_SCOPE_COUNT, _SCOPE_LENGTH]
    columns += [
        "(SELECT count(*) FROM (SELECT 1 FROM search_postings"  # noqa: S608 - placeholders only
        f" WHERE scope_kind = :kind AND scope_id = :sid AND term = :t{i} LIMIT :cap) x{i})"
        for i in range(len(terms))
    ]
    params: dict[str, Any] = {"kind": scope.kind, "sid": scope.id, "cap": cap, "live": LIVE}
    params.update({f"t{i}": term for i, term in enumerate(terms)})
    row = list(conn.execute(text(f"SELECT {', '.join(columns)}"), params).one())
    if fresh is not None:
        return fresh.notes, fresh.avg_length, [int(n) for n in row]
    notes, avg_length = int(row[0] or 0), float(row[1] or 0.0)
    if notes >= CACHED_SCOPE_NOTES:
        with _STATS_LOCK:
            if len(_STATS) >= _STATS_MAX:
                _STATS.clear()
            _STATS[key] = _Stats(notes, avg_length, now)
    return notes, avg_length, [int(n) for n in row[2:]]


def _idf(notes: int, df: int) -> float:
    df = min(df, notes)
    return math.log(1 + (notes - df + 0.5) / (df + 0.5))


def _window(since: datetime | None, until: datetime | None) -> str:
    where = ""
    if since is not None:
        where += f" AND {SAID_AT} >= :since"
    if until is not None:
        where += f" AND {SAID_AT} < :until"
    return where


def _bm25_query(dialect: str, terms: int, window: str) -> TextClause:
    """The ranking statement for ``terms`` query terms: each term's newest postings, summed
    into BM25 per note, the best ``:pool`` of them (all, with a time ``window``, which
    needs every candidate's time) joined with the live notes of the scope and scored."""
    pool = "" if window else "ORDER BY bm25 DESC, memory_id DESC LIMIT :pool"
    postings = " UNION ALL ".join(
        "SELECT * FROM (SELECT memory_id, weight, length, "  # noqa: S608 - placeholders only
        f"CAST(:idf{i} AS FLOAT) AS idf FROM search_postings"
        f" WHERE scope_kind = :kind AND scope_id = :sid AND term = :t{i}"
        f" ORDER BY memory_id DESC LIMIT :per_term) p{i}"
        for i in range(terms)
    )
    recency = recency_sql(dialect, SAID_AT)
    return text(
        f"""
        SELECT id, bm25, lexical, recency,
               (1 - :w) * lexical + :w * recency
               + CASE WHEN pinned THEN :bonus ELSE 0 END AS score
        FROM (
            SELECT m.id, m.pinned, c.bm25, c.bm25 / max(c.bm25) OVER () AS lexical,
                   {recency} AS recency
            FROM (
                SELECT memory_id,
                       sum(idf * weight * (:k1 + 1)
                           / (weight + :k1 * (1 - :b + :b * length / :avg_length))) AS bm25
                FROM ({postings}) candidates
                GROUP BY memory_id
                {pool}
            ) c
            JOIN memories m ON m.id = c.memory_id
            WHERE m.status = :live AND m.scope_kind = :kind AND m.scope_id = :sid{window}
        ) ranked
        ORDER BY score DESC, id DESC
        LIMIT :limit
        """  # noqa: S608 - only generated placeholders and the store's own SQL
    )


def _like_query(
    dialect: str, scope: Scope, needles: list[str], window: str
) -> tuple[TextClause, dict[str, Any]]:
    recency = recency_sql(dialect, SAID_AT)
    params: dict[str, Any] = {"kind": scope.kind, "sid": scope.id, "live": LIVE}
    hits = []
    for i, needle in enumerate(needles):
        params[f"n{i}"] = (
            "%" + needle.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        )
        hits.append(
            " OR ".join(
                f"lower(m.{col}) LIKE :n{i} ESCAPE '\\'"
                for col in ("title", "topics", "keywords", "body")
            )
        )
    matched = " + ".join(f"(CASE WHEN {h} THEN 1 ELSE 0 END)" for h in hits)
    sql = f"""
        SELECT id, lexical AS bm25, lexical, recency,
               (1 - :w) * lexical + :w * recency
               + CASE WHEN pinned THEN :bonus ELSE 0 END AS score
        FROM (
            SELECT m.id, m.pinned, ({matched}) * 1.0 / {len(needles)} AS lexical,
                   {recency} AS recency
            FROM memories m
            WHERE m.scope_kind = :kind AND m.scope_id = :sid AND m.status = :live{window}
        ) ranked
        WHERE lexical > 0
        ORDER BY score DESC, id DESC
        LIMIT :limit
    """  # noqa: S608 - only generated placeholders are interpolated; values are bound
    return text(sql), params


def _ranked(conn: Connection, sql: TextClause, params: dict[str, Any]) -> list[Row[Any]]:
    """The notes the ranking query picks, read with their scores in the same round trip:
    each row is a ``memories`` row (Core, no ORM) plus ``bm25``, ``lexical``, ``recency``,
    ``score``."""
    ranked = sql.columns(
        column("id", BigInteger),
        column("bm25", Float),
        column("lexical", Float),
        column("recency", Float),
        column("score", Float),
    ).subquery("ranked")
    return list(
        conn.execute(
            select(MEMORIES, ranked.c.bm25, ranked.c.lexical, ranked.c.recency, ranked.c.score)
            .join(ranked, MEMORIES.c.id == ranked.c.id)
            .order_by(ranked.c.score.desc(), ranked.c.id.desc()),
            params,
        ).all()
    )


def _checked_time(value: object, name: str) -> datetime | None:
    """``value`` as an aware UTC time (a naive one is taken as UTC), or None."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidInput(
            f"{name} must be a date and time, got {quoted(value)}", reason="bad_time_window"
        )
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def time_param(dialect: str, value: datetime | None) -> object:
    """A bound time as the column holds it: SQLite keeps naive UTC text, compared as text."""
    if value is None or dialect == "postgresql":
        return value
    return value.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


def _bm25_rows(
    conn: Connection,
    settings: Settings,
    scope: Scope,
    terms: list[str],
    *,
    limit: int,
    since: datetime | None,
    until: datetime | None,
    bounds: Bounds,
) -> list[Row[Any]]:
    notes, avg_length, dfs = _stats_and_frequencies(conn, scope, terms, bounds.df_cap)
    if notes == 0:
        return []
    present = [(term, df) for term, df in zip(terms, dfs, strict=True) if df > 0]
    if not present:
        return []
    params: dict[str, Any] = {
        "kind": scope.kind,
        "sid": scope.id,
        "live": LIVE,
        "w": settings.recency_weight,
        "half": settings.half_life_days,
        "bonus": settings.pinned_bonus,
        "limit": limit,
        "per_term": bounds.term_candidates,
        "pool": bounds.pool,
        "k1": K1,
        "b": B,
        "avg_length": max(avg_length, 1e-9),
        "since": time_param(conn.dialect.name, since),
        "until": time_param(conn.dialect.name, until),
    }
    for i, (term, df) in enumerate(present):
        params[f"t{i}"] = term
        params[f"idf{i}"] = _idf(notes, df)
    sql = _bm25_query(conn.dialect.name, len(present), _window(since, until))
    return _ranked(conn, sql, params)


def ranked_by_terms(
    conn: Connection, settings: Settings, scope: Scope, terms: Sequence[str], limit: int
) -> list[Note]:
    """The scope's live notes BM25 ranks best for search ``terms`` already tokenized
    (``store.search_terms``), recency and pins as in ``search``: what the harvest shows the
    model of the notes a conversation bears on."""
    wanted = list(dict.fromkeys(terms))[:MAX_QUERY_WORDS]
    if not wanted:
        return []
    rows = _bm25_rows(
        conn, settings, scope, wanted, limit=limit, since=None, until=None, bounds=Bounds()
    )
    return [Note.from_row(cast("Memory", row)) for row in rows]


def search(
    conn: Connection,
    settings: Settings,
    scope: Scope | tuple[str, str],
    query: str,
    limit: int = 10,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    bounds: Bounds = Bounds(),
    vector: Sequence[float] | None = None,
    vector_model: str | None = None,
    fusion: str = FUSION,
) -> list[SearchHit]:
    """Ranked live notes of the scope matching any word of ``query`` (see the module doc),
    said within ``[since, until)`` when given. With the query's ``vector`` (made by
    ``vector_model``) the lexical ranking is fused with the notes' vectors' ranking
    (``fusion``: ``rrf`` or ``mix``; see the module doc). ``bounds`` are for the benchmark.

    Reads through Core on ``conn`` (a session's is ``session.connection()``)."""
    scope = Scope.of(scope)
    query = check_text(query, "query", max_bytes=4_000)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"limit must be 1..{MAX_LIMIT}, got {quoted(limit)}", reason="bad_limit")
    since, until = _checked_time(since, "since"), _checked_time(until, "until")
    if since is not None and until is not None and since >= until:
        raise InvalidInput(
            f"since ({since.isoformat()}) must be before until ({until.isoformat()})",
            reason="bad_time_window",
        )
    needles = content_words(query)
    if not needles:
        return []  # only stop words or punctuation: nothing to look for
    hybrid = vector is not None and vector_model is not None
    lexical = functools.partial(
        _lexical_rows, conn, settings, scope, query, needles, window=(since, until), bounds=bounds
    )
    rows, backend = lexical(limit=max(limit, FUSION_DEPTH) if hybrid else limit, hybrid=hybrid)
    if vector is not None and vector_model is not None:
        nearest = nearest_vectors(
            conn,
            scope,
            vector_model,
            vector,
            limit=FUSION_DEPTH,
            since=time_param(conn.dialect.name, since),
            until=time_param(conn.dialect.name, until),
        )
        if nearest:
            return _fused(
                conn, settings, rows, nearest, limit=limit, needles=needles, fusion=fusion
            )
        if not rows:  # no vector yet either: the lexical search as without vectors
            rows, backend = lexical(limit=limit)
    weight, bonus = settings.recency_weight, settings.pinned_bonus
    return [
        SearchHit(
            # A memories row has every attribute from_row reads, by the same names.
            memory=Note.from_row(cast("Memory", row)),
            score=round(float(row.score), 6),
            lexical=round(float(row.lexical), 6),
            recency=round(float(row.recency), 6),
            bm25=round(float(row.bm25), 6),
            snippet=snippet(row.body, needles),
            backend=backend,
            # The score's three terms, from values already fetched: no work for the database.
            parts=ScoreParts(
                lexical=round((1 - weight) * float(row.lexical), 6),
                recency=round(weight * float(row.recency), 6),
                pinned=bonus if row.pinned else 0.0,
            ),
        )
        for row in rows[:limit]
    ]


def _lexical_rows(
    conn: Connection,
    settings: Settings,
    scope: Scope,
    query: str,
    needles: list[str],
    *,
    limit: int,
    window: tuple[datetime | None, datetime | None],
    bounds: Bounds,
    hybrid: bool = False,
) -> tuple[list[Row[Any]], str]:
    """The lexical ranking's rows and backend: BM25, else (nothing found, or configured so)
    LIKE; ``hybrid``: no LIKE fallback (the vectors find what words miss, and a short word
    inside longer ones, "ill" in "billing", would only add noise)."""
    since, until = window
    if settings.search != "like":
        terms = query_terms(query, MAX_QUERY_WORDS)
        rows = []
        if terms:
            rows = _bm25_rows(
                conn, settings, scope, terms, limit=limit, since=since, until=until, bounds=bounds
            )
        if rows or hybrid:
            return rows, "bm25"
    sql, params = _like_query(conn.dialect.name, scope, needles, _window(since, until))
    params.update(
        w=settings.recency_weight,
        half=settings.half_life_days,
        bonus=settings.pinned_bonus,
        limit=limit,
        since=time_param(conn.dialect.name, since),
        until=time_param(conn.dialect.name, until),
    )
    return _ranked(conn, sql, params), "like"


def _recency(said: datetime, half_life_days: float, now: datetime) -> float:
    """``0.5 ** (age_days / half_life_days)``, as the SQL computes it (a future time is
    now; at most MAX_HALF_LIVES half-lives)."""
    said = said if said.tzinfo is not None else said.replace(tzinfo=UTC)
    days = max((now - said).total_seconds(), 0.0) / 86400.0
    return float(0.5 ** min(days / half_life_days, MAX_HALF_LIVES))


def _fused(
    conn: Connection,
    settings: Settings,
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
