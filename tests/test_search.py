"""Search: any-word BM25 over the store's own index, the LIKE backend and fallback, time
windows, and the documented ranking formula, on both databases."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from gleaner.store import InvalidInput, Scope, StorageFailure, Store
from gleaner.store.recall.search_terms import note_terms, query_terms

ALICE = Scope.owner("alice")


def put(store: Store, title: str, body: str, **extra: object) -> str:
    return store.write(ALICE, {"title": title, "body": body, **extra}).memory.slug


def set_time(store: Store, slug: str, column: str, days_ago: float) -> None:
    """Test set-up: pretend the note's ``column`` time was ``days_ago`` days ago."""
    when = datetime.now(UTC) - timedelta(days=days_ago)
    if store.dialect == "sqlite":
        when = when.replace(tzinfo=None)
    with store.engine.begin() as conn:
        conn.execute(
            text(f"UPDATE memories SET {column} = :t WHERE slug = :s"),
            {"t": when, "s": slug},
        )


def age(store: Store, slug: str, days: float) -> None:
    """Test set-up: pretend the note was last updated ``days`` ago."""
    set_time(store, slug, "updated_at", days)


def slugs(hits: list) -> list[str]:  # type: ignore[type-arg]
    return [h.memory.slug for h in hits]


def test_finds_words_in_title_topics_and_body(store: Store) -> None:
    put(store, "Deploy notes", "We deploy with Kubernetes every Friday")
    put(store, "Editor", "Prefers vim keybindings", topics=["tooling"])
    put(store, "Unrelated", "Nothing to see")
    assert slugs(store.search(ALICE, "kubernetes")) == ["deploy-notes"]
    assert slugs(store.search(ALICE, "tooling")) == ["editor"]
    hits = store.search(ALICE, "deploying")  # stemmed: deploying meets deploy
    assert slugs(hits) == ["deploy-notes"]
    assert hits[0].backend == "bm25"
    assert "Kubernetes" in hits[0].snippet


def test_a_question_sharing_one_word_finds_its_note(store: Store) -> None:
    """Any word counts: the note lacks "pets" and "names" but holds "Melanie"."""
    put(store, "Melanie's animals", "Melanie has a dog named Luna and a cat named Oliver.")
    put(store, "Work", "Works at Globex as a data engineer.")
    hits = store.search(ALICE, "What are Melanie's pets' names?")
    assert slugs(hits) == ["melanie-s-animals"]
    assert store.search(ALICE, "Has she ever painted anything?") == []
    put(store, "Hobby", "Painted a sunset over the lake last summer.")
    assert slugs(store.search(ALICE, "Has she ever painted anything?")) == ["hobby"]
    assert slugs(store.search(ALICE, "paint")) == ["hobby"]


def test_rare_words_outweigh_common_ones_within_the_scope(store: Store) -> None:
    for i in range(8):
        put(store, f"Python note {i}", f"python detail number {i}")
    put(store, "Loop quirk", "an asyncio event loop quirk")
    put(store, "Both", "python and asyncio together")
    hits = store.search(ALICE, "python asyncio")
    assert slugs(hits)[:2] == ["both", "loop-quirk"]
    assert len(hits) == 10  # every note with either word: none needs both


def test_idf_counts_the_owners_scope_only(make_store, backend: str) -> None:
    """Another owner's notes change neither which notes match nor how rare a word is."""
    store = make_store(backend, recency_weight=0.0)
    put(store, "Redis", "redis cache")
    put(store, "Kafka", "kafka queue")
    before = {h.memory.slug: h.bm25 for h in store.search(ALICE, "redis kafka")}
    bob = Scope.owner("bob")
    for i in range(20):
        store.write(bob, {"title": f"Redis {i}", "body": "redis redis"})
    after = {h.memory.slug: h.bm25 for h in store.search(ALICE, "redis kafka")}
    assert after == before
    assert {h.memory.scope for h in store.search(bob, "redis")} == {bob}


def _bm25(notes: list[tuple[str, str, list[str]]], query: str, k1: float = 1.2, b: float = 0.75):  # type: ignore[no-untyped-def]
    """BM25 written out from the README's formula, independently of the store's SQL."""
    docs = [note_terms(title, body, topics) for title, body, topics in notes]
    n = len(docs)
    avg = sum(length for _, length in docs) / n
    scores = []
    for weights, length in docs:
        total = 0.0
        for term in query_terms(query):
            df = sum(1 for other, _ in docs if term in other)
            f = weights.get(term, 0.0)
            if f:
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                total += idf * f * (k1 + 1) / (f + k1 * (1 - b + b * length / avg))
        scores.append(total)
    return scores


def test_bm25_is_the_documented_formula(make_store, backend: str) -> None:
    store = make_store(backend, recency_weight=0.0, pinned_bonus=0.0)
    notes = [
        ("Deploys on Fridays", "The team deploys to production every Friday.", ["ops"]),
        ("Friday standup", "Standup moved to Friday mornings.", []),
        ("Prefers dark mode", "Uses dark mode in every editor, at work and at home.", ["ui"]),
        ("Production database", "Production runs on PostgreSQL 16.", ["ops", "db"]),
    ]
    for title, body, topics in notes:
        put(store, title, body, topics=topics)
    query = "When do we deploy to production on Friday?"
    expected = dict(
        zip(
            ["deploys-on-fridays", "friday-standup", "prefers-dark-mode", "production-database"],
            _bm25(notes, query),
            strict=True,
        )
    )
    hits = store.search(ALICE, query)
    assert {h.memory.slug: h.bm25 for h in hits} == pytest.approx(
        {slug: score for slug, score in expected.items() if score > 0}, rel=1e-6
    )
    best = max(expected.values())
    for hit in hits:
        assert hit.lexical == pytest.approx(hit.bm25 / best, abs=1e-6)
        assert hit.score == pytest.approx(hit.lexical, abs=1e-6)
    assert slugs(hits)[0] == "deploys-on-fridays"


def test_title_outweighs_body(store: Store) -> None:
    put(store, "Gardening", "Tomatoes, basil and some notes about the weather.")
    put(store, "Weather station", "Tomatoes again, and basil.")
    assert slugs(store.search(ALICE, "weather"))[0] == "weather-station"


def test_topic_keys_and_keywords_are_searchable(store: Store) -> None:
    store.mem_save(
        "alice",
        "Dark theme everywhere.",
        type="preference",
        title="UI choice",
        topic_key="ui/theme",
    )
    assert [h.memory.topic_key for h in store.search(ALICE, "theme")] == ["ui/theme"]
    put(store, "Adopted Biscuit", "A beagle puppy from the shelter.", keywords=["pets", "dog"])
    hits = store.search(ALICE, "any pets?")
    assert slugs(hits) == ["adopted-biscuit"]
    assert hits[0].memory.keywords == ["pets", "dog"]


def test_keywords_are_bounded_and_checked(store: Store) -> None:
    slug = put(store, "Car", "Bought a Corolla.", keywords=["Vehicle", "car purchase"] + ["x"] * 9)
    note = store.get(ALICE, slug)
    assert note is not None and note.keywords == ["vehicle", "car-purchase", "x"]
    for bad in ("pets", [1], ["a\x00b"]):
        with pytest.raises(InvalidInput) as refused:
            put(store, "Bad", "keywords", keywords=bad)
        assert refused.value.reason in {"bad_keywords", "nul_character"}


def test_search_is_scoped_and_skips_superseded(store: Store) -> None:
    old = put(store, "Old deploy", "deploy by hand")
    new = put(store, "New deploy", "deploy by pipeline")
    store.write(Scope.owner("bob"), {"title": "Bob deploy", "body": "deploy"})
    store.link(ALICE, new, old, "supersedes")
    assert slugs(store.search(ALICE, "deploy")) == [new]


def test_a_rewritten_note_is_found_by_its_new_words_only(store: Store) -> None:
    store.write(ALICE, {"title": "City", "body": "Lives in Berlin", "slug": "city"})
    store.write(ALICE, {"title": "City", "body": "Lives in Porto", "slug": "city"})
    assert slugs(store.search(ALICE, "porto")) == ["city"]
    assert store.search(ALICE, "berlin") == []


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
    " ".join(f"word{i}" for i in range(60)),
    "x" * 3000,
]


@pytest.mark.parametrize("query", NASTY)
def test_no_query_raises(store: Store, query: str) -> None:
    put(store, "Percent 100% sure", 'under_score and back\\slash and quote" and (parens)')
    hits = store.search(ALICE, query)
    assert isinstance(hits, list)
    assert store.fingerprint(ALICE)[0] == 1


def test_like_fallback_when_the_index_finds_nothing(store: Store) -> None:
    put(store, "Percent", "it is 100% done")
    put(store, "Database", "Runs PostgreSQL 16 in production")
    put(store, "Chinese", "我喜欢猫和狗")
    # No content word (punctuation, stop words only): nothing to look for, so no hit at all.
    for query in ("%", "the", "-", "the and of"):
        assert store.search(ALICE, query) == []
    # A word inside a longer one: the index has "postgresql", the query "postgres".
    hits = store.search(ALICE, "postgres")
    assert [(h.memory.slug, h.backend) for h in hits] == [("database", "like")]
    hits = store.search(ALICE, "猫")
    assert [(h.memory.slug, h.backend) for h in hits] == [("chinese", "like")]


def test_like_backend_setting(make_store, backend: str) -> None:
    store = make_store(backend, search="like")
    put(store, "Mixed Case Title", "Body", keywords=["beagle"])
    assert [(h.memory.slug, h.backend) for h in store.search(ALICE, "case")] == [
        ("mixed-case-title", "like")
    ]
    assert slugs(store.search(ALICE, "beagle")) == ["mixed-case-title"]


def test_former_backend_name_means_bm25(make_store, backend: str) -> None:
    store = make_store(backend, search="fts")
    assert store.settings.search == "bm25"
    put(store, "Kafka", "queue")
    assert [h.backend for h in store.search(ALICE, "kafka")] == ["bm25"]


def test_empty_query_bad_limit_and_bad_window(store: Store) -> None:
    put(store, "Anything", "at all")
    assert store.search(ALICE, "   ") == []
    for limit in (0, 101, True):
        with pytest.raises(InvalidInput) as caught:
            store.search(ALICE, "anything", limit=limit)
        assert caught.value.reason == "bad_limit"
    now = datetime.now(UTC)
    for since, until in ((now, now), (now, now - timedelta(days=1)), ("2024-01-01", None)):
        with pytest.raises(InvalidInput) as caught:
            store.search(ALICE, "anything", since=since, until=until)  # type: ignore[arg-type]
        assert caught.value.reason == "bad_time_window"


def test_ranking_formula(make_store, backend: str) -> None:
    """score = (1-w)*lexical + w*0.5**(age/half_life) + bonus*pinned, as documented."""
    store = make_store(backend, recency_weight=0.5, half_life_days=10, pinned_bonus=0.3)
    # The same text: each note is the best match (lexical 1.0); only time and pins differ.
    put(store, "Notes", "postgres tuning notes", slug="fresh")
    put(store, "Notes", "postgres tuning notes", slug="stale")
    put(store, "Notes", "postgres tuning notes", slug="pinned-stale", pinned=True)
    age(store, "stale", 10)
    age(store, "pinned-stale", 10)
    hits = {h.memory.slug: h for h in store.search(ALICE, "postgres tuning")}
    assert list(hits) == ["pinned-stale", "fresh", "stale"]
    assert hits["fresh"].recency == pytest.approx(1.0, abs=1e-3)
    assert hits["stale"].recency == pytest.approx(0.5, abs=1e-3)
    for hit in hits.values():
        expected = 0.5 * hit.lexical + 0.5 * hit.recency + (0.3 if hit.memory.pinned else 0)
        assert hit.score == pytest.approx(expected, abs=1e-5)
        assert hit.lexical == pytest.approx(1.0)  # the same text: each is the best match
    assert hits["fresh"].lexical == pytest.approx(hits["stale"].lexical, abs=1e-6)


def test_recency_counts_from_when_the_fact_was_said(store: Store) -> None:
    """An old conversation imported today is old: recency follows occurred_at."""
    put(store, "Imported", "kafka consumer lag")
    put(store, "Live", "kafka consumer lag")
    set_time(store, "imported", "occurred_at", 3 * 365)
    hits = store.search(ALICE, "kafka lag")
    assert slugs(hits) == ["live", "imported"]
    assert hits[1].recency < 0.001 < hits[0].recency
    said = hits[1].memory.said_at
    assert said is not None
    assert said < datetime.now(UTC) - timedelta(days=3 * 365 - 1)
    assert hits[0].memory.said_at == hits[0].memory.updated_at


def test_since_and_until_bound_when_the_fact_was_said(store: Store) -> None:
    for slug, days in (("jan", 300), ("jun", 150), ("now", 0)):
        put(store, f"Trip {slug}", "a trip to Lisbon", slug=slug)
        set_time(store, slug, "occurred_at", days)
    now = datetime.now(UTC)
    assert slugs(store.search(ALICE, "lisbon", since=now - timedelta(days=200))) == [
        "now",
        "jun",
    ]
    assert slugs(
        store.search(
            ALICE, "lisbon", since=now - timedelta(days=200), until=now - timedelta(days=100)
        )
    ) == ["jun"]
    naive = (now - timedelta(days=200)).replace(tzinfo=None)  # a naive time is UTC
    assert slugs(store.search(ALICE, "lisbon", until=naive)) == ["jan"]
    # The LIKE fallback keeps the window too.
    assert slugs(store.search(ALICE, "lisb", until=naive)) == ["jan"]


def test_lexical_relevance_wins_without_recency(make_store, backend: str) -> None:
    store = make_store(backend, recency_weight=0.0, pinned_bonus=0.0)
    for i in range(6):  # a corpus, so term rarity means something to bm25
        put(store, f"Filler {i}", "gardening and cooking")
    put(store, "Weak", "one mention of redis among many other words about caching layers")
    put(store, "Redis redis", "redis cluster redis sentinel redis streams")
    age(store, "redis-redis", 365)
    hits = store.search(ALICE, "redis")
    assert slugs(hits) == ["redis-redis", "weak"]
    assert all(math.isclose(h.score, h.lexical, abs_tol=1e-6) for h in hits)


def test_recency_breaks_ties_and_snippet_is_bounded(store: Store) -> None:
    put(store, "Older", "x " * 400 + "needle here " + "y " * 400)
    put(store, "Newer", "x " * 400 + "needle here " + "y " * 400)
    age(store, "older", 60)
    hits = store.search(ALICE, "needle")
    assert slugs(hits) == ["newer", "older"]
    assert "needle" in hits[0].snippet and len(hits[0].snippet) <= 162


@pytest.mark.parametrize("search", ["bm25", "like"])
def test_very_old_notes_rank_without_underflow(make_store, backend: str, search: str) -> None:
    store = make_store(backend, search=search)
    put(store, "Ancient", "fossil record")
    age(store, "ancient", 200_000)  # far past any half-life: 0.5 ** 6667 underflows
    hits = store.search(ALICE, "fossil")
    assert [(h.memory.slug, h.backend == "like") for h in hits] == [("ancient", search == "like")]
    assert hits[0].recency == pytest.approx(0.0, abs=1e-9)


def test_a_dropped_search_index_is_reported_not_searched_around(make_store) -> None:
    """A missing index table means the schema is broken: say so (not_migrated), never
    quietly answer through LIKE as if nothing were wrong."""
    store = make_store("sqlite")
    store.write(ALICE, {"title": "Rust borrow checker", "body": "lifetimes"})
    with store.transaction() as session:
        session.execute(text("DROP TABLE search_postings"))
    with pytest.raises(StorageFailure) as raised:
        store.search(ALICE, "borrow")
    assert raised.value.reason == "not_migrated"


def test_reindex_indexes_notes_the_index_lacks(store: Store) -> None:
    """Notes from before the index (search_length NULL, no postings) are indexed by
    reindex, which ``migrate`` runs; a second run has nothing to do."""
    put(store, "Rust borrow checker", "lifetimes and borrows")
    put(store, "Go channels", "goroutines talk over channels")
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM search_postings"))
        conn.execute(text("UPDATE memories SET search_length = NULL"))
    assert store.search(ALICE, "lifetimes")[0].backend == "like"
    seen: list[int] = []
    result = store.reindex(progress=seen.append)
    assert (result.indexed, result.rebuilt, seen) == (2, False, [2])
    assert [(h.memory.slug, h.backend) for h in store.search(ALICE, "lifetimes")] == [
        ("rust-borrow-checker", "bm25")
    ]
    assert store.reindex().indexed == 0
    store.migrate()
    assert store.reindex().indexed == 0


def test_another_tokenizer_version_rebuilds_the_whole_index(store: Store) -> None:
    put(store, "Rust borrow checker", "lifetimes and borrows")
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM housekeeping_state WHERE name = 'search_index'"))
        conn.execute(
            text(
                "INSERT INTO housekeeping_state (name, watermark, last_result)"
                " VALUES ('search_index', 0, :r)"
            ),
            {"r": '{"version": "0/older"}'},
        )
        conn.execute(text("UPDATE search_postings SET term = term || 'x'"))
        conn.execute(text("DELETE FROM memory_terms"))  # the same-fact terms rebuilt too
    assert [h.backend for h in store.search(ALICE, "borrows")] == ["like"]
    result = store.reindex()
    assert (result.indexed, result.rebuilt) == (1, True)
    assert [h.backend for h in store.search(ALICE, "borrows")] == ["bm25"]
    with store.engine.connect() as conn:
        terms = set(conn.execute(text("SELECT term FROM memory_terms")).scalars())
    assert terms == {"rust", "borrow", "checker"}
