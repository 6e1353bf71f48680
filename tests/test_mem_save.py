"""mem_save and sessions (rule 10 and the second seed), on PostgreSQL and SQLite."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy import select

from gleaner.store import SaveResult, Scope, StorageFailure, Store
from gleaner.store.schema.models import Memory, MemSession

ALICE = Scope.owner("alice")


def row(store: Store, note_id: int) -> Memory:
    with store.transaction() as session:
        found = session.get(Memory, note_id)
        assert found is not None
        return found


def sessions(store: Store, user: str) -> list[MemSession]:
    with store.transaction() as session:
        return list(
            session.execute(
                select(MemSession).where(MemSession.user_id == user).order_by(MemSession.started_at)
            ).scalars()
        )


def test_basic_save_returns_a_frozen_result(store: Store) -> None:
    result = store.mem_save(
        "alice",
        "Switched from Postgres to SQLite for simplicity in v0.1.",
        type="decision",
        title="DB choice for v0.1",
        topic_key="architecture/db",
    )
    assert isinstance(result, SaveResult)
    assert result.outcome == "created" and result.topic_key == "architecture/db"
    with pytest.raises(Exception, match="frozen"):
        result.outcome = "updated"  # type: ignore[misc]
    stored = row(store, result.id)
    assert (stored.type, stored.scope_kind, stored.scope_id) == ("decision", "owner", "alice")
    assert stored.session_id == result.session_id


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("API key: <private>sk-abc123def456</private>", "API key: [REDACTED]"),
        ("a <PRIVATE>x</Private> b <private>y</private> c", "a [REDACTED] b [REDACTED] c"),
        ("multi <private>line\nsecret\n</private> end", "multi [REDACTED] end"),
        ("cut off <private>sk-live-999 and more\nlines", "cut off [REDACTED]"),
        ("attr <private reason='pw'>hunter2</private>!", "attr [REDACTED]!"),
    ],
)
def test_private_spans_are_stripped_before_hashing_and_persisting(
    store: Store, content: str, expected: str
) -> None:
    result = store.mem_save("alice", content, type="discovery", title="Key <private>k</private>")
    stored = row(store, result.id)
    assert stored.body == expected
    assert stored.title == "Key [REDACTED]"
    canonical = " ".join(expected.lower().split())
    assert stored.content_hash == hashlib.sha256(canonical.encode()).hexdigest()
    for secret in ("sk-abc", "hunter2", "secret", "sk-live"):
        assert secret not in stored.body
    assert store.search(ALICE, "hunter2") == [] and store.search(ALICE, "sk") == []


def test_topic_key_upserts_in_place_per_user(store: Store) -> None:
    first = store.mem_save(
        "alice",
        "Use React.",
        type="decision",
        title="Frontend stack",
        topic_key="architecture/frontend",
    )
    second = store.mem_save(
        "alice",
        "Use React + Tauri.",
        type="decision",
        title="Frontend stack v2",
        topic_key="architecture/frontend",
    )
    bob = store.mem_save(
        "bob",
        "Use Vue.",
        type="decision",
        title="Frontend stack",
        topic_key="architecture/frontend",
    )
    assert (first.outcome, second.outcome, bob.outcome) == ("created", "updated", "created")
    assert first.id == second.id != bob.id
    stored = row(store, first.id)
    assert (stored.title, stored.body) == ("Frontend stack v2", "Use React + Tauri.")
    assert store.fingerprint(ALICE)[0] == 1


def test_identical_content_in_the_same_session_is_deduped(store: Store) -> None:
    first = store.mem_save(
        "alice",
        "Wrote tests for the FTS5 LIKE fallback.",
        type="discovery",
        title="FTS5 fallback covered by tests",
    )
    again = store.mem_save(
        "alice",
        "  wrote TESTS for the fts5 like\nfallback. ",
        type="discovery",
        title="Same thing, other title",
    )
    assert again.outcome == "deduped" and again.id == first.id
    assert store.fingerprint(ALICE)[0] == 1
    other = store.mem_save("alice", "Something else.", type="discovery", title="Other")
    assert other.outcome == "created"


def test_every_call_touches_the_active_session_dedup_included(store: Store) -> None:
    store.mem_save("alice", "same", type="pattern", title="t")
    before = sessions(store, "alice")[0]
    store.mem_save("alice", "same", type="pattern", title="t")
    after = sessions(store, "alice")[0]
    assert len(sessions(store, "alice")) == 1
    assert after.saves == before.saves + 1 == 2
    assert after.last_active_at >= before.last_active_at


def test_session_summary_ends_the_session_and_the_next_save_opens_a_new_one(
    store: Store,
) -> None:
    first = store.mem_save("alice", "same content", type="profile", title="Name")
    summary = store.mem_session_summary("alice", "We set up the project.")
    assert summary.session_id == first.session_id
    assert row(store, summary.id).type == "summary"
    later = store.mem_save("alice", "same content", type="profile", title="Name")
    assert later.session_id != first.session_id
    assert later.outcome == "created"  # dedup is per session
    opened = sessions(store, "alice")
    assert [s.ended_at is not None for s in opened] == [True, False]
    assert opened[0].summary_id == summary.id


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"type": "summary"}, "reserved"),
        ({"type": "opinion"}, "not one of"),
        ({"content": ""}, "content is empty"),
        ({"content": "   "}, "content is empty"),
        ({"title": ""}, "title is empty"),
        ({"user_id": ""}, "user_id is empty"),
        ({"content": "nul\x00"}, "NUL"),
        ({"content": "x" * 40_000}, "over the limit"),
        ({"topic_key": ""}, "topic_key is empty"),
    ],
)
def test_bad_input_raises_value_error_and_changes_nothing(
    store: Store, kwargs: dict[str, str], message: str
) -> None:
    call = {"user_id": "alice", "content": "c", "type": "decision", "title": "t", **kwargs}
    with pytest.raises(ValueError, match=message):
        store.mem_save(call.pop("user_id"), call.pop("content"), **call)  # type: ignore[arg-type]
    assert store.fingerprint(ALICE) == (0, 0)
    assert sessions(store, "alice") == []


def test_configured_observation_types_are_the_allowed_ones(make_store, backend: str) -> None:
    store = make_store(backend, observation_types=("bugfix", "decision"))
    assert store.mem_save("alice", "c", type="bugfix", title="t").outcome == "created"
    with pytest.raises(ValueError, match="not one of bugfix, decision"):
        store.mem_save("alice", "c2", type="preference", title="t")


def test_storage_failure_is_runtime_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.conftest import test_settings

    broken = Store(f"sqlite:///{tmp_path}/never-migrated.db", settings=test_settings())
    with pytest.raises(RuntimeError) as caught:
        broken.mem_save("alice", "c", type="decision", title="t")
    assert isinstance(caught.value, StorageFailure)


def test_a_key_whose_note_was_superseded_updates_the_note_that_replaced_it(store: Store) -> None:
    key = "architecture/frontend"
    first = store.mem_save("alice", "Use React.", type="decision", title="Frontend", topic_key=key)
    holder = row(store, first.id).slug
    store.write(ALICE, {"title": "Frontend choice", "body": "Use Svelte.", "slug": "ui"})
    store.link(ALICE, "ui", holder, "supersedes")
    again = store.mem_save(
        "alice", "Use Svelte 5 with runes.", type="decision", title="Frontend now", topic_key=key
    )
    # Written into the hidden holder, the fact would never be found again.
    assert again.outcome == "updated" and again.topic_key == key
    replaced = store.read(ALICE, "ui").memory
    assert again.id == replaced.id != first.id
    assert (replaced.title, replaced.body, replaced.status) == (
        "Frontend now",
        "Use Svelte 5 with runes.",
        "live",
    )
    assert [hit.memory.slug for hit in store.search(ALICE, "runes")] == ["ui"]
    assert [v.body for v in store.history(ALICE, "ui")] == ["Use Svelte."]
    # The holder keeps its text, its key and its superseder.
    kept = store.read(ALICE, holder)
    assert (kept.memory.body, kept.memory.status, kept.superseded_by) == (
        "Use React.",
        "superseded",
        "ui",
    )
    assert row(store, first.id).topic_key == key
    # A chain is followed to its end.
    store.write(ALICE, {"title": "Frontend final", "body": "Use plain HTML.", "slug": "ui-final"})
    store.link(ALICE, "ui-final", "ui", "supersedes")
    last = store.mem_save(
        "alice", "Use HTML and htmx.", type="decision", title="Frontend last", topic_key=key
    )
    assert last.id == store.read(ALICE, "ui-final").memory.id
    assert store.read(ALICE, "ui").memory.body == "Use Svelte 5 with runes."
    assert store.fingerprint(ALICE)[0] == 1


def test_a_key_whose_note_a_person_replaced_with_their_own_note_never_rewrites_it(
    store: Store,
) -> None:
    key = "health/allergies"
    first = store.mem_save(
        "alice", "Allergic to nuts.", type="profile", title="Allergies", topic_key=key
    )
    holder = row(store, first.id).slug
    person = {
        "title": "Allergies (doctor)",
        "body": "Severe peanut allergy; EpiPen.",
        "slug": "doc",
    }
    store.write(ALICE, {**person, "pinned": True}, provenance="user")
    store.link(ALICE, "doc", holder, "supersedes")
    again = store.mem_save(
        "alice",
        "Maybe not allergic any more.",
        type="profile",
        title="Allergies now",
        topic_key=key,
    )
    # The person's note is untouched; the agent's text is a note of its own under the key,
    # which its superseded holder gave up (keeping its text and its superseder).
    kept = store.read(ALICE, "doc").memory
    assert (kept.body, kept.pinned, kept.provenance) == (person["body"], True, "user")
    assert again.outcome == "created" and again.id not in (first.id, kept.id)
    made = row(store, again.id)
    assert (made.topic_key, made.body, made.status) == (key, "Maybe not allergic any more.", "live")
    old = row(store, first.id)
    assert (old.topic_key, old.body, old.status) == (None, "Allergic to nuts.", "superseded")
    assert store.read(ALICE, holder).superseded_by == "doc"
    later = store.mem_save(
        "alice", "Retested: not allergic.", type="profile", title="Allergies", topic_key=key
    )
    assert (later.outcome, later.id) == ("updated", again.id)
    assert store.read(ALICE, "doc").memory.body == person["body"]


def test_saving_again_what_an_archived_note_of_the_session_holds_brings_it_back(
    store: Store,
) -> None:
    said = {"type": "discovery", "title": "Deploy day", "content": "We deploy on Thursdays."}
    first = store.mem_save("alice", said["content"], type=said["type"], title=said["title"])
    slug = row(store, first.id).slug
    store.archive(ALICE, slug)  # as decay's archiving does
    assert store.search(ALICE, "thursdays") == []
    again = store.mem_save("alice", said["content"], type=said["type"], title=said["title"])
    assert (again.outcome, again.id) == ("deduped", first.id)
    assert row(store, first.id).status == "live"
    assert [hit.memory.slug for hit in store.search(ALICE, "thursdays")] == [slug]
