"""Search: full text, the LIKE fallback, and the documented ranking formula, on both backends."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from store import InvalidInput, Scope, StorageFailure, Store

ALICE = Scope.owner("alice")


def put(store: Store, title: str, body: str, **extra: object) -> str:
    return store.write(ALICE, {"title": title, "body": body, **extra}).memory.slug


def age(store: Store, slug: str, days: float) -> None:
    """Test set-up: pretend the note was last updated ``days`` ago."""
    when = datetime.now(UTC) - timedelta(days=days)
    if store.dialect == "sqlite":
        when = when.replace(tzinfo=None)
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE memories SET updated_at = :t WHERE slug = :s"), {"t": when, "s": slug}
        )


def test_full_text_finds_words_in_title_topics_and_body(store: Store) -> None:
    put(store, "Deploy notes", "We deploy with Kubernetes every Friday")
    put(store, "Editor", "Prefers vim keybindings", topics=["tooling"])
    put(store, "Unrelated", "Nothing to see")
    assert [h.memory.slug for h in store.search(ALICE, "kubernetes")] == ["deploy-notes"]
    assert [h.memory.slug for h in store.search(ALICE, "tooling")] == ["editor"]
    hits = store.search(ALICE, "deploying")  # stemmed on both engines
    assert [h.memory.slug for h in hits] == ["deploy-notes"]
    assert hits[0].backend in {"postgres-fts", "sqlite-fts5"}
    assert "Kubernetes" in hits[0].snippet


def test_search_is_scoped_and_skips_superseded(store: Store) -> None:
    old = put(store, "Old deploy", "deploy by hand")
    new = put(store, "New deploy", "deploy by pipeline")
    store.write(Scope.owner("bob"), {"title": "Bob deploy", "body": "deploy"})
    store.link(ALICE, new, old, "supersedes")
    assert [h.memory.slug for h in store.search(ALICE, "deploy")] == [new]


NASTY = [
    '"unclosed',
    "AND OR NOT",
    "NEAR(",
    "a:b",
    "*",
    "(((",
    ")))",
    "-",
    "title:x",
    "^start",
    'foo"bar',
    "'; DROP TABLE memories; --",
    "%",
    "_",
    "\\",
    "<->",
    "!",
    "&|",
    "NEAR(a b, 3)",
    "{col}: x",
    "\u00e9t\u00e9",
    "emoji 🎉",
]


@pytest.mark.parametrize("query", NASTY)
def test_no_query_raises(store: Store, query: str) -> None:
    put(store, "Percent 100% sure", 'under_score and back\\slash and quote" and (parens)')
    hits = store.search(ALICE, query)
    assert isinstance(hits, list)
    assert store.fingerprint(ALICE)[0] == 1


def test_like_fallback_for_queries_full_text_cannot_use(store: Store) -> None:
    put(store, "Percent", "it is 100% done")
    put(store, "Stop words", "the and of")
    put(store, "Timing", "just now")
    # No content word (punctuation, stop words only): nothing to look for, so no hit at all.
    for query in ("%", "the", "-", "the and of"):
        assert store.search(ALICE, query) == []
    # A word PostgreSQL's English configuration drops but search keeps: LIKE finds the note
    # (FTS5 has no stop words, so SQLite matches it in full text).
    hits = store.search(ALICE, "just")
    expected = "like" if store.dialect == "postgresql" else "sqlite-fts5"
    assert [(h.memory.slug, h.backend) for h in hits] == [("timing", expected)]


def test_like_backend_setting(make_store, backend: str) -> None:
    store = make_store(backend, search="like")
    put(store, "Mixed Case Title", "Body")
    hits = store.search(ALICE, "case")
    assert [(h.memory.slug, h.backend) for h in hits] == [("mixed-case-title", "like")]


def test_empty_query_and_bad_limit(store: Store) -> None:
    put(store, "Anything", "at all")
    assert store.search(ALICE, "   ") == []
    for limit in (0, 101, True):
        with pytest.raises(InvalidInput) as caught:
            store.search(ALICE, "anything", limit=limit)
        assert caught.value.reason == "bad_limit"


def test_ranking_formula(make_store, backend: str) -> None:
    """score = (1-w)*lexical + w*0.5**(age/half_life) + bonus*pinned, as documented."""
    store = make_store(backend, recency_weight=0.5, half_life_days=10, pinned_bonus=0.3)
    put(store, "Fresh", "postgres tuning notes")
    put(store, "Stale", "postgres tuning notes")
    put(store, "Pinned stale", "postgres tuning notes", pinned=True)
    age(store, "stale", 10)
    age(store, "pinned-stale", 10)
    hits = {h.memory.slug: h for h in store.search(ALICE, "postgres tuning")}
    assert list(hits) == ["pinned-stale", "fresh", "stale"]
    assert hits["fresh"].recency == pytest.approx(1.0, abs=1e-3)
    assert hits["stale"].recency == pytest.approx(0.5, abs=1e-3)
    for hit in hits.values():
        expected = 0.5 * hit.lexical + 0.5 * hit.recency + (0.3 if hit.memory.pinned else 0)
        assert hit.score == pytest.approx(expected, abs=1e-5)
    assert hits["fresh"].lexical == pytest.approx(hits["stale"].lexical, abs=1e-6)


def test_lexical_relevance_wins_without_recency(make_store, backend: str) -> None:
    store = make_store(backend, recency_weight=0.0, pinned_bonus=0.0)
    for i in range(6):  # a corpus, so term rarity means something to bm25
        put(store, f"Filler {i}", "gardening and cooking")
    put(store, "Weak", "one mention of redis among many other words about caching layers")
    put(store, "Redis redis", "redis cluster redis sentinel redis streams")
    age(store, "redis-redis", 365)
    hits = store.search(ALICE, "redis")
    assert [h.memory.slug for h in hits] == ["redis-redis", "weak"]
    assert all(math.isclose(h.score, h.lexical, abs_tol=1e-6) for h in hits)


def test_recency_breaks_ties_and_snippet_is_bounded(store: Store) -> None:
    put(store, "Older", "x " * 400 + "needle here " + "y " * 400)
    put(store, "Newer", "x " * 400 + "needle here " + "y " * 400)
    age(store, "older", 60)
    hits = store.search(ALICE, "needle")
    assert [h.memory.slug for h in hits] == ["newer", "older"]
    assert "needle" in hits[0].snippet and len(hits[0].snippet) <= 162


@pytest.mark.parametrize("search", ["fts", "like"])
def test_very_old_notes_rank_without_underflow(make_store, backend: str, search: str) -> None:
    store = make_store(backend, search=search)
    put(store, "Ancient", "fossil record")
    age(store, "ancient", 200_000)  # far past any half-life: 0.5 ** 6667 underflows
    hits = store.search(ALICE, "fossil")
    assert [(h.memory.slug, h.backend == "like") for h in hits] == [("ancient", search == "like")]
    assert hits[0].recency == pytest.approx(0.0, abs=1e-9)


def test_a_dropped_search_index_is_reported_not_searched_around(make_store) -> None:
    """A missing full-text table means the schema is broken: say so (not_migrated), never
    quietly answer through LIKE as if nothing were wrong."""
    store = make_store("sqlite")
    store.write(ALICE, {"title": "Rust borrow checker", "body": "lifetimes"})
    with store.transaction() as session:
        session.execute(text("DROP TABLE memories_fts"))
    with pytest.raises(StorageFailure) as raised:
        store.search(ALICE, "borrow")
    assert raised.value.reason == "not_migrated"
