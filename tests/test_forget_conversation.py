"""Forgetting one conversation: the notes only it supports go (with their postings, terms,
vectors and links), a note it changed gets the text before it back, its history entries,
jobs and ledger rows go, its transcripts stay forgotten, and a harvest of it running during
the forget writes nothing. Another conversation of the owner, and another owner's
conversation with the same id, are left alone."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text

from gleaner.harvest.job import harvest_transcript
from gleaner.harvest.llm import LLMAnswer
from gleaner.harvest.options import ModelOptions
from gleaner.harvest.queue import record_jobs, run_job_here
from gleaner.harvest.transcript import Message, Transcript
from gleaner.store import NotFound, Scope, Store
from gleaner.store.jobs import queue as job_records
from gleaner.store.owners.forget_conversation import RECEIPT
from gleaner.store.recall import vectors
from gleaner.store.schema.models import (
    ForgottenTranscript,
    ImportBatch,
    Job,
    Memory,
    MemoryTerm,
    MemoryVersion,
)
from tests.cli_harness import EXAMPLES, Cli, cli

__all__ = ["cli"]  # the fixture, used by name

OWNER = "ownercv"
SCOPE = Scope.owner(OWNER)
JAN = datetime(2024, 1, 10, 9, 0, tzinfo=UTC)
MAR = datetime(2024, 3, 10, 9, 0, tzinfo=UTC)
MAY = datetime(2024, 5, 10, 9, 0, tzinfo=UTC)

LLM = Callable[..., LLMAnswer]


def chat(cid: str, *lines: str, owner: str = OWNER, at: datetime = JAN) -> Transcript:
    messages = []
    for line in lines:
        messages.append(Message(role="user", content=line))
        messages.append(Message(role="assistant", content="Noted."))
    return Transcript(conversation_id=cid, owner=owner, messages=messages, ended_at=at)


def note(title: str, body: str, *, key: str | None = None, topics: tuple[str, ...] = ()) -> dict:
    return {
        "type": "preference",
        "title": title,
        "body": body,
        "topics": list(topics),
        "confidence": 0.9,
        "topic_key": key,
    }


def answering(*notes: dict) -> LLM:
    """A harvest model that proposes these notes, whatever the conversation: each quotes
    the conversation's first user line, and a keyed one shown the note holding its key marks
    itself that note's update, as a model judging so would."""

    def llm(messages: Any, *, options: ModelOptions) -> LLMAnswer:
        prompt = messages[-1]["content"]
        quote = re.search(r"^User: (.+)$", prompt, re.MULTILINE)
        answered = []
        for item in notes:
            shown = re.search(rf"^- (n\d+) \[{re.escape(str(item['topic_key']))}\]", prompt, re.M)
            marks = {"mark": "update", "ref": shown.group(1)} if shown else {}
            evidence = [{"speaker": "user", "quote": quote.group(1)}] if quote else []
            answered.append({**item, "evidence": evidence, **marks})
        return LLMAnswer(text=json.dumps({"notes": answered}))

    return llm


@pytest.fixture
def model_store(make_store: Any, backend: str) -> Store:
    """A store whose harvests go through a harvest model (the tests' ``llm``)."""
    return make_store(backend, harvest_model="test/model")  # type: ignore[no-any-return]


def harvest(store: Store, transcript: Transcript, llm: LLM) -> None:
    outcome = harvest_transcript(store, transcript, llm=llm)
    assert outcome.status == "harvested", outcome
    assert outcome.notes_written + outcome.notes_updated >= 1


def rows(store: Store, table: str, where: str = "", **params: object) -> int:
    with store.engine.connect() as conn:
        query = f"SELECT count(*) FROM {table}" + (f" WHERE {where}" if where else "")
        return int(conn.execute(text(query), params).scalar_one())


def the_note(store: Store, slug: str) -> Memory:
    with store.transaction() as session:
        found = session.execute(select(Memory).where(Memory.slug == slug)).scalar_one()
        session.expunge(found)
        return found


def embed_all(store: Store, scope: Scope = SCOPE) -> int:
    with store.connection() as conn:
        waiting = vectors.pending(conn, "test-embed", scope=scope)
        return vectors.save(conn, "test-embed", waiting, [[1.0, 0.0]] * len(waiting))


def found(store: Store, query: str, scope: Scope = SCOPE) -> list[str]:
    return [hit.memory.slug for hit in store.search(scope, query)]


# --- a note only the conversation supports ------------------------------------------------


def test_a_note_only_the_conversation_supports_is_gone_with_everything_it_had(
    model_store: Store,
) -> None:
    store = model_store
    harvest(
        store,
        chat("c-solo", "I keep a ferret named Quokkazed."),
        answering(
            note("Keeps a ferret named Quokkazed", "The user keeps a ferret named Quokkazed.")
        ),
    )
    harvest(
        store,
        chat("c-other", "I drink oolong tea."),
        answering(note("Drinks oolong tea", "The user drinks oolong tea every morning.")),
    )
    ferret = next(n for n in store.list_notes(SCOPE) if "ferret" in n.title.lower())
    tea = next(n for n in store.list_notes(SCOPE) if "oolong" in n.title.lower())
    store.link(SCOPE, ferret.slug, tea.slug, "related")
    assert embed_all(store) == 2
    assert found(store, "quokkazed") == [ferret.slug]

    counts = store.forget_conversation(OWNER, "c-solo")

    assert list(counts) == list(RECEIPT)
    assert counts["notes_deleted"] == 1 and counts["notes_restored"] == 0
    assert (counts["links"], counts["vectors"], counts["ledger"], counts["tombstones"]) == (
        1,
        1,
        1,
        1,
    )
    assert store.get(SCOPE, ferret.slug) is None
    assert found(store, "quokkazed") == [] and found(store, "ferret") == []
    for table in ("search_postings", "memory_terms", "memory_links"):
        assert rows(store, table, f"{_id_column(table)} = :id", id=ferret.id) == 0
    assert rows(store, "memory_vectors", "memory_id = :id", id=ferret.id) == 0
    # The other conversation's note, its index rows and its vector stay.
    assert store.get(SCOPE, tea.slug) is not None and found(store, "oolong") == [tea.slug]
    assert rows(store, "memory_vectors", "memory_id = :id", id=tea.id) == 1
    assert rows(store, "harvest_ledger", "conversation_id = 'c-other'") == 1


def _id_column(table: str) -> str:
    return "from_id" if table == "memory_links" else "memory_id"


# --- a note two conversations support ------------------------------------------------------


def two_writers(store: Store) -> str:
    """A note conversation A (January) wrote and conversation B (March) rewrote through the
    same topic key; its slug."""
    harvest(
        store,
        chat("c-a", "I live in Zurichvale.", at=JAN),
        answering(note("Lives in Zurichvale", "The user lives in Zurichvale.", key="home/city")),
    )
    harvest(
        store,
        chat("c-b", "I moved to Lisbontown.", at=MAR),
        answering(note("Lives in Lisbontown", "The user moved to Lisbontown.", key="home/city")),
    )
    (slug,) = [n.slug for n in store.list_notes(SCOPE)]
    live = the_note(store, slug)
    assert live.conversation_id == "c-b" and "Lisbontown" in live.body
    (earlier,) = store.history(SCOPE, slug)
    assert earlier.written_conversation_id == "c-a" and earlier.changed_conversation_id == "c-b"
    return slug


def test_forgetting_the_later_conversation_restores_the_earlier_text(model_store: Store) -> None:
    store = model_store
    slug = two_writers(store)
    with store.transaction() as session:  # A's text as it was written, evidence and all
        session.execute(
            MemoryVersion.__table__.update().values(
                evidence=[{"speaker": "user", "quote": "I live in Zurichvale."}]
            )
        )
    before = the_note(store, slug)
    assert embed_all(store) == 1

    counts = store.forget_conversation(OWNER, "c-b")

    assert counts["notes_restored"] == 1 and counts["notes_deleted"] == 0
    assert counts["versions"] == 1 and counts["vectors"] == 1 and counts["ledger"] == 1
    live = the_note(store, slug)
    assert (live.title, live.body) == ("Lives in Zurichvale", "The user lives in Zurichvale.")
    assert live.conversation_id == "c-a" and live.occurred_at is not None
    assert live.occurred_at.replace(tzinfo=UTC) == JAN
    assert live.evidence == [{"speaker": "user", "quote": "I live in Zurichvale."}]
    assert live.provenance == "compaction" and live.topic_key == "home/city"
    assert live.updated_seq > before.updated_seq  # the scope's fingerprint changes
    assert store.history(SCOPE, slug) == []
    # The search index and the term index follow the text; the vector is made again.
    assert found(store, "lisbontown") == [] and found(store, "zurichvale") == [slug]
    with store.transaction() as session:
        terms = session.execute(
            select(MemoryTerm.term).where(MemoryTerm.memory_id == live.id)
        ).scalars()
        assert "zurichval" in " ".join(terms) and live.term_count >= 1
    assert rows(store, "memory_vectors") == 0 and embed_all(store) == 1
    # What the writer keeps in step with the text is what it would have written.
    from gleaner.store.text import content_hash

    assert live.content_hash == content_hash(live.body)


def test_forgetting_the_earlier_conversation_keeps_the_later_text(model_store: Store) -> None:
    store = model_store
    slug = two_writers(store)
    counts = store.forget_conversation(OWNER, "c-a")
    assert counts["versions"] == 1 and counts["notes_restored"] == 0
    assert counts["notes_deleted"] == 0 and counts["ledger"] == 1
    live = the_note(store, slug)
    assert live.conversation_id == "c-b" and "Lisbontown" in live.body
    assert store.history(SCOPE, slug) == []
    assert found(store, "zurichvale") == [] and found(store, "lisbontown") == [slug]


def test_the_latest_fact_by_when_it_was_said_is_restored(model_store: Store) -> None:
    # A (May) then B (January, harvested later) wrote the key's note, then C rewrote it:
    # forgetting C gives back A's text, the latest fact, not B's, the latest write.
    store = model_store
    for cid, city, at in (("c-may", "Osloville", MAY), ("c-jan", "Romeburg", JAN)):
        harvest(
            store,
            chat(cid, f"I live in {city}.", at=at),
            answering(note(f"Lives in {city}", f"The user lives in {city}.", key="home/city")),
        )
    harvest(
        store,
        chat("c-late", "I live in Parisford.", at=MAR),
        answering(note("Lives in Parisford", "The user lives in Parisford.", key="home/city")),
    )
    (slug,) = [n.slug for n in store.list_notes(SCOPE)]
    store.forget_conversation(OWNER, "c-late")
    assert the_note(store, slug).title == "Lives in Osloville"
    # The other writer's text stays in history.
    assert [v.title for v in store.history(SCOPE, slug)] == ["Lives in Romeburg"]


def test_a_person_written_version_counts_as_another_writers(store: Store) -> None:
    with store.transaction() as session:
        from gleaner.store.notes import notes

        notes.write(session, store.settings, SCOPE, {"title": "Editor", "body": "Uses vim."})
        notes.write(
            session,
            store.settings,
            SCOPE,
            {"title": "Editor", "body": "Uses emacs.", "slug": "editor"},
            conversation_id="c-x",
        )
    store.forget_conversation(OWNER, "c-x")
    live = the_note(store, "editor")
    assert live.body == "Uses vim." and live.conversation_id is None
    assert live.provenance == "agent"


def test_history_the_conversation_wrote_goes_from_every_note(store: Store) -> None:
    # A wrote, X rewrote, B rewrote: forgetting X drops X's text from history and keeps A's
    # (which X replaced: the text is A's) and B's live text.
    from gleaner.store.notes import notes

    with store.transaction() as session:
        for cid, body in (("c-a", "Uses vim."), ("c-x", "Uses nano."), ("c-b", "Uses emacs.")):
            notes.write(
                session,
                store.settings,
                SCOPE,
                {"title": "Editor", "body": body, "slug": "editor"},
                conversation_id=cid,
            )
    counts = store.forget_conversation(OWNER, "c-x")
    assert (counts["versions"], counts["notes_restored"], counts["notes_deleted"]) == (1, 0, 0)
    assert the_note(store, "editor").body == "Uses emacs."
    assert [v.body for v in store.history(SCOPE, "editor")] == ["Uses vim."]
    assert found(store, "nano") == []


def test_a_note_a_deleted_note_superseded_is_live_again(store: Store) -> None:
    store.write(SCOPE, {"title": "Old plan", "body": "Ship in June.", "slug": "old"})
    store.write(
        SCOPE, {"title": "New plan", "body": "Ship in May.", "slug": "new"}, conversation_id="c-x"
    )
    store.link(SCOPE, "new", "old", "supersedes")
    assert the_note(store, "old").status == "superseded"
    counts = store.forget_conversation(OWNER, "c-x")
    assert (counts["notes_deleted"], counts["notes_revived"], counts["links"]) == (1, 1, 1)
    old = the_note(store, "old")
    assert old.status == "live" and old.superseded_by_id is None
    assert found(store, "june") == ["old"]


# --- jobs, ledger, tombstones -----------------------------------------------------------


def test_the_forgotten_transcript_submitted_again_writes_nothing(model_store: Store) -> None:
    store = model_store
    llm = answering(note("Keeps a ferret named Quokkazed", "A ferret named Quokkazed."))
    first = chat("c-solo", "I keep a ferret named Quokkazed.")
    harvest(store, first, llm)
    store.forget_conversation(OWNER, "c-solo")

    again = harvest_transcript(store, first, llm=llm)
    assert again.status == "skipped" and again.notes_written == 0 and again.model_calls == 0
    assert store.fingerprint(SCOPE)[0] == 0
    # Through a recorded job, as Gleaner.submit and the workers run it: the same.
    (job_id,) = record_jobs(store, [first], owner=None, provenance="compaction", queue="harvest")
    result = run_job_here(store, job_id)
    assert result is not None and result["status"] == "skipped"
    assert store.fingerprint(SCOPE)[0] == 0
    # The conversation went on: a new transcript of it is harvested, as after an owner's
    # forget (forget it again to drop that too).
    went_on = chat("c-solo", "I keep a ferret named Quokkazed.", "It likes grapes.")
    assert harvest_transcript(store, went_on, llm=llm).status == "harvested"


def test_its_jobs_go_with_their_transcripts_and_leave_tombstones(store: Store) -> None:
    waiting = chat("c-wait", "We decided to adopt Kotlin.")
    other = chat("c-keep", "We decided to adopt Rust.")
    with store.transaction() as session:
        batch = job_records.create_import(
            session, source="/exports/x.zip", owner=OWNER, provenance="import"
        )
    record_jobs(
        store, [waiting, other], owner=None, provenance="import", queue="import", import_id=batch
    )
    counts = store.forget_conversation(OWNER, "c-wait")
    assert (counts["jobs"], counts["tombstones"], counts["ledger"]) == (1, 1, 0)
    with store.transaction() as session:
        left = session.execute(select(Job.conversation_id)).scalars().all()
        total = session.execute(select(ImportBatch.total)).scalar_one()
        assert left == ["c-keep"] and total == 1  # the import is finished once c-keep is
        assert (
            session.execute(select(func.count()).select_from(ForgottenTranscript)).scalar_one() == 1
        )
    again = harvest_transcript(store, waiting)
    assert again.status == "skipped" and store.fingerprint(SCOPE)[0] == 0


def test_another_owners_conversation_with_the_same_id_is_untouched(model_store: Store) -> None:
    store = model_store
    bob = Scope.owner("bob")
    llm = answering(note("Keeps a ferret named Quokkazed", "A ferret named Quokkazed."))
    harvest(store, chat("c-same", "I keep a ferret.", owner=OWNER), llm)
    harvest(store, chat("c-same", "I keep a ferret.", owner="bob"), llm)
    store.forget_conversation(OWNER, "c-same")
    assert store.fingerprint(SCOPE)[0] == 0
    assert found(store, "quokkazed", bob) != []
    assert rows(store, "harvest_ledger", "scope_id = 'bob'") == 1
    assert rows(store, "forgotten_transcripts") == 1  # the owner's transcript, not Bob's
    assert store.forget_conversation("bob", "c-same")["notes_deleted"] == 1


def test_an_unknown_conversation_is_not_found_and_nothing_changes(store: Store) -> None:
    store.write(SCOPE, {"title": "Kept", "body": "kept"}, conversation_id="c-1")
    before = store.fingerprint(SCOPE)
    with pytest.raises(NotFound, match="no conversation"):
        store.forget_conversation(OWNER, "c-404")
    with pytest.raises(NotFound):
        store.forget_conversation("bob", "c-1")  # another owner's id
    assert store.fingerprint(SCOPE) == before
    assert rows(store, "forgotten_conversations") == 0
    store.forget_conversation(OWNER, "c-1")
    with pytest.raises(NotFound):  # forgotten already: nothing names it any more
        store.forget_conversation(OWNER, "c-1")


@pytest.mark.parametrize("bad", ["", "   ", "a\x00b", "x" * 256])
def test_a_bad_conversation_id_is_refused(store: Store, bad: str) -> None:
    from gleaner.store import InvalidInput

    with pytest.raises(InvalidInput):
        store.forget_conversation(OWNER, bad)


# --- races ------------------------------------------------------------------------------


def test_a_harvest_of_the_conversation_running_during_the_forget_writes_nothing(
    model_store: Store,
) -> None:
    store = model_store
    harvest(store, chat("c-live", "I keep a ferret."), answering(note("Keeps a ferret", "Ferret.")))

    def forgetting(messages: Any, *, options: ModelOptions) -> LLMAnswer:
        store.forget_conversation(OWNER, "c-live")  # while the model is thinking
        return LLMAnswer(text=json.dumps({"notes": [note("Likes grapes", "Grapes.")]}))

    went_on = chat("c-live", "I keep a ferret.", "It likes grapes.")
    report = harvest_transcript(store, went_on, llm=forgetting)
    assert report.status == "skipped" and report.notes_written == 0
    assert report.model_calls == 1
    assert store.fingerprint(SCOPE)[0] == 0 and rows(store, "harvest_ledger") == 0


def test_a_harvest_of_another_conversation_during_the_forget_still_writes(
    model_store: Store,
) -> None:
    store = model_store
    harvest(store, chat("c-gone", "I keep a ferret."), answering(note("Keeps a ferret", "Ferret.")))

    def forgetting(messages: Any, *, options: ModelOptions) -> LLMAnswer:
        store.forget_conversation(OWNER, "c-gone")
        oolong = {
            **note("Drinks oolong", "Oolong tea."),
            "evidence": [{"speaker": "user", "quote": "I drink oolong."}],
        }
        return LLMAnswer(text=json.dumps({"notes": [oolong]}))

    report = harvest_transcript(store, chat("c-stays", "I drink oolong."), llm=forgetting)
    assert report.status == "harvested" and report.notes_written == 1
    assert found(store, "oolong") != [] and found(store, "ferret") == []


def test_the_forget_is_one_transaction(model_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # A failure after the first deletes leaves everything as it was.
    from gleaner.store.owners import forget_conversation

    store = model_store
    slug = two_writers(store)

    def broken(session: Any) -> None:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(forget_conversation, "scrub_housekeeping", broken)
    with pytest.raises(RuntimeError):
        store.forget_conversation(OWNER, "c-b")
    assert "Lisbontown" in the_note(store, slug).body and len(store.history(SCOPE, slug)) == 1
    assert rows(store, "harvest_ledger") == 2 and rows(store, "forgotten_conversations") == 0


# --- the surfaces: Python API, command line, HTTP ---------------------------------------


def test_the_python_api_forgets_one_conversation_of_the_owner(store: Store) -> None:
    from gleaner import Gleaner, InvalidRequest
    from gleaner import NotFound as ApiNotFound
    from tests.samples import native

    gleaner = Gleaner(store=store)
    gleaner.submit(native(1, owner="alice"))
    gleaner.submit(native(2, owner="alice"))
    gleaner.submit(native(1, owner="bob"))  # the same conversation id, another owner
    counts = gleaner.forget_conversation("alice", "conv-1")
    assert counts["notes_deleted"] == 3 and counts["jobs"] == 1 and counts["ledger"] == 1
    assert gleaner.search("alice", "keymap1") == [] and gleaner.search("alice", "keymap2")
    assert gleaner.search("bob", "keymap1")
    again = gleaner.job(gleaner.submit(native(1, owner="alice")))
    assert again.state == "done" and again.notes_written == 0
    with pytest.raises(ApiNotFound) as missing:
        gleaner.forget_conversation("alice", "conv-404")
    assert missing.value.reason == "not_found"
    with pytest.raises(InvalidRequest):
        gleaner.forget_conversation("alice\u200b", "conv-2")  # the owner rule


def test_the_command_forgets_one_conversation_and_prints_a_receipt(cli: Any, tmp_path: Any) -> None:
    from tests.cli_harness import EXAMPLES

    cli.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/forget.db")
    harvested = cli("harvest", str(EXAMPLES / "native.json"), "--json")
    assert harvested.code == 0 and harvested.json()["notes_written"] >= 1
    conversation = "2024-05-14-editor-setup"
    hits = cli("search", "tabs", "--owner", "alice", "--json").json()
    assert hits

    alone = cli("forget", "--conversation", conversation)
    assert alone.code == 2 and "--owner" in alone.err
    reharvest = cli(
        "forget", "--owner", "alice", "--conversation", conversation, "--allow-reharvest"
    )
    assert reharvest.code == 2 and "--allow-reharvest" in reharvest.err
    unknown = cli("forget", "--owner", "alice", "--conversation", "no-such-chat")
    assert unknown.code == 1 and "not_found" in unknown.err
    other = cli("forget", "--owner", "bob", "--conversation", conversation)
    assert other.code == 1 and "not_found" in other.err
    assert cli("search", "tabs", "--owner", "alice", "--json").json() == hits  # nothing changed

    forgot = cli("forget", "--owner", "alice", "--conversation", conversation, "--json")
    assert forgot.code == 0, forgot.err
    receipt = forgot.json()
    assert receipt["owner"] == "alice" and receipt["conversation_id"] == conversation
    assert list(receipt["counts"]) == list(RECEIPT)
    assert receipt["counts"]["notes_deleted"] == harvested.json()["notes_written"]
    assert receipt["counts"]["ledger"] == 1 and receipt["counts"]["tombstones"] == 1
    assert cli("search", "tabs", "--owner", "alice", "--json").json() == []
    again = cli("harvest", str(EXAMPLES / "native.json"), "--json")
    assert again.code == 0 and again.json()["notes_written"] == 0
    gone = cli("forget", "--owner", "alice", "--conversation", conversation)
    assert gone.code == 1 and "not_found" in gone.err


def test_the_command_prints_the_counts_as_text(cli: Cli, tmp_path: Path) -> None:
    cli.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/forget.db")
    assert cli("harvest", str(EXAMPLES / "native.json")).code == 0
    forgot = cli("forget", "--owner", "alice", "--conversation", "2024-05-14-editor-setup")
    assert forgot.code == 0, forgot.err
    lines = forgot.out.splitlines()
    assert lines[0] == "conversation '2024-05-14-editor-setup' of 'alice' forgotten:"
    assert [line.split()[0] for line in lines[1:]] == list(RECEIPT)


def test_the_http_route_forgets_a_conversation_whose_id_holds_a_slash(tmp_path: Path) -> None:
    # The app in process on a real SQLite file (the slow tier runs it under uvicorn).
    from urllib.parse import quote

    from fastapi.testclient import TestClient

    from gleaner import Gleaner
    from gleaner.service.http import create_app
    from tests.conftest import test_settings
    from tests.samples import native

    gleaner = Gleaner(f"sqlite:///{tmp_path / 'http.db'}", settings=test_settings())
    gleaner.migrate()
    chat = {**native(3, owner="team/alice"), "conversation_id": "chats/42 é"}
    gleaner.submit(chat)
    gleaner.submit(native(3, owner="bob"))
    _, alices = gleaner.create_api_key("team/alice")
    _, bobs = gleaner.create_api_key("bob")
    path = f"/v1/owners/{quote('team/alice', safe='')}/conversations/{quote('chats/42 é', safe='')}"
    with TestClient(create_app(gleaner)) as client:
        refused = client.delete(path, headers={"Authorization": f"Bearer {bobs}"})
        assert refused.status_code == 403
        done = client.delete(path, headers={"Authorization": f"Bearer {alices}"})
        assert done.status_code == 200, done.text
        body = done.json()
        assert body["owner"] == "team/alice" and body["conversation_id"] == "chats/42 é"
        assert body["counts"]["notes_deleted"] == 3 and body["counts"]["jobs"] == 1
        missing = client.delete(path, headers={"Authorization": f"Bearer {alices}"})
        assert missing.status_code == 404 and missing.json()["error"]["reason"] == "not_found"
        bad = path.rsplit("/", 1)[0] + "/%FF"
        response = client.delete(bad, headers={"Authorization": f"Bearer {alices}"})
        assert response.status_code == 422
        assert response.json()["error"]["reason"] == "bad_conversation_id"
    assert gleaner.search("bob", "keymap3")  # bob's conv-3 stays
    gleaner.close()


# --- nothing of it stays ------------------------------------------------------------------

MARKER = "zanzibarquux"  # a word only the forgotten conversation holds


def test_no_table_holds_the_forgotten_conversations_words(store: Store) -> None:
    from tests.test_forget import MARKER_TAIL, every_value

    line = f"I prefer {MARKER} tabs over spaces in every repo."
    (done,) = record_jobs(
        store, [chat("c-secret", line)], owner=None, provenance="compaction", queue="harvest"
    )
    assert run_job_here(store, done) is not None
    record_jobs(  # a transcript of it still waiting
        store,
        [chat("c-secret", line, "And more.")],
        owner=None,
        provenance="compaction",
        queue="harvest",
    )
    store.write(
        SCOPE, {"title": f"Uses {MARKER} daily", "body": MARKER}, conversation_id="c-secret"
    )
    store.write(
        SCOPE, {"title": f"Uses {MARKER} daily", "body": MARKER}, conversation_id="c-secret"
    )
    assert store.dedupe().superseded >= 1  # a housekeeping result that names the pair
    harvest_transcript(store, chat("c-kept", "I prefer vim for every repo."))
    assert MARKER in every_value(store)

    counts = store.forget_conversation(OWNER, "c-secret")

    assert counts["jobs"] == 2 and counts["tombstones"] == 2 and counts["notes_deleted"] >= 3
    assert MARKER_TAIL not in every_value(store)
    assert found(store, "vim") != []  # the other conversation's note stays
    if store.dialect == "sqlite":  # the file and its write-ahead log keep no page of it
        url = store.engine.url.database
        assert url is not None
        files = [Path(url), Path(f"{url}-wal")]
        held = b"".join(f.read_bytes() for f in files if f.exists()).lower()
        assert MARKER_TAIL.encode() not in held


@pytest.mark.postgres
def test_a_conversation_forget_committed_before_the_harvest_transaction_is_seen(
    make_store: Any,
) -> None:
    # As for an owner: the forget count the ledger row is written under counts a forget of
    # its conversation committed after the harvest planned, so the row (planned with the
    # old count) is refused and its notes roll back; another conversation's count is
    # unchanged.
    from dataclasses import replace

    from gleaner.store.jobs import ledger
    from gleaner.store.owners import forget
    from tests.test_same_fact import ledger_entry

    harvest, operator = make_store("postgresql"), make_store("postgresql")
    carol = Scope.owner("carol-cv")
    operator.write(carol, {"title": "Said in c1", "body": "x"}, conversation_id="c1")
    operator.forget_conversation(carol.id, "c1")
    with forget.held_off(harvest, carol) as session:
        entry = ledger_entry("d1", "v1")  # of conversation c1
        assert not ledger.record(session, carol, entry, generation=0)
        assert ledger.record(session, carol, entry, generation=1)
    with forget.held_off(harvest, carol) as session:
        other = replace(ledger_entry("d2", "v1"), conversation_id="c2")
        assert ledger.record(session, carol, other, generation=0)
    assert rows(harvest, "harvest_ledger", "scope_id = 'carol-cv'") == 2
