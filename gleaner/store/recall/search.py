"""Ranked any-word search: BM25 over the store's own postings, with recency and pinning.

A query is looked up by its **search terms** (``store.recall.search_terms``: stemmed words less
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
nearest the query's (cosine, ``store.recall.vectors``; the same time window) are merged, and
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
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Connection, Row

from gleaner.store.errors import InvalidInput
from gleaner.store.recall.fusion import FUSION, FUSION_DEPTH, fused_hits
from gleaner.store.recall.search_sql import (
    bm25_query,
    idf,
    like_query,
    ranked_rows,
    stats_and_frequencies,
    time_param,
    window_sql,
)
from gleaner.store.recall.search_terms import STOP_WORDS, query_terms
from gleaner.store.recall.vectors import nearest as nearest_vectors
from gleaner.store.schema.tables import LIVE
from gleaner.store.schemas import Note, Scope, ScoreParts, SearchHit
from gleaner.store.text import check_text, quoted, snippet, words

if TYPE_CHECKING:
    from gleaner.config.store import StoreSettings
    from gleaner.store.schema.models import Memory

MAX_LIMIT = 100
MAX_QUERY_WORDS = 32
K1 = 1.2
B = 0.75
TERM_CANDIDATES = 2_000
DF_CAP = 10_000
RANK_POOL = 200
# Words that carry no meaning on their own (the search tokenizer's list).
SEARCH_STOP_WORDS = STOP_WORDS


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


def _bm25_rows(
    conn: Connection,
    settings: StoreSettings,
    scope: Scope,
    terms: list[str],
    *,
    limit: int,
    since: datetime | None,
    until: datetime | None,
    bounds: Bounds,
) -> list[Row[Any]]:
    notes, avg_length, dfs = stats_and_frequencies(conn, scope, terms, bounds.df_cap)
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
        params[f"idf{i}"] = idf(notes, df)
    sql = bm25_query(conn.dialect.name, len(present), window_sql(since, until))
    return ranked_rows(conn, sql, params)


def ranked_by_terms(
    conn: Connection, settings: StoreSettings, scope: Scope, terms: Sequence[str], limit: int
) -> list[Note]:
    """The scope's live notes BM25 ranks best for search ``terms`` already tokenized
    (``store.recall.search_terms``), recency and pins as in ``search``: what the harvest shows the
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
    settings: StoreSettings,
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
            return fused_hits(
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
    settings: StoreSettings,
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
    sql, params = like_query(conn.dialect.name, scope, needles, window_sql(since, until))
    params.update(
        w=settings.recency_weight,
        half=settings.half_life_days,
        bonus=settings.pinned_bonus,
        limit=limit,
        since=time_param(conn.dialect.name, since),
        until=time_param(conn.dialect.name, until),
    )
    return ranked_rows(conn, sql, params), "like"


# The public names; bench imports FUSION (store.recall.fusion) and time_param
# (store.recall.search_sql)
# from here too.
__all__ = [
    "DF_CAP",
    "FUSION",
    "K1",
    "MAX_LIMIT",
    "MAX_QUERY_WORDS",
    "RANK_POOL",
    "SEARCH_STOP_WORDS",
    "TERM_CANDIDATES",
    "UNBOUNDED",
    "B",
    "Bounds",
    "content_words",
    "ranked_by_terms",
    "search",
    "time_param",
]
