"""Note vectors for semantic recall (``memory_vectors``): written after the note, read by search.

A vector is stored as little-endian float32 bytes with the embedding model that made it and
the note's ``content_hash`` when it was made: a note whose text changed since, or that has
no vector of the configured model, is ``pending`` (a changed model re-embeds every note; the
old model's vectors are ignored until replaced). Vectors go with their note (ON DELETE
CASCADE: forget); search reads only live notes' vectors, so archiving, superseding, decay
and dedupe need nothing here.

Scoring is cosine similarity (vectors are L2-normalised when stored) over the owner's scope,
computed with numpy in this process on both databases: PostgreSQL here has no pgvector (see
README, "Semantic recall", for how it would slot in), and sqlite-vec needs a Python whose
``sqlite3`` loads extensions, which not every build does.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, bindparam, delete, func, insert, select, text

from gleaner.store.schema.sql import ID_CHUNK, one_of
from gleaner.store.schema.tables import EMBEDDING_USAGE, LIVE, MEMORIES, MEMORY_VECTORS, utcnow
from gleaner.store.schemas import Scope

if TYPE_CHECKING:
    from gleaner.store.schema.sql import Executor


@dataclass(frozen=True)
class PendingNote:
    """A live note that needs a vector of the configured model: what is embedded."""

    id: int
    scope: Scope
    content_hash: str
    text: str


def embedding_text(title: str, body: str) -> str:
    """The text a note's vector is made from."""
    return f"{title}\n{body}"


def pending(
    conn: Executor,
    model: str,
    *,
    scope: Scope | None = None,
    after: int = 0,
    limit: int = 64,
) -> list[PendingNote]:
    """Live notes (of ``scope``, else every scope) with no vector of ``model`` for their
    current text, by id after ``after``, at most ``limit``."""
    vectors = MEMORY_VECTORS
    m = MEMORIES.c
    query = (
        select(m.id, m.scope_kind, m.scope_id, m.content_hash, m.title, m.body)
        .outerjoin(
            vectors,
            (vectors.c.memory_id == m.id)
            & (vectors.c.model == model)
            & (vectors.c.content_hash == m.content_hash),
        )
        .where(vectors.c.memory_id.is_(None), m.status == LIVE, m.id > after)
        .order_by(m.id)
        .limit(limit)
    )
    if scope is not None:
        query = query.where(m.scope_kind == scope.kind, m.scope_id == scope.id)
    return [
        PendingNote(
            int(row.id),
            Scope.stored(row.scope_kind, row.scope_id),
            str(row.content_hash),
            embedding_text(row.title, row.body),
        )
        for row in conn.execute(query)
    ]


def count_pending(conn: Executor, model: str, *, scope: Scope | None = None) -> int:
    """How many live notes (of ``scope``) ``pending`` would return in all."""
    vectors = MEMORY_VECTORS
    m = MEMORIES.c
    query = (
        select(func.count())
        .select_from(MEMORIES)
        .outerjoin(
            vectors,
            (vectors.c.memory_id == m.id)
            & (vectors.c.model == model)
            & (vectors.c.content_hash == m.content_hash),
        )
        .where(vectors.c.memory_id.is_(None), m.status == LIVE)
    )
    if scope is not None:
        query = query.where(m.scope_kind == scope.kind, m.scope_id == scope.id)
    return int(conn.execute(query).scalar_one())


def encode(vector: Sequence[float]) -> bytes:
    """A vector as stored: float32, little-endian."""
    import numpy as np  # only where vectors are used: `gleaner search` starts without it

    return np.asarray(vector, dtype="<f4").tobytes()


def save(
    conn: Executor, model: str, notes: Sequence[PendingNote], vectors: Sequence[Sequence[float]]
) -> int:
    """Store the vectors of ``notes`` (one each, in order), replacing any older one. A note
    deleted or rewritten since it was read keeps no vector from this (its text moved on:
    it is pending again). Returns how many were stored."""
    if len(notes) != len(vectors):
        raise ValueError(f"{len(notes)} notes but {len(vectors)} vectors")
    table = MEMORY_VECTORS
    ids = [n.id for n in notes]
    current: dict[int, str] = {}
    for start in range(0, len(ids), ID_CHUNK):
        rows = conn.execute(
            select(MEMORIES.c.id, MEMORIES.c.content_hash).where(one_of(MEMORIES.c.id, "ids")),
            {"ids": ids[start : start + ID_CHUNK]},
        )
        current.update((int(i), str(h)) for i, h in rows)
    kept = [
        (note, vector)
        for note, vector in zip(notes, vectors, strict=True)
        if current.get(note.id) == note.content_hash
    ]
    if not kept:
        return 0
    conn.execute(
        delete(table).where(one_of(table.c.memory_id, "ids")),
        {"ids": [note.id for note, _ in kept]},
    )
    now = utcnow()
    conn.execute(
        insert(table),
        [
            {
                "memory_id": note.id,
                "scope_kind": note.scope.kind,
                "scope_id": note.scope.id,
                "model": model,
                "dimensions": len(vector),
                "content_hash": note.content_hash,
                "vector": encode(vector),
                "embedded_at": now,
            }
            for note, vector in kept
        ],
    )
    return len(kept)


@dataclass
class _Matrix:
    """A scope's vectors of one model, loaded once: note ids and their rows."""

    ids: Any  # numpy int64 array
    rows: Any  # numpy float32 matrix, one L2-normalised row per note
    fingerprint: object
    at: float


# Scopes' vectors kept by process, so a search scores them without reading them again: at
# most CACHE_BYTES in all (the least recently used go first), each valid while the scope's
# newest ``embedded_at`` is unchanged (any vector stored since, a new note's or a re-embedded
# one's, changes it; a deleted note's vector is no harm: candidates are checked live) and
# for at most CACHE_SECONDS.
_CACHE: OrderedDict[tuple[str, str, str, str, int], _Matrix] = OrderedDict()
_CACHE_LOCK = threading.Lock()
CACHE_BYTES = 256 * 1024 * 1024
CACHE_SECONDS = 600.0
# Candidates checked for being live (and in the time window) per round trip.
_CHECK_CHUNK = 200


def _fingerprint(conn: Connection, scope: Scope, model: str) -> object:
    """When the scope's newest vector of ``model`` was stored (None: it has none): one probe
    of ``ix_memory_vectors_embedded``."""
    return conn.execute(
        text(
            "SELECT max(embedded_at) FROM memory_vectors"
            " WHERE scope_kind = :kind AND scope_id = :sid AND model = :model"
        ),
        {"kind": scope.kind, "sid": scope.id, "model": model},
    ).scalar_one()


def _matrix(conn: Connection, scope: Scope, model: str, dims: int) -> _Matrix | None:
    """The scope's vectors of ``model`` (cached; see ``_CACHE``), or None when it has none."""
    import numpy as np

    fingerprint = _fingerprint(conn, scope, model)
    if fingerprint is None:
        return None
    key = (conn.engine.url.render_as_string(hide_password=True), scope.kind, scope.id, model, dims)
    now = time.monotonic()
    with _CACHE_LOCK:
        cached = _CACHE.get(key)
        fresh = cached is not None and now - cached.at < CACHE_SECONDS
        if fresh and cached is not None and cached.fingerprint == fingerprint:
            _CACHE.move_to_end(key)
            return cached
    rows = conn.execute(
        text(
            "SELECT memory_id, vector FROM memory_vectors"
            " WHERE scope_kind = :kind AND scope_id = :sid AND model = :model"
            " AND dimensions = :dims ORDER BY memory_id"
        ),
        {"kind": scope.kind, "sid": scope.id, "model": model, "dims": dims},
    ).all()
    if not rows:
        return None
    ids = np.fromiter((int(r[0]) for r in rows), dtype=np.int64, count=len(rows))
    matrix = np.frombuffer(b"".join(bytes(r[1]) for r in rows), dtype="<f4").reshape(
        len(rows), dims
    )
    loaded = _Matrix(ids, matrix, fingerprint, now)
    with _CACHE_LOCK:
        _CACHE[key] = loaded
        _CACHE.move_to_end(key)
        while sum(m.rows.nbytes for m in _CACHE.values()) > CACHE_BYTES and len(_CACHE) > 1:
            _CACHE.popitem(last=False)
    return loaded


def nearest(
    conn: Connection,
    scope: Scope,
    model: str,
    query: Sequence[float],
    *,
    limit: int,
    since: object = None,
    until: object = None,
) -> list[tuple[int, float]]:
    """The scope's live notes whose vectors of ``model`` are most similar to ``query``:
    ``(note id, cosine similarity)``, best first, at most ``limit``. ``since``/``until`` are
    bound as the search module binds them (the column's own form).

    The scope's vectors are scored in this process (numpy), read once and kept
    (``_CACHE``); the best are then checked live (and in the window) in the database, a
    chunk at a time, until ``limit`` are found."""
    import numpy as np

    probe = np.asarray(query, dtype=np.float32)
    norm = float(np.linalg.norm(probe))
    if norm == 0.0:
        return []
    loaded = _matrix(conn, scope, model, len(query))
    if loaded is None:
        return []
    scores = loaded.rows @ (probe / norm)
    # The best few first (a partial sort: most searches need no more), the rest if they do.
    head = min(len(scores), max(4 * limit, _CHECK_CHUNK))
    best = np.argpartition(-scores, head - 1)[:head] if head < len(scores) else np.arange(head)
    best = best[np.argsort(-scores[best], kind="stable")]

    def chunks() -> Iterator[Any]:
        yield from (best[i : i + _CHECK_CHUNK] for i in range(0, len(best), _CHECK_CHUNK))
        if head < len(scores):  # the few were not enough (archived notes, a narrow window)
            rest = np.setdiff1d(np.arange(len(scores)), best, assume_unique=True)
            rest = rest[np.argsort(-scores[rest], kind="stable")]
            yield from (rest[i : i + _CHECK_CHUNK] for i in range(0, len(rest), _CHECK_CHUNK))

    window = ""
    if since is not None:
        window += " AND coalesce(occurred_at, updated_at) >= :since"
    if until is not None:
        window += " AND coalesce(occurred_at, updated_at) < :until"
    alive = text(
        "SELECT id FROM memories WHERE scope_kind = :kind AND scope_id = :sid"  # noqa: S608
        f" AND status = :live AND id IN :ids{window}"
    ).bindparams(bindparam("ids", expanding=True))
    found: list[tuple[int, float]] = []
    for chunk in chunks():
        wanted = [int(loaded.ids[i]) for i in chunk]
        live = set(
            conn.execute(
                alive,
                {
                    "kind": scope.kind,
                    "sid": scope.id,
                    "live": LIVE,
                    "ids": wanted,
                    "since": since,
                    "until": until,
                },
            ).scalars()
        )
        found.extend(
            (int(loaded.ids[i]), float(scores[i])) for i in chunk if int(loaded.ids[i]) in live
        )
        if len(found) >= limit:
            break
    return found[:limit]


def record_usage(
    conn: Executor, model: str, *, calls: int, notes: int, tokens: int, cost_usd: float | None
) -> None:
    """Add one embedding run's cost to today's row of ``model`` (UTC day)."""
    from gleaner.store.schema.sql import dialect_insert

    day = utcnow().strftime("%Y-%m-%d")
    table = EMBEDDING_USAGE
    statement = dialect_insert(conn, table).values(
        model=model, day=day, calls=calls, notes=notes, tokens=tokens, cost_usd=cost_usd
    )
    cost = table.c.cost_usd + statement.excluded.cost_usd
    conn.execute(
        statement.on_conflict_do_update(
            index_elements=["model", "day"],
            set_={
                "calls": table.c.calls + calls,
                "notes": table.c.notes + notes,
                "tokens": table.c.tokens + tokens,
                # Unpriced (None) stays unpriced: a sum with an unknown part is unknown.
                "cost_usd": cost,
            },
        )
    )


def usage(conn: Executor) -> list[dict[str, Any]]:
    """Embedding cost per model and day, newest day first."""
    table = EMBEDDING_USAGE
    rows = conn.execute(select(table).order_by(table.c.day.desc(), table.c.model)).mappings()
    return [dict(row) for row in rows]
