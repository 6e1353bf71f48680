"""The write rules both seeds fix (DESIGN.md rules 1-5, 8, 9), on PostgreSQL and SQLite."""

from __future__ import annotations

import pytest

from gleaner.store import InvalidInput, Scope, StorageFailure, Store, format_error
from gleaner.store.notes import notes as notes_mod

ALICE = Scope.owner("alice")


def note(title: str = "Chose SQLite", body: str = "We use SQLite for v0.1.", **extra: object):
    return {"title": title, "body": body, **extra}


def assert_rejected(store: Store, attrs: object, reason: str, scope: object = ALICE, **kw: object):
    """The write is refused with ``reason``, nothing changes, and the store still works."""
    before = store.fingerprint(ALICE)
    with pytest.raises(InvalidInput) as caught:
        store.write(scope, attrs, **kw)  # type: ignore[arg-type]
    assert caught.value.reason == reason, format_error(caught.value)
    assert format_error(caught.value).startswith(f"{reason}: ")
    assert store.fingerprint(ALICE) == before
    assert store.write(ALICE, note(f"after {reason}")).created


# Rule 1 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("title", "body"),
    [
        ("  Spaces kept  ", "line one\r\nline two\n\n  indented\t\ttabs  "),
        ("Émoji 🎉 and ümlauts", "日本語のテキスト and Ω≈ç√ and a zero-width\u200bspace"),
        ("combining e\u0301 vs é", "NFC é and NFD e\u0301 are different bytes"),
    ],
)
def test_title_and_body_are_stored_byte_for_byte(store: Store, title: str, body: str) -> None:
    result = store.write(ALICE, {"title": title, "body": body})
    stored = store.get(ALICE, result.memory.slug)
    assert stored is not None
    assert stored.title.encode() == title.encode()
    assert stored.body.encode() == body.encode()


def test_valid_utf8_bytes_are_accepted_as_text(store: Store) -> None:
    result = store.write(ALICE, {"title": "bytes", "body": "café".encode()})
    assert result.memory.body == "café"


def test_nul_is_rejected(store: Store) -> None:
    assert_rejected(store, note(body="a\x00b"), "nul_character")
    assert_rejected(store, note(title="a\x00b"), "nul_character")


def test_invalid_utf8_is_rejected_as_surrogates_or_bytes(store: Store) -> None:
    smuggled = b"caf\xe9".decode("utf-8", "surrogateescape")
    assert_rejected(store, note(body=smuggled), "invalid_utf8")
    assert_rejected(store, note(title="\ud800 lone"), "invalid_utf8")
    assert_rejected(store, note(body=b"caf\xe9 \xff"), "invalid_utf8")


def test_body_limit_counts_bytes_not_characters(make_store, backend: str) -> None:
    store = make_store(backend, max_body_bytes=100)
    assert store.write(ALICE, note("ascii", "a" * 100)).created
    assert store.write(ALICE, note("two-byte fits", "é" * 50)).created  # 100 bytes
    assert_rejected(store, note("two-byte over", "é" * 51), "body_too_large")  # 51 chars
    assert_rejected(store, note("ascii over", "a" * 101), "body_too_large")


def test_default_body_limit_is_32000_bytes(store: Store) -> None:
    assert store.settings.max_body_bytes == 32_000
    assert store.write(ALICE, note("max", "x" * 32_000)).created
    assert_rejected(store, note("over", "x" * 31_999 + "é"), "body_too_large")


@pytest.mark.parametrize(
    ("attrs", "reason"),
    [
        (note(provenance="user"), "unknown_attr"),
        (note(colour="blue"), "unknown_attr"),
        ({"body": "no title"}, "missing_attr"),
        (note(title="   "), "empty_title"),
        (note(confidence=1.5), "bad_confidence"),
        (note(confidence=-0.01), "bad_confidence"),
        (note(confidence=float("nan")), "bad_confidence"),
        (note(confidence=True), "bad_confidence"),
        (note(confidence="0.5"), "bad_confidence"),
        (note(topics="db, sql"), "bad_topics"),
        (note(topics=["ok", 3]), "bad_topics"),
        (note(topics={"db": 1}), "bad_topics"),
        (note(pinned="yes"), "bad_pinned"),
        (note(slug="Not A Slug"), "bad_slug"),
        (note(source="http://x"), "bad_source"),
        (note(source={"href": "http://x"}), "bad_source"),
        ("not a mapping", "bad_type"),
    ],
)
def test_bad_attrs_are_rejected_naming_the_rule(store: Store, attrs: object, reason: str) -> None:
    assert_rejected(store, attrs, reason)


@pytest.mark.parametrize(
    "scope", [("team", "x"), ("owner", ""), ("global", "someone"), "alice", ("owner",)]
)
def test_bad_scope_is_rejected(store: Store, scope: object) -> None:
    assert_rejected(store, note(), "bad_scope", scope=scope)


# Rule 2 -----------------------------------------------------------------------------------


def test_explicit_slug_upserts(store: Store) -> None:
    first = store.write(ALICE, note("First", "v1", slug="db-choice"))
    second = store.write(ALICE, note("Second", "v2", slug="db-choice"))
    assert first.created and not second.created
    assert first.memory.id == second.memory.id
    stored = store.get(ALICE, "db-choice")
    assert stored is not None and (stored.title, stored.body) == ("Second", "v2")
    assert stored.updated_seq > first.memory.updated_seq
    assert store.fingerprint(ALICE)[0] == 1


def test_derived_slug_never_overwrites(store: Store) -> None:
    slugs = [store.write(ALICE, note("Chose SQLite", f"take {i}")).memory.slug for i in range(4)]
    assert slugs == ["chose-sqlite", "chose-sqlite-2", "chose-sqlite-3", "chose-sqlite-4"]
    assert store.get(ALICE, "chose-sqlite").body == "take 0"  # type: ignore[union-attr]


def test_title_without_ascii_word_gets_a_hash_slug(store: Store) -> None:
    first = store.write(ALICE, note("日本語", "a"))
    again = store.write(ALICE, note("日本語", "b"))
    other = store.write(ALICE, note("中文", "c"))
    assert first.memory.slug.startswith("note-") and len(first.memory.slug) == 15
    assert again.memory.slug == f"{first.memory.slug}-2"
    assert other.memory.slug != first.memory.slug


def test_slugs_are_per_scope(store: Store) -> None:
    assert store.write(ALICE, note("Same")).memory.slug == "same"
    assert store.write(Scope.owner("bob"), note("Same")).memory.slug == "same"
    assert store.write(Scope.global_(), note("Same")).memory.slug == "same"


# Rule 3 -----------------------------------------------------------------------------------


def test_pinned_refused_for_compaction_unless_allowed(store: Store) -> None:
    assert_rejected(store, note(pinned=True), "pin_refused", provenance="compaction")
    allowed = store.write(
        ALICE, note("ok", pinned=True), provenance="compaction", allow_pin_untrusted=True
    )
    assert allowed.memory.pinned


def test_pinned_refused_with_source_url_unless_allowed(store: Store) -> None:
    web = note(pinned=True, source={"url": "https://example.org/a"})
    assert_rejected(store, web, "pin_refused")
    assert_rejected(store, web, "pin_refused", provenance="user")
    assert store.write(ALICE, web, allow_pin_untrusted=True).memory.pinned
    trusted = note("artifact", pinned=True, source={"artifact": "spec.md"})
    assert store.write(ALICE, trusted).memory.pinned


def test_update_takes_pinned_from_the_call(store: Store) -> None:
    assert store.write(ALICE, note(slug="rule", pinned=True), provenance="user").memory.pinned
    rewritten = store.write(ALICE, note(slug="rule"), provenance="user")
    assert not rewritten.created and not rewritten.memory.pinned


# Rule 4 -----------------------------------------------------------------------------------


def test_provenance_is_derived_never_taken_from_attrs(store: Store) -> None:
    assert store.write(ALICE, note("a")).memory.provenance == "agent"
    web = store.write(ALICE, note("b", source={"url": "https://example.org"}))
    assert web.memory.provenance == "web"
    for provenance in ("user", "compaction", "import"):
        written = store.write(ALICE, note(provenance), provenance=provenance)
        assert written.memory.provenance == provenance
    assert_rejected(store, note("c"), "bad_provenance", provenance="web")
    assert_rejected(store, note("d"), "bad_provenance", provenance="agent")
    assert_rejected(store, note("e", provenance="user"), "unknown_attr")


# Rule 5 -----------------------------------------------------------------------------------


def test_topics_are_normalized(store: Store) -> None:
    raw = ["Machine Learning", "C++", "db", "DB", "a/b", *(f"t{i}" for i in range(10)), "x" * 50]
    result = store.write(ALICE, note(topics=raw))
    assert result.memory.topics == ["machine-learning", "c--", "db", "a-b", "t0", "t1", "t2", "t3"]


# Rule 8 -----------------------------------------------------------------------------------


def test_notes_from_a_branch_conversation_are_visible_to_the_parent_scope(store: Store) -> None:
    store.write(ALICE, note("Parent fact", "from the main line"), conversation_id="conv-1")
    branch = store.write(
        ALICE, note("Branch fact", "written on an edited branch"), conversation_id="conv-1/branch-2"
    )
    assert branch.memory.conversation_id == "conv-1/branch-2"
    assert store.get(ALICE, "branch-fact") is not None
    assert [h.memory.slug for h in store.search(ALICE, "branch")] == ["branch-fact"]
    assert store.fingerprint(ALICE)[0] == 2
    assert "Branch fact" in store.index_text(ALICE)


# Rule 9 -----------------------------------------------------------------------------------


def test_write_and_index_commit_or_roll_back_together(store: Store) -> None:
    settings = store.settings

    def two_writes_the_second_bad() -> None:
        with store.transaction() as session:
            notes_mod.write(session, settings, ALICE, note("Atomic zebra", "zebra stripes"))
            notes_mod.write(session, settings, ALICE, note("broken", "x\x00"))

    with pytest.raises(InvalidInput):
        two_writes_the_second_bad()
    assert store.get(ALICE, "atomic-zebra") is None
    assert store.search(ALICE, "zebra") == []
    store.write(ALICE, note("Atomic zebra", "zebra stripes"))
    assert [h.memory.slug for h in store.search(ALICE, "zebra")] == ["atomic-zebra"]


def test_storage_failure_is_a_runtime_error_and_store_recovers(store: Store) -> None:
    with pytest.raises(StorageFailure) as caught, store.transaction() as session:
        session.execute(__import__("sqlalchemy").text("SELECT * FROM no_such_table"))
    assert isinstance(caught.value, RuntimeError)
    assert store.write(ALICE, note()).created
