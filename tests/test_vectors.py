"""Note vectors and hybrid search, on both databases, with vectors made by hand (the
embedding clients have their own tests): what is pending, what a stale or foreign vector
does, scope isolation, and the fused ranking."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from gleaner.store import Scope, Store
from gleaner.store.recall import vectors as note_vectors

ALICE = Scope.owner("alice")
BOB = Scope.owner("bob")
MODEL = "test/axes"


def axis(i: int, dims: int = 4) -> list[float]:
    """A unit vector along axis ``i``."""
    return [1.0 if j == i else 0.0 for j in range(dims)]


def embed_all(store: Store, vectors: dict[str, list[float]], model: str = MODEL) -> int:
    """Store a vector for every pending note, picked by its title's first word."""
    with store.connection() as conn:
        notes = note_vectors.pending(conn, model, limit=1000)
        return note_vectors.save(
            conn, model, notes, [vectors[n.text.split()[0].lower()] for n in notes]
        )


def put(store: Store, title: str, body: str, scope: Scope = ALICE) -> str:
    return store.write(scope, {"title": title, "body": body}).memory.slug


def test_pending_save_and_a_changed_text(store: Store) -> None:
    put(store, "Dog named Luna", "a beagle")
    put(store, "Cat named Miso", "grey")
    put(store, "Dog walker", "Tuesdays", scope=BOB)
    with store.connection() as conn:
        assert note_vectors.count_pending(conn, MODEL) == 3
        assert note_vectors.count_pending(conn, MODEL, scope=ALICE) == 2
        first = note_vectors.pending(conn, MODEL, scope=ALICE, limit=1)
        assert [n.text for n in first] == ["Dog named Luna\na beagle"]
    assert embed_all(store, {"dog": axis(0), "cat": axis(1)}) == 3
    with store.connection() as conn:
        assert note_vectors.count_pending(conn, MODEL) == 0
        assert note_vectors.count_pending(conn, "other/model") == 3  # a new model: all again
        stale = note_vectors.pending(conn, "other/model", scope=ALICE, limit=1)
    store.write(
        ALICE, {"title": "Dog named Luna", "body": "a beagle, now 3", "slug": "dog-named-luna"}
    )
    with store.connection() as conn:
        # Rewritten since it was read: no vector is stored for the old text.
        assert note_vectors.save(conn, "other/model", stale, [axis(2)]) == 0
        assert [n.id for n in note_vectors.pending(conn, MODEL)] == [stale[0].id]
        with pytest.raises(ValueError, match="1 notes but 2 vectors"):
            note_vectors.save(conn, MODEL, stale, [axis(0), axis(1)])


def test_nearest_is_scoped_live_and_of_one_model_and_size(store: Store) -> None:
    put(store, "Dog named Luna", "a beagle")
    cat = put(store, "Cat named Miso", "grey")
    put(store, "Dog walker", "Tuesdays", scope=BOB)
    embed_all(store, {"dog": axis(0), "cat": axis(1)})
    with store.connection() as conn:
        found = note_vectors.nearest(conn, ALICE, MODEL, axis(0), limit=5)
        assert [round(score, 6) for _, score in found] == [1.0, 0.0]
        assert len(note_vectors.nearest(conn, BOB, MODEL, axis(0), limit=5)) == 1
        assert note_vectors.nearest(conn, ALICE, "other/model", axis(0), limit=5) == []
        assert note_vectors.nearest(conn, ALICE, MODEL, axis(0, dims=8), limit=5) == []
        assert note_vectors.nearest(conn, ALICE, MODEL, [0.0] * 4, limit=5) == []
    store.archive(ALICE, cat)
    with store.connection() as conn:
        assert len(note_vectors.nearest(conn, ALICE, MODEL, axis(1), limit=5)) == 1


def test_hybrid_search_finds_what_no_word_matches(store: Store) -> None:
    """The note about a beagle shares no word with "pets", but its vector is near."""
    put(store, "Adopted Biscuit", "A beagle puppy from the shelter.")
    put(store, "Pet insurance renewal", "Renew the insurance in May.")
    put(store, "Works at Globex", "Data engineer.")
    embed_all(store, {"adopted": axis(0), "pet": axis(1), "works": axis(2)})
    lexical = store.search(ALICE, "which pets?")
    assert [h.memory.slug for h in lexical] == ["pet-insurance-renewal"]
    query = [math.sqrt(0.5), math.sqrt(0.5), 0.0, 0.0]  # near the beagle and the insurance
    hits = store.search(ALICE, "which pets?", vector=query, vector_model=MODEL)
    assert [h.memory.slug for h in hits[:2]] == ["pet-insurance-renewal", "adopted-biscuit"]
    assert {h.backend for h in hits} == {"hybrid"}
    assert hits[1].bm25 == 0.0 and hits[1].semantic == pytest.approx(math.sqrt(0.5), abs=1e-5)
    for hit in hits:
        assert hit.parts is not None
        assert hit.score == pytest.approx(
            hit.parts.lexical + hit.parts.recency + hit.parts.pinned, abs=1e-5
        )
    assert hits[0].lexical == pytest.approx(1.0)  # the best of both rankings
    # Another model's vectors, or none yet: lexical alone, as before.
    again = store.search(ALICE, "which pets?", vector=query, vector_model="other/model")
    assert [(h.memory.slug, h.backend) for h in again] == [("pet-insurance-renewal", "bm25")]


def test_hybrid_search_keeps_the_time_window(store: Store) -> None:
    put(store, "Adopted Biscuit", "A beagle puppy.")
    put(store, "Adopted Rex", "A terrier.")
    embed_all(store, {"adopted": axis(0)})
    old = datetime.now(UTC) - timedelta(days=400)
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE memories SET occurred_at = :t WHERE slug = 'adopted-rex'"),
            {"t": old if store.dialect == "postgresql" else old.replace(tzinfo=None)},
        )
    recent = datetime.now(UTC) - timedelta(days=30)
    hits = store.search(ALICE, "dog", vector=axis(0), vector_model=MODEL, since=recent)
    assert [h.memory.slug for h in hits] == ["adopted-biscuit"]
    hits = store.search(ALICE, "dog", vector=axis(0), vector_model=MODEL, until=recent)
    assert [h.memory.slug for h in hits] == ["adopted-rex"]


def test_forget_takes_the_vectors_and_usage_adds_up(store: Store) -> None:
    put(store, "Dog named Luna", "a beagle")
    put(store, "Dog walker", "Tuesdays", scope=BOB)
    embed_all(store, {"dog": axis(0)})
    with store.connection() as conn:
        note_vectors.record_usage(conn, MODEL, calls=1, notes=2, tokens=10, cost_usd=0.5)
        note_vectors.record_usage(conn, MODEL, calls=2, notes=3, tokens=5, cost_usd=None)
        (row,) = note_vectors.usage(conn)
    assert (row["calls"], row["notes"], row["tokens"], row["cost_usd"]) == (3, 5, 15, None)
    store.forget_owner("alice")
    with store.engine.connect() as conn:
        owners = conn.execute(text("SELECT scope_id FROM memory_vectors")).scalars().all()
    assert owners == ["bob"]


def test_a_vector_stored_since_the_last_search_is_seen_by_the_next(store: Store) -> None:
    """The scope's vectors are kept between searches; a vector stored since (a new note's,
    or a re-embedded one's) is seen at once, and an archived note's never."""
    dog = store.write(ALICE, {"title": "Dog named Luna", "body": "a beagle"}).memory
    embed_all(store, {"dog": axis(0)})
    with store.connection() as conn:
        found = note_vectors.nearest(conn, ALICE, MODEL, axis(1), limit=5)
    assert [i for i, _ in found] == [dog.id]
    cat = store.write(ALICE, {"title": "Cat named Miso", "body": "grey"}).memory
    embed_all(store, {"cat": axis(1)})
    with store.connection() as conn:
        best = note_vectors.nearest(conn, ALICE, MODEL, axis(1), limit=5)
    assert best[0][0] == cat.id
    store.archive(ALICE, cat.slug)
    with store.connection() as conn:
        assert len(note_vectors.nearest(conn, ALICE, MODEL, axis(1), limit=5)) == 1
