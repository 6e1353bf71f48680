"""The deterministic offline extractor: cues, titles, topic keys, dedup, cap, and silence."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gleaner.harvest.candidate import NoteCandidate
from gleaner.harvest.offline import offline_extract
from gleaner.harvest.readers import iter_paths, read_path
from gleaner.harvest.transcript import Message, Transcript
from gleaner.store.settings import DEFAULT_OBSERVATION_TYPES as TYPES

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def said(*user_turns: str, title: str | None = "Setup") -> Transcript:
    """A transcript of user turns, each answered by a bland assistant turn."""
    messages: list[Message] = []
    for i, text in enumerate(user_turns):
        messages.append(
            Message(role="user", content=text, at=datetime(2024, 5, 1, 9, i, tzinfo=UTC))
        )
        messages.append(Message(role="assistant", content="OK."))
    return Transcript(conversation_id="c1", title=title, messages=messages)


def one(text: str) -> NoteCandidate:
    notes = offline_extract(said(text), 10, TYPES)
    assert len(notes) == 1, notes
    return notes[0]


@pytest.mark.parametrize(
    ("sentence", "type_", "title"),
    [
        ("I prefer tabs over spaces.", "preference", "Prefers tabs over spaces"),
        (
            "I'd rather use pytest than unittest.",
            "preference",
            "Would rather use pytest than unittest",
        ),
        (
            "Please always use type hints in examples.",
            "preference",
            "Always use type hints in examples",
        ),
        ("Please never mention ticket numbers.", "preference", "Never mention ticket numbers"),
        ("Do not use emojis, please.", "preference", "Never use emojis"),
        ("I love Rust's borrow checker.", "preference", "Loves Rust's borrow checker"),
        ("I hate long meetings.", "preference", "Dislikes long meetings"),
        ("I don't like YAML configs.", "preference", "Dislikes YAML configs"),
        (
            "We decided to use PostgreSQL because we need JSONB.",
            "decision",
            "Decided to use PostgreSQL",
        ),
        ("Let's go with Redis streams.", "decision", "Decided to go with Redis streams"),
        (
            "We'll use Celery for the background jobs.",
            "decision",
            "Decided to use Celery for the background jobs",
        ),
        ("I chose FastAPI over Flask.", "decision", "Chose FastAPI over Flask"),
        ("We switched from MySQL to PostgreSQL.", "decision", "Switched from MySQL to PostgreSQL"),
        ("I'm a data scientist at a small startup.", "profile", "Is a data scientist"),
        ("I work as a backend engineer.", "profile", "Works as a backend engineer"),
        (
            "Turns out the cache key ignored the locale.",
            "discovery",
            "Found that the cache key ignored the locale",
        ),
        (
            "I found that the retry loop swallowed errors.",
            "discovery",
            "Found that the retry loop swallowed errors",
        ),
        (
            "The bug was a missing await in the retry loop.",
            "discovery",
            "Bug was a missing await in the retry loop",
        ),
        ("The fix was pinning urllib3 to 1.26.", "discovery", "Fix was pinning urllib3 to 1.26"),
        (
            "TIL pytest can run tests in parallel.",
            "discovery",
            "Learned pytest can run tests in parallel",
        ),
        (
            "Every time I deploy, I run the smoke tests.",
            "pattern",
            "Runs the smoke tests every time they deploy",
        ),
        (
            "Whenever the build fails, check the lockfile.",
            "pattern",
            "Check the lockfile whenever the build fails",
        ),
        (
            "I usually write the tests before the code.",
            "pattern",
            "Usually writes the tests before the code",
        ),
        (
            "I always run the linter before committing.",
            "pattern",
            "Always runs the linter before committing",
        ),
    ],
)
def test_cue_gives_type_and_title(sentence: str, type_: str, title: str) -> None:
    note = one(sentence)
    assert (note.type, note.title) == (type_, title)
    assert sentence in note.body
    assert 0.5 <= note.confidence <= 0.9


@pytest.mark.parametrize(
    ("sentence", "title", "topic_key"),
    [
        ("My name is Alice Smith.", "Name is Alice Smith", "profile/name"),
        ("my name's bob", "Name is Bob", "profile/name"),
        ("I live in Berlin with my partner.", "Lives in Berlin", "profile/location"),
        ("I'm based in Lisbon.", "Based in Lisbon", "profile/location"),
        ("I work at Acme Corp as a data engineer.", "Works at Acme Corp", "profile/employer"),
        ("I work as a backend engineer.", "Works as a backend engineer", "profile/role"),
        ("I'm a vegetarian.", "Is a vegetarian", None),
        ("I live in the Netherlands.", "Lives in the Netherlands", "profile/location"),
        ("I work for the NHS.", "Works at the NHS", "profile/employer"),
    ],
)
def test_profile_facts_get_stable_topic_keys(
    sentence: str, title: str, topic_key: str | None
) -> None:
    note = one(sentence)
    assert (note.type, note.title, note.topic_key) == ("profile", title, topic_key)


@pytest.mark.parametrize(
    "sentence",
    [
        "I live in the terminal most days.",
        "I work for hours without a break.",
        "I'm working for a few weeks on the parser.",
        "I live in my editor.",
    ],
)
def test_what_names_no_place_or_employer_never_takes_those_keys(sentence: str) -> None:
    """Under a fixed profile key, a sentence that names no place or employer would replace
    the real location ("Lives in Lisbon") or employer."""
    notes = offline_extract(said(sentence), 10, TYPES)
    assert not [n for n in notes if n.topic_key in ("profile/location", "profile/employer")]


def test_two_facts_in_one_sentence() -> None:
    notes = offline_extract(said("my name is bob and i work at acme"), 10, TYPES)
    assert {(n.title, n.topic_key) for n in notes} == {
        ("Name is Bob", "profile/name"),
        ("Works at Acme", "profile/employer"),
    }


def test_topics_are_salient_lowercase_words() -> None:
    note = one("I prefer tabs over spaces for Python code.")
    assert note.topics == ["tabs", "spaces", "python", "code"]
    many = one("We decided to use PostgreSQL with pgvector, TimescaleDB and PostGIS extensions.")
    assert len(many.topics) <= 5
    assert all(t == t.lower() and t not in {"to", "use", "with", "and"} for t in many.topics)
    assert one("I live in Lisbon.").topics == ["location", "lisbon"]


def test_body_is_the_sentence_with_context() -> None:
    note = one("We decided to use uv because it resolves much faster. It also caches wheels.")
    assert note.body.startswith("We decided to use uv because it resolves much faster.")
    assert "It also caches wheels." in note.body  # a follow-up sentence is context
    assert 'in "Setup" on 2024-05-01' in note.body


@pytest.mark.parametrize(
    "chatter",
    [
        "Hi! How are you today?",
        "I love it, thanks!",
        "I like that.",
        "I'm a bit tired today.",
        "I found that really helpful!",
        "Let's go with that.",
        "I prefer this one.",
        "Thanks, that works.",
        "Sounds good, let's do it.",
        "Do you prefer tabs or spaces?",
        "can you use the approach I prefer",
        "I don't think we decided to use Postgres.",
        "If we decided to use Redis, what would change?",
        "I'd like to book a flight to Paris.",
        "I'm a little confused by this error.",
        "The problem was fixed.",
        "My name is not important.",
        "It turned out to be fine.",
        "I'm a huge fan of your work.",
        "I like the second approach.",
        "```\n# I prefer tabs over spaces\n```",
        "> I prefer tabs over spaces, said my colleague.",
    ],
)
def test_chit_chat_gives_no_notes(chatter: str) -> None:
    assert offline_extract(said(chatter), 10, TYPES) == []


def test_only_user_turns_count() -> None:
    t = Transcript(
        conversation_id="c",
        messages=[
            Message(role="user", content="Can you set up the formatter?"),
            Message(role="assistant", content="I prefer tabs over spaces, so I used tabs."),
            Message(role="system", content="My name is Assistant."),
        ],
    )
    assert offline_extract(t, 10, TYPES) == []


def test_private_and_index_text_never_become_notes() -> None:
    t = said(
        "My name is <private>Zed Secret</private>.",
        '<gleaner-memory-index scope="owner:a">\n- I prefer vim over emacs\n'
        "</gleaner-memory-index>Thanks.",
    )
    assert offline_extract(t, 10, TYPES) == []


def test_types_filter_and_cap() -> None:
    t = said(
        "I prefer tabs over spaces.",
        "We decided to use PostgreSQL.",
        "My name is Alice.",
        "The bug was a race in the cache warmer.",
        "I always run the linter before committing.",
    )
    every = offline_extract(t, 10, TYPES)
    assert sorted(n.type for n in every) == sorted(TYPES)
    assert [n.type for n in offline_extract(t, 10, ("decision",))] == ["decision"]
    assert offline_extract(t, 10, ("summary",)) == []
    capped = offline_extract(t, 2, TYPES)
    assert capped == every[:2]
    assert offline_extract(t, 0, TYPES) == []


def test_sorted_by_confidence_and_hedges_lower_it() -> None:
    t = said(
        "I like Go.", "Maybe I prefer dark mode.", "My name is Alice.", "I prefer light fonts."
    )
    notes = offline_extract(t, 10, TYPES)
    confidences = [n.confidence for n in notes]
    assert confidences == sorted(confidences, reverse=True)
    by_title = {n.title: n.confidence for n in notes}
    assert by_title["Name is Alice"] == 0.9
    assert by_title["Prefers dark mode"] < by_title["Prefers light fonts"]


def test_near_identical_statements_are_one_note() -> None:
    t = said(
        "I prefer tabs over spaces.",
        "As I said, I really prefer tabs over spaces!",
        "I prefer tabs over spaces.",
    )
    notes = offline_extract(t, 10, TYPES)
    assert [n.title for n in notes] == ["Prefers tabs over spaces"]
    assert notes[0].confidence == 0.9  # said three times: surer than once (0.85)


def test_a_corrected_profile_fact_keeps_the_latest() -> None:
    notes = offline_extract(said("I live in Berlin.", "I live in Munich now."), 10, TYPES)
    assert [(n.title, n.topic_key) for n in notes] == [("Lives in Munich", "profile/location")]
    assert notes[0].confidence == 0.85  # a correction, not a repeat
    again = offline_extract(said("I live in Berlin.", "I live in berlin."), 10, TYPES)
    assert [(n.title, n.confidence) for n in again] == [("Lives in Berlin", 0.9)]


def test_deterministic() -> None:
    t = read_path(EXAMPLES / "native.json").transcripts[0]
    first = offline_extract(t, 10, TYPES)
    assert first
    assert all(offline_extract(t, 10, TYPES) == first for _ in range(3))


def test_examples_each_yield_two_to_four_good_notes() -> None:
    for path in iter_paths([EXAMPLES]):
        for t in read_path(path, default_owner="example-owner").transcripts:
            notes = offline_extract(t, 10, TYPES)
            assert 2 <= len(notes) <= 4, (t.conversation_id, notes)
            for note in notes:
                assert note.type in TYPES
                assert 0.5 <= note.confidence <= 0.9
                assert 1 <= len(note.topics) <= 5
                assert "[REDACTED]" not in note.title + note.body
                assert len(note.title) <= 90


def test_example_notes_are_the_expected_ones() -> None:
    (t,) = read_path(EXAMPLES / "native.json").transcripts
    titles = {(n.type, n.title) for n in offline_extract(t, 10, TYPES)}
    assert titles == {
        ("preference", "Prefers tabs over spaces"),
        ("profile", "Based in Lisbon"),
        ("decision", "Decided to use uv instead of pip-tools for the lockfiles"),
    }
    chatgpt = read_path(EXAMPLES / "chatgpt-export" / "conversations.json").transcripts[0]
    chatgpt_titles = [n.title for n in offline_extract(chatgpt, 10, TYPES)]
    assert "Decided to go with FastAPI and a small React admin instead" in chatgpt_titles
    assert not any("Django and its built-in admin" in title for title in chatgpt_titles)
