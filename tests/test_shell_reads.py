"""Reading and tending memory from the shell: ``index``, ``notes``, ``search --explain``, the
store calls behind them, and queries with no content word. On SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from store import InvalidInput, NotFound, Scope, Store
from store.search import content_words

ALICE = Scope.owner("alice")
BOB = Scope.owner("bob")


def put(store: Store, title: str, body: str, scope: Scope = ALICE, **extra: object) -> str:
    return store.write(scope, {"title": title, "body": body, **extra}).memory.slug


# --- the store ---------------------------------------------------------------------------


def test_content_words() -> None:
    assert content_words("The pgbouncer sidecar!") == ["pgbouncer", "sidecar"]
    for query in ("-", "the", "  ", "?!", "it's theirs", "to be or not to be"):
        assert content_words(query) == [], query
    # Words that only look like contractions' stop words stay: "shell", "well", "id".
    assert content_words("shell well id") == ["shell", "well", "id"]


def test_score_parts_add_up_to_the_score(make_store, backend: str) -> None:  # type: ignore[no-untyped-def]
    store = make_store(backend, recency_weight=0.4, pinned_bonus=0.3)
    put(store, "Pgbouncer sidecar", "runs beside postgres", pinned=True)
    put(store, "Sidecar pattern", "a helper container")
    hits = store.search(ALICE, "sidecar")
    assert len(hits) == 2
    for hit in hits:
        assert hit.parts is not None
        assert hit.parts.lexical == pytest.approx(0.6 * hit.lexical, abs=1e-6)
        assert hit.parts.recency == pytest.approx(0.4 * hit.recency, abs=1e-6)
        assert hit.parts.pinned == (0.3 if hit.memory.pinned else 0.0)
        total = hit.parts.lexical + hit.parts.recency + hit.parts.pinned
        assert total == pytest.approx(hit.score, abs=1e-5)


def test_pin_unpin_archive_and_list(store: Store) -> None:
    first = put(store, "Uses pgbouncer", "in transaction mode")
    second = put(store, "Prefers tabs", "four wide")
    put(store, "Bob's note", "bob only", scope=BOB)
    before = store.fingerprint(ALICE)

    pinned = store.pin(ALICE, first)
    assert pinned.changed and pinned.memory.pinned
    assert store.fingerprint(ALICE)[1] > before[1]  # the index text is rebuilt
    assert "in transaction mode" in store.index_text(ALICE)  # a pinned body is in the index
    assert not store.pin(ALICE, first).changed  # already pinned: nothing changes
    assert [n.slug for n in store.list_notes(ALICE, pinned=True)] == [first]
    assert {n.slug for n in store.list_notes(ALICE)} == {first, second}

    unpinned = store.unpin(ALICE, first)
    assert unpinned.changed and not unpinned.memory.pinned
    assert "in transaction mode" not in store.index_text(ALICE)

    archived = store.archive(ALICE, second)
    assert archived.changed and archived.memory.status == "archived"
    assert not store.archive(ALICE, second).changed
    # Archived: out of search, the index and the live list; the note itself is kept.
    assert store.search(ALICE, "tabs") == []
    assert "Prefers tabs" not in store.index_text(ALICE)
    assert [n.slug for n in store.list_notes(ALICE)] == [first]
    assert [n.slug for n in store.list_notes(ALICE, status="archived")] == [second]
    assert {n.slug for n in store.list_notes(ALICE, status=None)} == {first, second}
    assert store.read(ALICE, second).memory.body == "four wide"
    assert store.history(ALICE, second) == []

    with pytest.raises(InvalidInput) as refused:
        store.pin(ALICE, second)
    assert refused.value.reason == "not_live"
    # Another owner's note is not found through alice's scope.
    with pytest.raises(NotFound):
        store.archive(ALICE, "bobs-note")
    assert store.list_notes(BOB)[0].status == "live"
    with pytest.raises(InvalidInput):
        store.list_notes(ALICE, status="gone")
    with pytest.raises(InvalidInput):
        store.list_notes(ALICE, limit=0)


def test_an_archived_note_rewritten_is_live_again_with_its_history(store: Store) -> None:
    slug = store.write(ALICE, {"title": "Editor", "body": "vim", "slug": "editor"}).memory.slug
    store.archive(ALICE, slug)
    store.write(ALICE, {"title": "Editor", "body": "helix", "slug": "editor"})
    note = store.read(ALICE, slug).memory
    assert (note.status, note.body) == ("live", "helix")
    assert [v.body for v in store.history(ALICE, slug)] == ["vim"]
