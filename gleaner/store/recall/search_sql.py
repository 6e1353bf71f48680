"""The statements search runs: the BM25 ranking over the postings, the LIKE ranking, the scope
statistics (cached for a large scope) and the rows they pick; ``store.recall.search`` has the
formulas and the bounds."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Connection, Float, Row, TextClause, column, select, text

from gleaner.store.schema.sql import recency_sql
from gleaner.store.schema.tables import LIVE, MEMORIES
from gleaner.store.schemas import Scope

if TYPE_CHECKING:
    pass


CACHED_SCOPE_NOTES = 10_000
STATS_SECONDS = 60.0


# When the fact was said: the conversation's time, else when the text was last written.
SAID_AT = "coalesce(m.occurred_at, m.updated_at)"


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


def stats_and_frequencies(
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


def idf(notes: int, df: int) -> float:
    df = min(df, notes)
    return math.log(1 + (notes - df + 0.5) / (df + 0.5))


def window_sql(since: datetime | None, until: datetime | None) -> str:
    where = ""
    if since is not None:
        where += f" AND {SAID_AT} >= :since"
    if until is not None:
        where += f" AND {SAID_AT} < :until"
    return where


def bm25_query(dialect: str, terms: int, window: str) -> TextClause:
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


def like_query(
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


def ranked_rows(conn: Connection, sql: TextClause, params: dict[str, Any]) -> list[Row[Any]]:
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


def time_param(dialect: str, value: datetime | None) -> object:
    """A bound time as the column holds it: SQLite keeps naive UTC text, compared as text."""
    if value is None or dialect == "postgresql":
        return value
    return value.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
