"""notes.write_batch: every write rule per item, sequential semantics, one transaction."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select, text

from gleaner.store import Scope, Store
from gleaner.store.errors import StorageFailure
from gleaner.store.notes import notes, write_plan
from gleaner.store.schema.models import Memory, MemoryTerm

ALICE = Scope.owner("alice")
BOB = Scope.owner("bob")
WHEN = datetime(2024, 3, 1, 9, 30, tzinfo=UTC)

ITEMS = [
    notes.BatchItem({"title": "Deploy plan", "body": "first", "topics": ["Ops", "k8s"]}),
    notes.BatchItem({"title": "Deploy plan", "body": "second"}),
    notes.BatchItem({"title": "Deploy  plan!", "body": "third", "confidence": 0.5}),
    # Upserts the second item's note (its derived slug), as a later single write would.
    notes.BatchItem({"title": "Plan v2", "body": "rewritten", "slug": "deploy-plan-2"}),
    # Upserts a note stored before the batch.
    notes.BatchItem({"title": "Old one", "body": "new body", "slug": "old-one"}),
    notes.BatchItem({"title": "Old one", "body": "derived, so never overwrites"}),
    notes.BatchItem({"title": "Editor", "body": "vim"}, note_type="preference", topic_key="ed"),
    notes.BatchItem({"title": "Editor", "body": "emacs"}, note_type="preference", topic_key="ed"),
    notes.BatchItem({"title": "Shell", "body": "zsh"}, note_type="preference", topic_key="sh"),
    notes.BatchItem({"title": "Café ☕", "body": "unicode title"}),
    notes.BatchItem({"title": "日本語", "body": "no ascii word: hash slug"}),
]


def seed(store: Store, scope: Scope) -> None:
    """The same notes before the batch in each scope."""
    store.write(scope, {"title": "Old one", "body": "old body"})
    store.write(scope, {"title": "Deploy plan 3", "body": "x", "slug": "deploy-plan-3"})
    with store.transaction() as session:
        notes.write(
            session,
            store.settings,
            scope,
            {"title": "Shell", "body": "bash"},
            note_type="preference",
            topic_key="sh",
        )


def state(store: Store, scope: Scope) -> list[tuple[Any, ...]]:
    with store.transaction() as session:
        rows = session.execute(
            select(Memory).where(Memory.scope_kind == scope.kind, Memory.scope_id == scope.id)
        ).scalars()
        out = []
        for m in rows:
            terms = session.execute(
                select(MemoryTerm.term).where(MemoryTerm.memory_id == m.id).order_by("term")
            ).scalars()
            out.append(
                (
                    m.slug,
                    m.title,
                    m.body,
                    m.topics,
                    m.type,
                    m.topic_key,
                    m.provenance,
                    m.pinned,
                    m.confidence,
                    m.status,
                    m.conversation_id,
                    m.term_count,
                    tuple(terms),
                )
            )
        return sorted(out)


def test_batch_matches_single_writes(store: Store) -> None:
    seed(store, ALICE)
    seed(store, BOB)
    with store.transaction() as session:
        batch = notes.write_batch(
            session,
            store.settings,
            ALICE,
            ITEMS,
            provenance="import",
            conversation_id="c1",
            occurred_at=WHEN,
        )
    singles = []
    for item in ITEMS:
        with store.transaction() as session:
            result = notes.write(
                session,
                store.settings,
                BOB,
                item.attrs,
                provenance="import",
                conversation_id="c1",
                note_type=item.note_type,
                topic_key=item.topic_key,
                occurred_at=WHEN,
            )
        singles.append(("created" if result.created else "updated", result.memory.slug))
    assert [(r.outcome, r.slug) for r in batch] == singles
    assert state(store, ALICE) == state(store, BOB)
    slugs = [r.slug for r in batch]
    assert slugs[:3] == ["deploy-plan", "deploy-plan-2", "deploy-plan-4"]
    assert slugs[5] == "old-one-2"
    # The seq is store-wide and monotonic: every written row got a fresh one.
    with store.transaction() as session:
        seqs = session.execute(select(Memory.updated_seq)).scalars().all()
    assert len(seqs) == len(set(seqs))


def test_batch_rules_per_item(store: Store) -> None:
    items = [
        notes.BatchItem({"title": "Ok", "body": "fine"}),
        notes.BatchItem({"title": "Nul", "body": "a\x00b"}),
        notes.BatchItem({"title": "Big", "body": "x" * (store.settings.max_body_bytes + 1)}),
        notes.BatchItem({"title": "Pin", "body": "b", "pinned": True}),
        notes.BatchItem({"title": "Web", "body": "b", "source": {"url": "https://x"}}),
        notes.BatchItem({"title": "Extra", "body": "b", "provenance": "user"}),
    ]
    with store.transaction() as session:
        results = notes.write_batch(session, store.settings, ALICE, items, provenance="compaction")
    assert [r.outcome for r in results] == [
        "created",
        "invalid",
        "invalid",
        "invalid",
        "created",
        "invalid",
    ]
    reasons = [r.error.reason for r in results if r.error is not None]
    assert reasons == ["nul_character", "body_too_large", "pin_refused", "unknown_attr"]
    with store.transaction() as session:
        web = notes.write_batch(
            session,
            store.settings,
            ALICE,
            [notes.BatchItem({"title": "W", "body": "b", "source": {"url": "u"}})],
        )
    note = store.get(ALICE, str(web[0].slug))
    assert note is not None and note.provenance == "web"


def test_batch_notes_are_indexed(store: Store) -> None:
    items = [
        notes.BatchItem({"title": f"Kubernetes rollout {n}", "body": f"canary {n}"})
        for n in range(30)
    ]
    with store.transaction() as session:
        notes.write_batch(session, store.settings, ALICE, items)
    hits = store.search(ALICE, "canary", limit=50)
    assert len(hits) == 30
    similar = store.write(ALICE, {"title": "Kubernetes rollout 7", "body": "again"}).similar
    assert similar[0].slug == "kubernetes-rollout-7" and similar[0].score == 1.0
    assert store.get(ALICE, "kubernetes-rollout-7-2") is not None


def test_batch_is_atomic(store: Store) -> None:
    store.write(ALICE, {"title": "Keep", "body": "as is", "slug": "keep"})

    def batch_then_fail() -> None:
        with store.transaction() as session:
            notes.write_batch(
                session,
                store.settings,
                ALICE,
                [
                    notes.BatchItem({"title": "New", "body": "b"}),
                    notes.BatchItem({"title": "Keep", "body": "changed", "slug": "keep"}),
                ],
            )
            raise StorageFailure("boom")

    with pytest.raises(StorageFailure):
        batch_then_fail()
    assert [s[0] for s in state(store, ALICE)] == ["keep"]
    assert state(store, ALICE)[0][2] == "as is"
    with store.transaction() as session:
        count = session.execute(text("SELECT count(*) FROM memory_terms")).scalar_one()
    assert count == 1
    assert store.search(ALICE, "new") == []


def test_batch_revives_archived_note(store: Store) -> None:
    store.write(ALICE, {"title": "Old", "body": "b", "slug": "old"})
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE memories SET status = 'archived'"))
    with store.transaction() as session:
        (result,) = notes.write_batch(
            session,
            store.settings,
            ALICE,
            [notes.BatchItem({"title": "Old", "body": "c", "slug": "old"})],
        )
    assert result.outcome == "updated"
    note = store.get(ALICE, "old")
    assert note is not None and note.status == "live" and note.body == "c"


@pytest.mark.parametrize("executor", ["session", "connection"])
def test_batch_updates_touch_only_their_notes(store: Store, executor: str) -> None:
    # Two updates with different columns (one revives an archived note) and a note the
    # batch does not name: each row is updated by its id, the bystander is left alone.
    for slug in ("archived", "live", "bystander"):
        store.write(ALICE, {"title": slug.title(), "body": "before", "slug": slug})
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE memories SET status = 'archived' WHERE slug = 'archived'"))
    items = [
        notes.BatchItem({"title": "Archived", "body": "after a", "slug": "archived"}),
        notes.BatchItem({"title": "Live", "body": "after b", "slug": "live"}),
    ]
    opened = store.transaction() if executor == "session" else store.connection()
    with opened as handle:
        results = notes.write_batch(handle, store.settings, ALICE, items)
    assert [r.outcome for r in results] == ["updated", "updated"]
    found = {n.slug: (n.body, n.status) for n in store.list_notes(ALICE, status=None)}
    assert found == {
        "archived": ("after a", "live"),
        "live": ("after b", "live"),
        "bystander": ("before", "live"),
    }


def test_empty_and_all_invalid_batches(store: Store) -> None:
    with store.transaction() as session:
        assert notes.write_batch(session, store.settings, ALICE, []) == []
        (bad,) = notes.write_batch(
            session, store.settings, ALICE, [notes.BatchItem({"title": "", "body": "b"})]
        )
    assert bad.outcome == "invalid"
    assert store.fingerprint(ALICE) == (0, 0)


def test_batch_slug_taken_meanwhile_is_planned_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slug a concurrent writer took after the lookup: that item is planned again, the
    lost slug counted as taken (the lookup here stays stale, as a race would leave it)."""
    store.write(ALICE, {"title": "Taken", "body": "x"})
    lookup = write_plan.lookup

    def stale(*args: Any, **kwargs: Any) -> Any:
        by_slug, by_topic, _taken = lookup(*args, **kwargs)
        return by_slug, by_topic, set()  # as if the lookup ran before the other insert

    monkeypatch.setattr(write_plan, "lookup", stale)
    with store.transaction() as session:
        results = notes.write_batch(
            session,
            store.settings,
            ALICE,
            [
                notes.BatchItem({"title": "Taken", "body": "y"}),
                notes.BatchItem({"title": "Free", "body": "z"}),
            ],
        )
    assert [(r.outcome, r.slug) for r in results] == [
        ("created", "taken-2"),
        ("created", "free"),
    ]
    taken = store.get(ALICE, "taken")
    assert taken is not None and taken.body == "x"


def test_postgresql_batch_insert_stores_what_a_single_write_stores(make_store) -> None:  # type: ignore[no-untyped-def]
    """On PostgreSQL a batch's new notes go in one multi-row INSERT, a single write's in a
    one-row INSERT (its row returned): every column must come out the same."""
    store = make_store("postgresql")
    items = [
        notes.BatchItem({"title": "Plain", "body": "no source", "confidence": 0.123456789}),
        notes.BatchItem({"title": "Web", "body": "b", "source": {"url": "https://x", "note": "n"}}),
        notes.BatchItem({"title": "Typed", "body": "t", "topics": ["A b"]}, "fact", "tk"),
    ]
    with store.transaction() as session:
        notes.write_batch(
            session, store.settings, ALICE, items, conversation_id="c", occurred_at=WHEN
        )
    for item in items:
        with store.transaction() as session:
            notes.write(
                session,
                store.settings,
                BOB,
                item.attrs,
                conversation_id="c",
                note_type=item.note_type,
                topic_key=item.topic_key,
                occurred_at=WHEN,
            )
    skip = ("id", "scope_id", "created_at", "updated_at", "updated_seq")

    def rows(scope: Scope) -> list[dict[str, Any]]:
        with store.engine.connect() as conn:
            found = conn.execute(
                text(
                    "SELECT m.*, source IS NULL AS sql_null, source::text AS source_text,"
                    " (SELECT array_agg(term ORDER BY term) FROM memory_terms t"
                    "  WHERE t.memory_id = m.id AND t.scope_id = m.scope_id) AS terms"
                    " FROM memories m WHERE scope_id = :sid ORDER BY updated_seq"
                ),
                {"sid": scope.id},
            ).mappings()
            return [{k: v for k, v in row.items() if k not in skip} for row in found]

    batch, singles = rows(ALICE), rows(BOB)
    assert batch == singles
    # On a Core connection, in a transaction like a harvest's: the same rows again.
    carol = Scope.owner("carol")
    with store.connection(opening=[(text("SELECT 1"), {})]) as connection:
        written = notes.write_batch(
            connection, store.settings, carol, items, conversation_id="c", occurred_at=WHEN
        )
        assert [r.outcome for r in written] == ["created"] * 3
        assert all(r.id for r in written)
    assert rows(carol) == singles
    assert [row["slug"] for row in batch] == ["plain", "web", "tk"]  # seq in item order
    assert batch[0]["source_text"] == "null" and not batch[0]["sql_null"]
    assert batch[1]["source"] == {"url": "https://x", "note": "n"}
    assert batch[0]["occurred_at"] == WHEN and batch[0]["terms"] == ["plain"]
