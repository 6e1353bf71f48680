"""A harvest job's round trips to PostgreSQL: each one is paid on every job (with a context
switch to the server and back on both sides), so their number is a budget, and the new
notes going with the COMMIT must still never overwrite or lose a note."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import event, select

from harvest.job import harvest_transcript
from harvest.llm import LLMAnswer
from harvest.options import ModelOptions
from harvest.queue import record_jobs, run_job
from harvest.transcript import Message, Transcript
from store import Scope, Store, ledger, prepared
from store.models import HarvestLedger, Job, Memory
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


def count_trips(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every round trip to the server from now on, by the path that sent it: a pipeline of
    the short path (``prepared._exchange``), one of its single statements (``_run``), or a
    statement of SQLAlchemy's own on the store's engine."""
    trips: list[str] = []
    exchange, run = prepared._exchange, prepared._run

    def pipelined(pgconn: Any, sends: list[Any]) -> Any:
        trips.append(f"pipeline of {len(sends)}")
        return exchange(pgconn, sends)

    def single(*args: Any, **kwargs: Any) -> Any:
        trips.append("statement")
        return run(*args, **kwargs)

    monkeypatch.setattr(prepared, "_exchange", pipelined)
    monkeypatch.setattr(prepared, "_run", single)
    event.listen(store.engine, "before_cursor_execute", lambda *_: trips.append("sqlalchemy"))
    return trips


def test_a_job_writing_new_notes_takes_six_round_trips(
    make_store: Callable[..., Store], server: LLMServer, monkeypatch: pytest.MonkeyPatch
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
    run_job(store, warm)  # connections opened, statements prepared on them
    with store.transaction() as session:  # what the warm job wrote: none of it is a twin
        session.execute(Memory.__table__.delete())
        session.execute(HarvestLedger.__table__.delete())
    trips = count_trips(store, monkeypatch)
    outcome = run_job(store, job)
    assert outcome is not None and outcome["notes_written"] == 3, outcome
    assert trips == [
        "statement",  # the claim
        "pipeline of 2",  # the transcript's lock and the ledger check
        # the owner's notes the transcript bears on, shown to the model: the scope's
        # statistics with the terms' counts (an empty scope: nothing more to search)
        "sqlalchemy",
        # the model call, then one transaction: its BEGIN, the forget lock and count, the
        # slug lookup sent ahead, the same-fact lookup ...
        "pipeline of 5",
        # ... and the notes with their terms, the ledger row, the job's cost should another
        # delivery hold it now (store.jobs.add_cost_if_not_held), its outcome, COMMIT
        "pipeline of 5",
        "statement",  # the unlock
    ]
    with store.transaction() as session:
        assert session.execute(select(Job.state).where(Job.id == job)).scalar_one() == "done"
        assert len(session.execute(select(Memory.id)).all()) == 3


def test_a_slug_taken_before_the_commit_is_written_again_under_the_next_free_slug(
    make_store: Callable[..., Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer takes a new note's slug after the harvest looked it up and before its
    COMMIT: the COMMIT (with the notes) fails on the slug's unique key, nothing of it is
    kept, and the harvest writes again at once under the next free slug; the other note is
    untouched and the transcript is recorded once."""
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

    record = ledger.record
    records: list[str] = []

    def record_after_a_rival(*args: Any, **kwargs: Any) -> bool:
        if not records:  # between the lookup and the COMMIT, the first time only
            store.write(
                ALICE, {"title": "Tea at noon", "body": "Green.", "slug": "prefers-dark-roast"}
            )
        records.append("record")
        return record(*args, **kwargs)

    monkeypatch.setattr(ledger, "record", record_after_a_rival)
    outcome = harvest_transcript(store, chat("c-1", "I like dark roast. I moved."), llm=model)
    assert records == ["record", "record"]  # written twice: the first COMMIT rolled back
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
