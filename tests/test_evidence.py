"""Evidence: what a note rests on (quotes of its conversation, each with its speaker), kept
with the text it grounds, in history too; refused when malformed. On both databases."""

from __future__ import annotations

import pytest

from gleaner.store import InvalidInput, Scope, Store

ALICE = Scope.owner("alice")
QUOTE = {"speaker": "user", "quote": "I moved to Porto last spring"}


def test_evidence_is_stored_shown_and_kept_in_history(store: Store) -> None:
    first = store.write(
        ALICE,
        {
            "title": "Lives in Porto",
            "body": "Moved in spring.",
            "slug": "city",
            "evidence": [QUOTE],
        },
    )
    assert [e.model_dump() for e in first.memory.evidence] == [QUOTE]
    later = {"speaker": "user", "quote": "we moved on to Lisbon"}
    store.write(
        ALICE,
        {"title": "Lives in Lisbon", "body": "Moved again.", "slug": "city", "evidence": [later]},
    )
    note = store.read(ALICE, "city").memory
    assert [e.quote for e in note.evidence] == [later["quote"]]
    (version,) = store.history(ALICE, "city")
    assert [e.model_dump() for e in version.evidence] == [QUOTE]
    plain = store.write(ALICE, {"title": "No evidence", "body": "Written by hand."})
    assert plain.memory.evidence == []


@pytest.mark.parametrize(
    "evidence",
    [
        "a quote",
        [QUOTE] * 4,
        [{"speaker": "user"}],
        [{"speaker": "user", "quote": "x", "extra": 1}],
        [{"speaker": "user", "quote": "nul \x00 here"}],
        [{"speaker": 3, "quote": "x"}],
    ],
)
def test_malformed_evidence_is_refused_and_nothing_is_written(
    store: Store, evidence: object
) -> None:
    with pytest.raises(InvalidInput) as refused:
        store.write(ALICE, {"title": "T", "body": "B", "evidence": evidence})
    assert refused.value.reason in {"bad_evidence", "nul_character", "bad_type"}
    assert store.fingerprint(ALICE) == (0, 0)


# --- through the harvest: grounding and the model's marks -------------------------------------

from collections.abc import Iterator  # noqa: E402
from datetime import UTC, datetime  # noqa: E402

from gleaner.harvest.job import harvest_transcript  # noqa: E402
from gleaner.harvest.transcript import Message, Transcript  # noqa: E402
from tests.llm_server import LLMServer, answer, llm_server, note  # noqa: E402

WHEN = datetime(2026, 1, 5, tzinfo=UTC)


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with llm_server() as running:
        yield running


def model_store(make_store, backend: str, server: LLMServer, **extra: object) -> Store:  # type: ignore[no-untyped-def]
    return make_store(  # type: ignore[no-any-return]
        backend,
        harvest_model="openai/test-model",
        harvest_api_base=server.api_base,
        harvest_api_key="k",
        harvest_timeout_seconds=5,
        harvest_max_attempts=1,
        **extra,
    )


def chat(*turns: tuple[str, str], cid: str = "c1") -> Transcript:
    return Transcript(
        conversation_id=cid,
        owner="alice",
        ended_at=WHEN,
        messages=[Message(role=role, content=text) for role, text in turns],
    )


TALK = chat(
    ("user", "We finally picked   PostgreSQL for billing. I\u2019m vegetarian, by the way."),
    ("assistant", "Noted. You might enjoy Helix as an editor."),
)


def said(quote: str, speaker: str = "user") -> list[dict[str, str]]:
    return [{"speaker": speaker, "quote": quote}]


def test_only_grounded_notes_are_written_with_their_evidence(
    make_store, backend: str, server: LLMServer
) -> None:
    store = model_store(make_store, backend, server, harvest_max_facts=10)
    server.script(
        answer(
            [
                # Found, case, spacing and curly quotes aside; the speaker is the message's.
                note(
                    "Chose PostgreSQL for billing",
                    type="decision",
                    evidence=said("we finally picked postgresql for billing", "assistant"),
                ),
                note("Is vegetarian", type="profile", evidence=said('"I\'m vegetarian…"')),
                # Made up: no message holds it.
                note("Uses MongoDB", type="decision", evidence=said("we use MongoDB")),
                # A preference resting on the assistant's words only is not the user's.
                note(
                    "Prefers Helix",
                    type="preference",
                    evidence=said("You might enjoy Helix", "assistant"),
                ),
                # A decision may rest on what the assistant said, and says so.
                note(
                    "Editor suggestion noted",
                    type="decision",
                    evidence=said("you might enjoy helix", "user"),
                ),
                note("No evidence at all", type="decision", evidence=[]),
            ]
        )
    )
    report = harvest_transcript(store, TALK)
    assert (report.notes_written, report.items_dropped, report.items_ungrounded) == (3, 3, 3)
    evidence = {
        n.title: [(e.speaker, e.quote) for e in n.evidence] for n in store.list_notes(ALICE)
    }
    assert evidence == {
        "Chose PostgreSQL for billing": [("user", "we finally picked postgresql for billing")],
        "Is vegetarian": [("user", '"I\'m vegetarian…"')],
        "Editor suggestion noted": [("assistant", "you might enjoy helix")],
    }


def test_the_offline_extractor_quotes_the_sentence_it_used(store: Store) -> None:
    talk = chat(("user", "Hello there. I prefer tabs over spaces in every repo. Thanks!"))
    report = harvest_transcript(store, talk)
    assert report.notes_written == 1
    (found,) = store.list_notes(ALICE)
    assert [(e.speaker, e.quote) for e in found.evidence] == [
        ("user", "I prefer tabs over spaces in every repo.")
    ]


def test_marks_apply_only_to_notes_shown_live_and_not_a_persons(
    make_store, backend: str, server: LLMServer
) -> None:
    store = model_store(make_store, backend, server)
    store.write(ALICE, {"title": "Prefers dark mode", "body": "Everywhere.", "slug": "dark"})
    store.write(
        ALICE,
        {"title": "Answers in French", "body": "Always.", "slug": "french", "pinned": True},
        provenance="user",
    )
    quote = said("We finally picked PostgreSQL")
    server.script(
        answer(
            [
                # Names a note it was never shown: no mark, a note of its own.
                note("Chose PostgreSQL", type="decision", evidence=quote, mark="update", ref="n9"),
                # The same as a shown note: nothing written.
                note("Likes dark mode", type="decision", evidence=quote, mark="same", ref="n1"),
                # An update of a person's pinned note: never.
                note(
                    "Answers in English", type="decision", evidence=quote, mark="update", ref="n2"
                ),
            ]
        )
    )
    talk = chat(("user", "We finally picked PostgreSQL. Dark mode and French, as ever."))
    report = harvest_transcript(store, talk)
    shown = server.requests[-1].user_text
    assert "- n1 Prefers dark mode: Everywhere." in shown and "- n2 Answers in French" in shown
    assert (report.notes_written, report.notes_updated, report.notes_skipped) == (1, 0, 2)
    french = store.get(ALICE, "french")
    assert french is not None and french.title == "Answers in French"
    assert store.get(ALICE, "chose-postgresql") is not None


@pytest.mark.parametrize(
    ("first", "second", "key"),
    [
        (
            ("Uses Vim for Python", "Edits Python in Vim."),
            ("Uses VS Code for TypeScript", "Edits TypeScript in VS Code."),
            "preference/editor",
        ),
        (
            ("Has a dog named Rex", "A terrier."),
            ("Has a cat named Miso", "A grey cat."),
            "profile/pets",
        ),
        (
            ("Billing runs on PostgreSQL", "The billing service's database."),
            ("Analytics runs on ClickHouse", "The analytics database."),
            "decision/database",
        ),
        (
            ("Speaks Spanish", "Fluent since school."),
            ("Speaks French", "Learning it at night."),
            "profile/language",
        ),
        (
            ("Allergic to shellfish", "Severe."),
            ("Allergic to pollen", "In spring."),
            "profile/allergy",
        ),
    ],
)
@pytest.mark.parametrize("marked", [True, False])
def test_a_reused_topic_key_never_loses_a_fact(
    make_store, backend: str, server: LLMServer, first, second, key: str, marked: bool
) -> None:
    """Two facts under one key: with the model's mark (shown the first, it says "new") or
    without one (the lexical rule finds two facts), both stay live."""
    store = model_store(make_store, backend, server)
    marks = {"mark": "new", "ref": None} if marked else {}
    server.script(
        answer([note(first[0], body=first[1], type="profile", topic_key=key)]),
        answer([note(second[0], body=second[1], type="profile", topic_key=key, **marks)]),
    )
    harvest_transcript(store, chat(("user", f"About {first[0]}."), cid="a"))
    report = harvest_transcript(store, chat(("user", f"About {second[0]}."), cid="b"))
    assert (report.notes_written, report.notes_updated) == (1, 0)
    titles = sorted(n.title for n in store.list_notes(ALICE))
    assert titles == sorted([first[0], second[0]])
    assert all(store.history(ALICE, n.slug) == [] for n in store.list_notes(ALICE))


def test_evidence_is_shown_by_show_and_explain_and_kept_in_json(
    store: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    import os

    from gleaner.cli import main

    store.write(
        ALICE,
        {"title": "Lives in Porto", "body": "Since spring.", "slug": "city", "evidence": [QUOTE]},
    )
    for name in [k for k in os.environ if k.startswith("GLEANER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("GLEANER_DATABASE_URL", store.database_url)
    assert main(["show", "city", "--owner", "alice"]) == 0
    assert 'evidence (user): "I moved to Porto last spring"' in capsys.readouterr().out
    assert main(["search", "porto", "--owner", "alice", "--explain"]) == 0
    assert 'evidence (user): "I moved to Porto last spring"' in capsys.readouterr().out
    assert main(["show", "city", "--owner", "alice", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["evidence"] == [QUOTE]
