"""Scenario 5: search latency at 100k and 1M notes, against exact BM25 over every match.

500 (--quick: 200) mixed queries of 1-6 words (common and rare words) through
``Store.search`` in the big scope (n/10 notes: 100k of a 1M store) and in the 1,000 small
scopes. Each is timed beside the same ranking with no bounds (every posting of every word
read, every document frequency counted: ``store.recall.search.UNBOUNDED``), the ceiling; the share
of queries whose top 10 is the unbounded top 10, and the mean overlap of the two, say what
the bounds cost in ranking.
"""

from __future__ import annotations

import random
import time

from bench import data
from bench.core import Context, Row, percentile
from gleaner.store import Scope, Store
from gleaner.store.recall.search import UNBOUNDED
from gleaner.store.recall.search import search as raw_search

NAME = "search"


def measure(ctx: Context, backend: str, n: int) -> None:
    url, dataset, load_s = data.store_for(ctx, backend, n)
    label = f"{'pg' if backend == 'postgresql' else 'sqlite'} {n // 1000}k"
    ctx.add(Row(NAME, f"{label}: load {n:,} notes", n / load_s, "notes/s", note="bench set-up"))
    store = Store(url, settings=data.bench_settings())
    qs = data.queries(dataset.words, ctx.size(500, 200), most=6)
    rng = random.Random(5)
    small = [f"u{rng.randrange(data.SMALL_SCOPES):04d}" for _ in qs]
    for where, scopes in (("big scope", [data.BIG_SCOPE] * len(qs)), ("1k scopes", small)):
        size = dataset.scope_sizes[scopes[0]] if where == "big scope" else n * 9 // 10 // 1000
        ours: list[float] = []
        exact: list[float] = []
        same = 0
        overlap = 0.0
        with store.engine.connect() as conn:
            for q, sid in list(zip(qs, scopes, strict=True))[:30]:  # warm the caches
                store.search(Scope.owner(sid), q)
                raw_search(conn, store.settings, Scope.owner(sid), q, bounds=UNBOUNDED)
                conn.rollback()
            for q, sid in zip(qs, scopes, strict=True):
                started = time.perf_counter()
                hits = store.search(Scope.owner(sid), q)
                ours.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                full = raw_search(conn, store.settings, Scope.owner(sid), q, bounds=UNBOUNDED)
                conn.rollback()
                exact.append((time.perf_counter() - started) * 1000)
                ids, exact_ids = [h.memory.id for h in hits], [h.memory.id for h in full]
                same += ids == exact_ids
                # Both empty (no note holds a word): the same answer.
                overlap += len(set(ids) & set(exact_ids)) / len(exact_ids) if exact_ids else 1.0
        for p in (50, 95, 99):
            ctx.add(
                Row(NAME, f"{label} {where} (~{size:,}) unbounded p{p}", percentile(exact, p), "ms")
            )
        for p in (50, 95):
            ctx.add(
                Row(
                    NAME,
                    f"{label} {where} Store.search p{p}",
                    percentile(ours, p),
                    "ms",
                    ceiling=percentile(exact, p),
                )
            )
        p99 = percentile(ours, 99)
        target, met = "", None
        if where == "big scope" and n >= 1_000_000:
            target, met = "p99 <= 25 ms", p99 <= 25
        ctx.add(
            Row(
                NAME,
                f"{label} {where} Store.search p99",
                p99,
                "ms",
                ceiling=percentile(exact, 99),
                target=target,
                met=met,
            )
        )
        ctx.add(
            Row(
                NAME,
                f"{label} {where} top 10 = unbounded",
                same / len(qs) * 100,
                "%",
                note="share of queries whose top 10 equals ranking every match exactly",
            )
        )
        ctx.add(
            Row(
                NAME,
                f"{label} {where} overlap of top 10 with unbounded",
                overlap / len(qs) * 100,
                "%",
                note="mean share of the unbounded top 10 that the bounded search returns",
            )
        )
    store.dispose()


HYBRID_MODEL = "local/all-minilm-l6-v2"


def load_vectors(url: str, dataset: data.Dataset, scope: str, dims: int = 384) -> int:
    """Random unit vectors for every note of ``scope``, under the local model's name: the
    time of scoring does not depend on what the vectors mean."""
    import numpy as np
    from sqlalchemy import create_engine, insert

    from gleaner.store.recall.vectors import MEMORY_VECTORS, utcnow

    rng = np.random.default_rng(11)
    ids = [row.id for row in dataset.notes if row.scope == scope]
    engine = create_engine(url)
    with engine.begin() as conn:
        for start in range(0, len(ids), 5_000):
            chunk = ids[start : start + 5_000]
            matrix = rng.standard_normal((len(chunk), dims)).astype("<f4")
            matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
            conn.execute(
                insert(MEMORY_VECTORS),
                [
                    {
                        "memory_id": note_id,
                        "scope_kind": "owner",
                        "scope_id": scope,
                        "model": HYBRID_MODEL,
                        "dimensions": dims,
                        "content_hash": "0" * 64,
                        "vector": vector.tobytes(),
                        "embedded_at": utcnow(),
                    }
                    for note_id, vector in zip(chunk, matrix, strict=True)
                ],
            )
    engine.dispose()
    return len(ids)


def measure_hybrid(ctx: Context, backend: str, n: int) -> None:
    """Hybrid search in the big scope through ``Gleaner.search`` with the local embedder:
    the query's vector (a real forward pass) plus BM25 and the scope's vectors, fused."""
    from gleaner import Gleaner
    from gleaner.store.errors import ConfigError

    url, dataset, _ = data.store_for(ctx, backend, n)
    settings = data.bench_settings(embed_model=HYBRID_MODEL)
    try:
        from gleaner.harvest.embedding import embedder_for

        embedder_for(settings)
    except ConfigError:
        print("  search: no local embedder (the local-embed extra): hybrid skipped")
        return
    size = load_vectors(url, dataset, data.BIG_SCOPE)
    label = f"{'pg' if backend == 'postgresql' else 'sqlite'} {n // 1000}k"
    gleaner = Gleaner(url, settings=settings)
    qs = data.queries(dataset.words, ctx.size(300, 100), seed=9, most=6)
    for q in qs[:20]:
        gleaner.search(data.BIG_SCOPE, q)
    timings = []
    for q in qs:
        started = time.perf_counter()
        hits = gleaner.search(data.BIG_SCOPE, q)
        timings.append((time.perf_counter() - started) * 1000)
        assert hits
        assert hits[0].backend == "hybrid"
    for p in (50, 95):
        ctx.add(
            Row(NAME, f"{label} big scope (~{size:,}) hybrid p{p}", percentile(timings, p), "ms")
        )
    p99 = percentile(timings, 99)
    target, met = ("p99 <= 50 ms", p99 <= 50) if size <= 20_000 else ("", None)
    ctx.add(
        Row(
            NAME,
            f"{label} big scope (~{size:,}) hybrid p99",
            p99,
            "ms",
            target=target,
            met=met,
            note="query embedded by the local CPU embedder (in the time); random note vectors",
        )
    )
    gleaner.close()


def run(ctx: Context) -> None:
    sizes = [10_000] if ctx.quick else [100_000, 1_000_000]
    for n in sizes:
        measure(ctx, "postgresql", n)
        measure_hybrid(ctx, "postgresql", n)
    for n in sizes:
        measure(ctx, "sqlite", n)
        measure_hybrid(ctx, "sqlite", n)
