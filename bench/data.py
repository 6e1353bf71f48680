"""Synthetic notes for the store scenarios, loaded fast, and built once per run.

Words are pronounceable non-words with Zipf frequencies (the top word is in most bodies, the
tail in a handful of notes). A store of ``n`` notes has one big scope (``owner:big``, n/10
notes) and 1,000 small ones; scopes are interleaved in id order, as real writes would be.
About 1% of notes are planted near-duplicates of an earlier note of their scope (same title
and topics plus one extra word: Jaccard >= 0.8; same body: the same fact restated), and 0.5%
exact copies.

PostgreSQL is loaded with COPY, the search index's key built after the load; SQLite with
executemany. The search index (``search_postings`` and ``memories.search_length``) is
loaded with the notes, computed by ``store.recall.search_index.postings_of`` as a write computes
it. The term index (``memory_terms``) is not loaded: search, decay and dedupe do not read
it.
"""

from __future__ import annotations

import atexit
import random
import sqlite3
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from bench.core import PG_ADMIN_URL, Context
from gleaner.store import Settings, Store
from gleaner.store.recall.search_index import Postings, postings_of

SMALL_SCOPES = 1_000
BIG_SCOPE = "big"
CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"
VOCAB_SIZE = 20_000
TITLE_WORDS = (3, 5)
BODY_WORDS = (10, 20)
TOPICS = [f"{c}{v}{c2}{v2}x" for c in "bklmst" for v in VOWELS for c2 in "nr" for v2 in "ao"]


def bench_settings(**overrides: object) -> Settings:
    """Default settings, never the caller's GLEANER_* environment."""
    return Settings(_env_prefix="GLEANER_BENCH_UNUSED_", **overrides)  # type: ignore[call-arg]


def vocabulary(size: int = VOCAB_SIZE) -> list[str]:
    """``size`` distinct pronounceable words of 3 syllables, in a fixed order (rank 0 = top)."""
    syllables = [c + v for c in CONSONANTS for v in VOWELS]
    rng = random.Random(7)
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < size:
        word = "".join(rng.choice(syllables) for _ in range(3))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def zipf_pool(words: list[str], size: int = 2_000_000) -> list[str]:
    """A list where each word appears in proportion to 1/rank: uniform picks are Zipf picks."""
    weights = [1 / (rank + 1) for rank in range(len(words))]
    total = sum(weights)
    pool: list[str] = []
    for word, weight in zip(words, weights, strict=True):
        pool.extend([word] * max(1, round(weight / total * size)))
    return pool


@dataclass
class NoteRow:
    id: int
    scope: str
    slug: str
    title: str
    topics: str
    body: str
    at: datetime


@dataclass
class Dataset:
    n: int
    notes: list[NoteRow]
    words: list[str]
    scope_sizes: dict[str, int] = field(default_factory=dict)


def generate(n: int, seed: int = 1) -> Dataset:
    """``n`` notes (see the module doc), ids 1..n in time order over the last 365 days."""
    rng = random.Random(seed)
    words = vocabulary()
    pool = zipf_pool(words)
    pick = rng.choices
    big = n // 10
    scopes = [BIG_SCOPE] * big + [f"u{i % SMALL_SCOPES:04d}" for i in range(n - big)]
    rng.shuffle(scopes)
    step = timedelta(days=365) / max(n, 1)
    start = datetime.now(UTC) - timedelta(days=365)
    notes: list[NoteRow] = []
    last_in_scope: dict[str, NoteRow] = {}
    counts: dict[str, int] = {}
    for i, scope in enumerate(scopes):
        roll = rng.random()
        twin = last_in_scope.get(scope)
        if twin is not None and roll < 0.015:
            title_words = twin.title.split()
            if roll < 0.01:  # near-duplicate: one extra word
                title_words = [*title_words, pick(pool)[0]]
            title = " ".join(title_words)
            topics = twin.topics
        else:
            title = " ".join(pick(pool, k=rng.randint(*TITLE_WORDS))).capitalize()
            topics = " ".join(sorted(set(pick(TOPICS, k=rng.randint(1, 3)))))
        body = " ".join(pick(pool, k=rng.randint(*BODY_WORDS)))
        if twin is not None and roll < 0.015:
            body = twin.body  # drawn all the same: the other notes stay as they were
        counts[scope] = counts.get(scope, 0) + 1
        row = NoteRow(i + 1, scope, f"n{i + 1}", title, topics, body, start + step * i)
        notes.append(row)
        last_in_scope[scope] = row
    return Dataset(n=n, notes=notes, words=words, scope_sizes=counts)


def queries(words: list[str], count: int = 500, seed: int = 3, most: int = 3) -> list[str]:
    """``count`` queries of 1 to ``most`` words, each word common (top 50) or rare (rank
    2k-20k)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        chosen = [
            rng.choice(words[:50]) if rng.random() < 0.5 else rng.choice(words[2_000:])
            for _ in range(rng.randint(1, most))
        ]
        out.append(" ".join(chosen))
    return out


_COLUMNS = (
    "id, scope_kind, scope_id, slug, title, body, topics, provenance, pinned, status, "
    "content_hash, created_at, updated_at, updated_seq, weight, term_count, search_length"
)
_POSTING_COLUMNS = "scope_kind, scope_id, term, memory_id, weight, length"


def _postings(row: NoteRow) -> Postings:
    return postings_of({"title": row.title, "body": row.body, "topics": row.topics})


def _posting_rows(row: NoteRow, postings: Postings) -> list[tuple[object, ...]]:
    return [
        ("owner", row.scope, term, row.id, weight, postings.length)
        for term, weight in postings.weights.items()
    ]


def _values(row: NoteRow, postings: Postings) -> tuple[object, ...]:
    return (
        row.id,
        "owner",
        row.scope,
        row.slug,
        row.title,
        row.body,
        row.topics,
        "agent",
        False,
        "live",
        "0" * 64,
        row.at,
        row.at,
        row.id,
        1.0,
        0,
        postings.length,
    )


def load_pg(url: str, data: Dataset) -> None:
    """COPY the notes and their postings in; the postings' key and index are dropped for
    the load and built once after it."""
    engine = create_engine(url)
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conname = 'pk_search_postings'"
        )
        key = cur.fetchone()[0]  # type: ignore[index]
        cur.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_search_postings_memory'")
        memory_index = cur.fetchone()[0]  # type: ignore[index]
        cur.execute("ALTER TABLE search_postings DROP CONSTRAINT pk_search_postings")
        cur.execute("DROP INDEX ix_search_postings_memory")
        postings = [_postings(row) for row in data.notes]
        with cur.copy(f"COPY memories ({_COLUMNS}) FROM STDIN") as copy:  # type: ignore[attr-defined]
            for row, found in zip(data.notes, postings, strict=True):
                copy.write_row(_values(row, found))
        with cur.copy(f"COPY search_postings ({_POSTING_COLUMNS}) FROM STDIN") as copy:  # type: ignore[attr-defined]
            for row, found in zip(data.notes, postings, strict=True):
                for posting in _posting_rows(row, found):
                    copy.write_row(posting)
        cur.execute("SET maintenance_work_mem = '512MB'")
        cur.execute(f"ALTER TABLE search_postings ADD CONSTRAINT pk_search_postings {key}")
        cur.execute(memory_index)
        cur.execute("SELECT setval('memories_updated_seq_seq', %s)", (data.n + 1,))
        cur.execute("SELECT setval('memories_id_seq', %s)", (data.n + 1,))
        raw.commit()
    finally:
        raw.close()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE memories"))
        conn.execute(text("VACUUM ANALYZE search_postings"))
    engine.dispose()


def load_sqlite(path: Path, data: Dataset) -> None:
    """executemany of the notes and their postings, in one transaction."""
    conn = sqlite3.connect(path)
    stamp = "%Y-%m-%d %H:%M:%S.%f"
    postings = [_postings(row) for row in data.notes]
    with conn:
        conn.executemany(
            f"INSERT INTO memories ({_COLUMNS}) VALUES ({', '.join('?' * 17)})",
            (
                tuple(
                    v.astimezone(UTC).strftime(stamp) if isinstance(v, datetime) else v
                    for v in _values(row, found)
                )
                for row, found in zip(data.notes, postings, strict=True)
            ),
        )
        conn.executemany(
            f"INSERT INTO search_postings ({_POSTING_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
            (
                posting
                for row, found in zip(data.notes, postings, strict=True)
                for posting in _posting_rows(row, found)
            ),
        )
    conn.execute("ANALYZE")
    conn.close()


# One build per (backend, size) per run: scenarios 5, 6 and 7 share them.
_BUILT: dict[tuple[str, int], tuple[str, Dataset, float]] = {}
_DROP: list[str] = []
_DATASETS: dict[int, Dataset] = {}


def dataset(n: int) -> Dataset:
    if n not in _DATASETS:
        _DATASETS[n] = generate(n)
    return _DATASETS[n]


def store_for(ctx: Context, backend: str, n: int) -> tuple[str, Dataset, float]:
    """``(url, data, load seconds)`` of a migrated store holding ``n`` synthetic notes."""
    import time

    key = (backend, n)
    if key not in _BUILT:
        data = dataset(n)
        started = time.perf_counter()
        if backend == "postgresql":
            name = f"gleaner_bench_store_{n}"
            url = ctx.fresh_pg(name)
            _DROP.append(name)
            migrate(url)
            load_pg(url, data)
        else:
            path = ctx.workdir / f"store_{n}.db"
            url = f"sqlite:///{path}"
            migrate(url)
            load_sqlite(path, data)
        _BUILT[key] = (url, data, time.perf_counter() - started)
    return _BUILT[key]


def forget(backend: str, n: int) -> None:
    """Drop a built store once no scenario needs it (memory and disk)."""
    built = _BUILT.pop((backend, n), None)
    if built and backend == "postgresql":
        drop_pg(make_url(built[0]).database or "")


def migrate(url: str) -> None:
    store = Store(url, settings=bench_settings())
    store.migrate()
    store.dispose()


def drop_pg(name: str) -> None:
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()
    if name in _DROP:
        _DROP.remove(name)


@atexit.register
def _drop_all() -> None:
    for name in list(_DROP):
        try:
            drop_pg(name)
        except Exception as exc:
            print(f"could not drop bench database {name}: {exc}")
