"""Time order: a note's live text is the latest fact by when it was said, never merely the
latest write; an older conversation's version goes into history at its place in time. On
both databases, through the harvest (a scripted model) and a folder import."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gleaner.harvest.job import harvest_transcript
from gleaner.harvest.transcript import Message, Transcript
from gleaner.store import Scope, Store
from tests.llm_server import LLMServer, answer, llm_server, note

ALICE = Scope.owner("alice")
LIVE = datetime(2026, 3, 1, tzinfo=UTC)
OLD = datetime(2023, 5, 1, tzinfo=UTC)


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with llm_server() as running:
        yield running


def model_store(make_store, backend: str, server: LLMServer) -> Store:  # type: ignore[no-untyped-def]
    return make_store(  # type: ignore[no-any-return]
        backend,
        harvest_model="openai/test-model",
        harvest_api_base=server.api_base,
        harvest_api_key="k",
        harvest_timeout_seconds=5,
        harvest_max_attempts=1,
    )


def chat(cid: str, when: datetime, line: str) -> Transcript:
    return Transcript(
        conversation_id=cid,
        owner="alice",
        ended_at=when,
        messages=[Message(role="user", content=line), Message(role="assistant", content="Ok.")],
    )


def city(title: str, *, update: bool = False) -> dict[str, object]:
    """The model's note of where the user lives; ``update``: marked as the update of the
    one note it was shown (``n1``), as a model judging it so answers."""
    marks = {"mark": "update", "ref": "n1"} if update else {}
    return note(
        title, type="profile", body=f"The user {title.lower()}.", topic_key="profile/city", **marks
    )


@pytest.mark.parametrize("live_first", [True, False])
def test_the_newest_said_fact_is_live_whatever_arrives_last(
    make_store, backend: str, server: LLMServer, live_first: bool
) -> None:
    store = model_store(make_store, backend, server)
    paris = (chat("live", LIVE, "I live in Paris now."), city("Lives in Paris"))
    berlin = (chat("old-export", OLD, "I live in Berlin."), city("Lives in Berlin"))
    for n, (transcript, item) in enumerate((paris, berlin) if live_first else (berlin, paris)):
        # The second conversation's model was shown the first note, and marks the update.
        server.script(answer([{**item, "mark": "update", "ref": "n1"} if n else item]))
        assert harvest_transcript(store, transcript).status == "harvested"
    note_ = store.read(ALICE, "profile-city").memory
    assert note_.title == "Lives in Paris"
    assert note_.said_at == LIVE and note_.conversation_id == "live"
    (older,) = store.history(ALICE, "profile-city")
    assert (older.title, older.occurred_at, older.written_conversation_id) == (
        "Lives in Berlin",
        OLD,
        "old-export",
    )
    assert older.reason == ("older_fact" if live_first else "harvest_update")
    assert [h.memory.slug for h in store.search(ALICE, "paris")] == ["profile-city"]
    assert store.search(ALICE, "berlin", limit=5) == [] or all(
        h.backend == "like" for h in store.search(ALICE, "berlin")
    )


def test_history_is_in_the_order_facts_were_said(
    make_store, backend: str, server: LLMServer
) -> None:
    store = model_store(make_store, backend, server)
    for n, (cid, year, town) in enumerate(
        (("c26", 2026, "Paris"), ("c23", 2023, "Berlin"), ("c24", 2024, "Rome"))
    ):
        server.script(answer([city(f"Lives in {town}", update=n > 0)]))
        harvest_transcript(store, chat(cid, datetime(year, 1, 1, tzinfo=UTC), f"I live in {town}."))
    assert store.read(ALICE, "profile-city").memory.title == "Lives in Paris"
    versions = store.history(ALICE, "profile-city")
    assert [v.title for v in versions] == ["Lives in Rome", "Lives in Berlin"]


def test_an_older_restatement_adds_no_history(make_store, backend: str, server: LLMServer) -> None:
    store = model_store(make_store, backend, server)
    for n, (cid, when) in enumerate((("live", LIVE), ("old", OLD))):
        server.script(answer([city("Lives in Paris", update=n > 0)]))
        harvest_transcript(store, chat(cid, when, "I live in Paris."))
    assert store.history(ALICE, "profile-city") == []
    assert store.read(ALICE, "profile-city").memory.said_at == LIVE


def test_a_folder_import_runs_each_owners_conversations_oldest_first(
    make_store, backend: str, server: LLMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written newest first on disk, imported oldest first: the live text is the newest."""
    from gleaner.cli import main

    store = model_store(make_store, backend, server)
    folder = tmp_path / "export"
    folder.mkdir()
    for name, year, town in (("a", 2026, "Paris"), ("b", 2024, "Rome"), ("c", 2023, "Berlin")):
        (folder / f"{name}.json").write_text(
            json.dumps(
                {
                    "conversation_id": f"conv-{year}",
                    "owner": "alice",
                    "ended_at": f"{year}-01-01T00:00:00Z",
                    "messages": [{"role": "user", "content": f"I live in {town}."}],
                }
            )
        )

    def reply(request: dict[str, object]) -> object:
        text_ = json.dumps(request)
        town = next(t for t in ("Paris", "Rome", "Berlin") if f"I live in {t}" in text_)
        return answer([city(f"Lives in {town}", update="- n1 [profile/city]" in text_)])

    server.default = reply
    for name in [k for k in os.environ if k.startswith("GLEANER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("GLEANER_DATABASE_URL", store.database_url)
    monkeypatch.setenv("GLEANER_HARVEST_MODEL", "openai/test-model")
    monkeypatch.setenv("GLEANER_HARVEST_API_BASE", server.api_base)
    monkeypatch.setenv("GLEANER_HARVEST_API_KEY", "k")
    assert main(["harvest", str(folder), "--provenance", "import"]) == 0
    note_ = store.read(ALICE, "profile-city").memory
    assert note_.title == "Lives in Paris"
    versions = store.history(ALICE, "profile-city")
    assert [v.title for v in versions] == ["Lives in Rome", "Lives in Berlin"]
    # Oldest first: each conversation's fact replaced the one before it, none was "older".
    assert {v.reason for v in versions} == {"harvest_update"}
