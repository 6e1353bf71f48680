"""A harvest job's statements to PostgreSQL: each one is a round trip paid on every job
(with a context switch to the server and back on both sides), so their number is a budget,
and a note another writer takes the slug of meanwhile must still never be overwritten or
lost."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import event, select

from gleaner.harvest.job import harvest_transcript
from gleaner.harvest.llm import LLMAnswer
from gleaner.harvest.options import ModelOptions
from gleaner.harvest.queue import record_jobs, run_job
from gleaner.harvest.transcript import Message, Transcript
from gleaner.store import Scope, Store
from gleaner.store.notes import write_plan
from gleaner.store.schema.models import HarvestLedger, Job, Memory
from tests.llm_server import LLMServer, answer, llm_server, note

pytestmark = pytest.mark.postgres

ALICE = Scope.owner("alice")


def chat(cid: str, *lines: str) -> Transcript:
    messages = []
    for line in lines:
        messages += [Message(role="user", content=line), Message(role="assistant", content="Ok.")]
    return Transcript(conversation_id=cid, owner="alice", messages=messages)


@pytest.fixture
def server() -> Iterator[LLMServer]:
    notes = [
        note("Uses vim with the dvorak keymap"),
        note("Deploys with ansible on fridays"),
        note("Drinks green tea in the morning"),
    ]
    with llm_server(answer(notes)) as running:
        yield running


def transaction(name: str, sent: list[str]) -> Callable[[Any], None]:
    """A listener noting ``name`` (BEGIN, COMMIT) where the driver sends it: not on an
    autocommit connection, whose statements each commit on their own."""

    def noted(conn: Any) -> None:
        if not conn.connection.driver_connection.autocommit:
            sent.append(name)

    return noted


def count_statements(store: Store) -> list[str]:
    """Every statement SQLAlchemy sends on the store's engine from now on (the first words
    of its SQL), and each transaction's BEGIN and COMMIT: each one a round trip. The
    transcript lock's own two (lock, unlock) go on its dedicated connection, outside."""
    sent: list[str] = []

    def statement(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        sent.append(" ".join(sql.split()[:3]))

    event.listen(store.engine, "before_cursor_execute", statement)
    for name in ("begin", "commit"):
        event.listen(store.engine, name, transaction(name.upper(), sent))
    return sent


def test_a_job_writing_new_notes_sends_a_bounded_number_of_statements(
    make_store: Callable[..., Store], server: LLMServer
) -> None:
    store = make_store(
        "postgresql",
        harvest_model="openai/test-model",
        harvest_api_base=server.api_base,
        harvest_api_key="test-key",
        job_heartbeat_seconds=60,  # no beat during the job
        job_lease_seconds=300,
    )
    warm, job = record_jobs(
        store,
        [chat("warm-1", "I use vim."), chat("job-1", "I use vim and ansible.")],
        owner=None,
        provenance="compaction",
        queue="harvest",
    )
    run_job(store, warm)  # connections opened
    with store.transaction() as session:  # what the warm job wrote: none of it is a twin
        session.execute(Memory.__table__.delete())
        session.execute(HarvestLedger.__table__.delete())
    sent = count_statements(store)
    outcome = run_job(store, job)
    assert outcome is not None and outcome["notes_written"] == 3, outcome
    assert sent == [
        "UPDATE jobs SET",  # the claim, committed on its own (autocommit)
        # under the transcript's lock (taken on its own connection): the ledger check with
        # the keys the model is shown
        "SELECT checked.generation, checked.tombstoned,",
        # the owner's notes the transcript bears on: the terms' counts (an empty scope:
        # nothing more to search)
        "SELECT (SELECT count(*)",
        # the model call, then one transaction: the forget lock, the same-fact lookup, the
        # slugs taken ...
        "BEGIN",
        "SELECT pg_advisory_xact_lock_shared(%(k)s)",
        "SELECT t.term, (SELECT",
        "SELECT memories.slug FROM",
        # ... the notes, their terms and search rows, the ledger row, the job's outcome (its
        # cost is added apart only when another delivery holds the job now:
        # store.jobs.queue.add_cost_if_not_held)
        "INSERT INTO memories",
        "INSERT INTO memory_terms",
        "INSERT INTO search_postings",
        "INSERT INTO harvest_ledger",
        "UPDATE jobs SET",
        "COMMIT",
    ]
    with store.transaction() as session:
        assert session.execute(select(Job.state).where(Job.id == job)).scalar_one() == "done"
        assert len(session.execute(select(Memory.id)).all()) == 3


def test_a_slug_taken_after_the_lookup_is_written_again_under_the_next_free_slug(
    make_store: Callable[..., Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer takes a new note's slug after the harvest looked it up and before its
    INSERT: that note is skipped there (its unique key), and planned again at once under
    the next free slug; the other note is untouched and the transcript is recorded once."""
    store = make_store("postgresql", harvest_model="test/model")
    item = {
        "type": "preference",
        "title": "Prefers dark roast",
        "body": "Dark roast, always.",
        "evidence": [{"speaker": "user", "quote": "I like dark roast."}],
    }
    other = {
        "type": "decision",
        "title": "Moved to Porto",
        "body": "Since May.",
        "evidence": [{"speaker": "user", "quote": "I moved."}],
    }

    def model(messages: Any, *, options: ModelOptions) -> LLMAnswer:
        notes = [{**i, "topics": [], "confidence": 0.9} for i in (item, other)]
        return LLMAnswer(text=json.dumps({"notes": notes}))

    lookup = write_plan.lookup
    lookups: list[str] = []

    def lookup_then_a_rival(*args: Any, **kwargs: Any) -> Any:
        found = lookup(*args, **kwargs)
        lookups.append("lookup")
        if len(lookups) == 1:  # between the lookup and the INSERT, the first time only
            store.write(
                ALICE, {"title": "Tea at noon", "body": "Green.", "slug": "prefers-dark-roast"}
            )
        return found

    monkeypatch.setattr(write_plan, "lookup", lookup_then_a_rival)
    outcome = harvest_transcript(store, chat("c-1", "I like dark roast. I moved."), llm=model)
    # The harvest's, the rival's own, then the harvest's again: planned again, the lost slug.
    assert lookups == ["lookup", "lookup", "lookup"]
    assert outcome.status == "harvested" and outcome.notes_written == 2
    assert sorted(outcome.slugs) == ["moved-to-porto", "prefers-dark-roast-2"]
    with store.transaction() as session:
        found = dict(session.execute(select(Memory.slug, Memory.title)).all())
        assert found == {
            "prefers-dark-roast": "Tea at noon",  # the rival's note, as it wrote it
            "prefers-dark-roast-2": "Prefers dark roast",
            "moved-to-porto": "Moved to Porto",
        }
        assert len(session.execute(select(HarvestLedger.id)).all()) == 1
