"""A harvest decides what to rewrite from reads that take no lock; a person or another writer
may change that note before the harvest's write locks it. The write checks the decision again
on the locked row: a note pinned, person-written or holding other text since is never written
over (the harvest decides again on what is stored now).

PostgreSQL only: SQLite's ``BEGIN IMMEDIATE`` keeps every other writer out of a harvest's
transaction from its start, so nothing can change between the read and the write there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import event, text

from gleaner.harvest.job import harvest_transcript
from gleaner.store import Store
from tests.llm_server import LLMServer, answer, llm_server, note
from tests.test_harvest_job import ALICE, model_settings, transcript

SHORT = note("Likes short answers", body="Wants short answers.")
SAYS_MORE = note("Likes the short answers", body="Wants the short answers, in plain prose.")


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with llm_server() as running:
        yield running


@pytest.fixture
def store(make_store: Any, server: LLMServer) -> Store:
    made: Store = make_store("postgresql", **model_settings(server))
    return made


def before_the_locking_read(store: Store, meanwhile: Callable[[], None]) -> list[str]:
    """Run ``meanwhile`` (committed on a connection of its own) once, just before the harvest
    sends the read that locks the notes it will write over; returns that read's SQL once seen."""
    seen: list[str] = []

    def hook(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if seen or "FROM memories" not in statement or "FOR UPDATE" not in statement:
            return
        seen.append(statement)
        meanwhile()

    event.listen(store.engine, "before_cursor_execute", hook)
    return seen


def change(store: Store, sql: str) -> Callable[[], None]:
    def run() -> None:
        with store.engine.begin() as other:
            other.execute(text(sql))

    return run


def note_row(store: Store, slug: str) -> dict[str, Any]:
    with store.engine.connect() as conn:
        found = conn.execute(
            text("SELECT title, body, pinned, provenance FROM memories WHERE slug = :s"),
            {"s": slug},
        ).one()
    return dict(found._mapping)


def test_a_twin_pinned_by_a_person_meanwhile_is_not_rewritten(
    store: Store, server: LLMServer
) -> None:
    server.script(answer([SHORT]), answer([SAYS_MORE]))
    harvest_transcript(store, transcript("short please", cid="c1"))
    pin = "UPDATE memories SET pinned = true WHERE slug = 'likes-short-answers'"
    seen = before_the_locking_read(store, change(store, pin))
    report = harvest_transcript(store, transcript("short and plain", cid="c2"))
    assert seen  # the person's pin landed between the harvest's read and its locking read
    assert (report.notes_written, report.notes_updated, report.notes_skipped) == (0, 0, 1)
    assert note_row(store, "likes-short-answers") == {
        "title": "Likes short answers",
        "body": "Wants short answers.",
        "pinned": True,
        "provenance": "compaction",
    }
    assert store.history(ALICE, "likes-short-answers") == []


def test_a_twin_rewritten_meanwhile_with_another_fact_keeps_it(
    store: Store, server: LLMServer
) -> None:
    server.script(answer([SHORT]), answer([SAYS_MORE]))
    harvest_transcript(store, transcript("short please", cid="c1"))
    other = (
        "UPDATE memories SET body = 'Wants long, detailed answers.' "
        "WHERE slug = 'likes-short-answers'"
    )
    seen = before_the_locking_read(store, change(store, other))
    report = harvest_transcript(store, transcript("short and plain", cid="c2"))
    assert seen
    # Decided again on the stored text: "long" against "short" is another fact, so the
    # candidate is a note of its own and the other writer's text stays.
    assert (report.notes_written, report.notes_updated) == (1, 0)
    assert note_row(store, "likes-short-answers")["body"] == "Wants long, detailed answers."
    assert note_row(store, "likes-the-short-answers")["body"] == SAYS_MORE["body"]


def test_a_keyed_note_pinned_by_a_person_meanwhile_is_not_rewritten(
    store: Store, server: LLMServer
) -> None:
    key = "preference/answer-length"
    server.script(
        answer([note("Short answers", body="Wants short answers.", topic_key=key)]),
        # The model was shown the note (n1) and marks the change an update of it.
        answer(
            [
                note(
                    "Long answers",
                    body="Wants long answers now.",
                    topic_key=key,
                    mark="update",
                    ref="n1",
                )
            ]
        ),
    )
    harvest_transcript(store, transcript("short please", cid="c1"))
    pin = f"UPDATE memories SET pinned = true WHERE topic_key = '{key}'"
    seen = before_the_locking_read(store, change(store, pin))
    report = harvest_transcript(store, transcript("long now", cid="c2"))
    assert seen
    assert (report.notes_written, report.notes_updated, report.notes_skipped) == (0, 0, 1)
    kept = note_row(store, "preference-answer-length")
    assert (kept["body"], kept["pinned"]) == ("Wants short answers.", True)


def test_an_unchanged_twin_is_still_rewritten_in_one_go(store: Store, server: LLMServer) -> None:
    server.script(answer([SHORT]), answer([SAYS_MORE]))
    harvest_transcript(store, transcript("short please", cid="c1"))
    calls: list[str] = []
    seen = before_the_locking_read(store, lambda: calls.append("locking read"))
    report = harvest_transcript(store, transcript("short and plain", cid="c2"))
    assert seen and calls == ["locking read"]
    assert (report.notes_written, report.notes_updated) == (0, 1)
    assert note_row(store, "likes-short-answers")["body"] == SAYS_MORE["body"]


def test_a_keyed_note_superseded_by_a_person_meanwhile_is_not_rewritten(
    store: Store, server: LLMServer
) -> None:
    key = "preference/answer-length"
    server.script(
        answer([note("Short answers", body="Wants short answers.", topic_key=key)]),
        # The model was shown the note (n1) and marks the change an update of it.
        answer(
            [
                note(
                    "Long answers",
                    body="Wants long answers now.",
                    topic_key=key,
                    mark="update",
                    ref="n1",
                )
            ]
        ),
    )
    harvest_transcript(store, transcript("short please", cid="c1"))
    store.write(ALICE, {"title": "Answer style", "body": "Answers as bullet lists.", "slug": "b"})
    supersede = (
        "UPDATE memories SET status = 'superseded', "
        "superseded_by_id = (SELECT id FROM memories WHERE slug = 'b') "
        f"WHERE topic_key = '{key}'"
    )
    seen = before_the_locking_read(store, change(store, supersede))
    report = harvest_transcript(store, transcript("long now", cid="c2"))
    assert seen
    # Declared replaced since the harvest read it: skipped, and the note that replaced it
    # (which a mem_save under the key would update) is not rewritten by harvested text.
    assert (report.notes_written, report.notes_updated, report.notes_skipped) == (0, 0, 1)
    assert note_row(store, "b")["body"] == "Answers as bullet lists."
    assert note_row(store, "preference-answer-length")["body"] == "Wants short answers."
