"""Text a model server sends that no stored text may hold: a NUL (which JSON carries as
``\\u0000``), a lone surrogate (``\\ud800``), a model name longer than the ledger's column;
and token counts that are no counts (a string, a negative or absurd number).

Before, each made the harvest's write fail on PostgreSQL as a database error, which a worker
retries, paying the model again every time, until the job was failed as ``worker_lost``; or
(a lone surrogate in an error) failed the job with an encoder's message and lost the count of
the call made; a count past the integer columns was a refused value too, and a count that
was no number made the lean client retry a good answer. Now a note holding one is dropped
like any invalid note, the job keeps the server's error and model name with each such
character made U+FFFD, and a count that is no count is 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from gleaner.harvest.candidate import NoteCandidate
from gleaner.harvest.job import harvest_transcript
from gleaner.harvest.queue import record_jobs, run_job
from gleaner.store import Store
from gleaner.store.schema.models import HarvestLedger, Job, Memory
from gleaner.store.text import MODEL_MAX_CHARS, storable
from tests.llm_server import Behaviour, LLMServer, answer, llm_server, note
from tests.test_harvest_job import model_settings, rows, transcript

HOSTILE = ["\u0000", "\ud800"]


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with llm_server() as running:
        yield running


def completion(model: str, notes: list[dict[str, Any]], prompt_tokens: object = 30) -> Behaviour:
    """A chat completion whose ``model`` field is ``model``, as JSON escapes it (each note
    quoting what every conversation here says, "dark roast")."""
    quote = [{"speaker": "user", "quote": "dark roast"}]
    content = json.dumps({"notes": [{"evidence": quote, **n} for n in notes]})
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": content},
            }
        ],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 7},
    }
    return Behaviour(raw_body=json.dumps(body).encode())


def run_one_job(store: Store) -> dict[str, Any] | None:
    """One conversation recorded as a job and run as a worker runs it (in this process)."""
    [job_id] = record_jobs(
        store,
        [transcript("I drink dark roast.")],
        owner=None,
        provenance="compaction",
        queue="harvest",
    )
    return run_job(store, job_id)


def refusal(message: str) -> Behaviour:
    body = {"error": {"message": message, "type": "invalid_request_error"}}
    return Behaviour(status=400, raw_body=json.dumps(body).encode())


@pytest.mark.parametrize("bad", HOSTILE, ids=["nul", "surrogate"])
def test_storable_replaces_what_no_stored_text_may_hold(bad: str) -> None:
    assert storable(f"a{bad}b", 10) == "a\ufffdb"
    assert storable("x" * 20, 10) == "x" * 10


@pytest.mark.parametrize("bad", HOSTILE, ids=["nul", "surrogate"])
@pytest.mark.parametrize("field", ["title", "body", "topic_key"])
def test_a_candidate_holding_unstorable_text_is_invalid(field: str, bad: str) -> None:
    item = note("Prefers dark roast coffee", topic_key="drink/coffee")
    item[field] = f"{item[field]} {bad}"
    with pytest.raises(ValidationError):  # pydantic refuses a lone surrogate itself
        NoteCandidate.model_validate(item)


@pytest.mark.parametrize("bad", HOSTILE, ids=["nul", "surrogate"])
def test_a_note_whose_key_holds_unstorable_text_is_dropped_and_the_rest_written(
    make_store, backend: str, server: LLMServer, bad: str
) -> None:
    store: Store = make_store(backend, **model_settings(server))
    server.script(
        answer(
            [
                note("Uses zsh as the shell", topic_key=f"tool/{bad}shell"),
                note("Prefers dark roast coffee", topic_key="drink/coffee"),
            ]
        )
    )
    outcome = harvest_transcript(store, transcript("I use zsh and drink dark roast."))
    assert (outcome.status, outcome.notes_written, outcome.items_dropped) == ("harvested", 1, 1)
    assert [m.topic_key for m in rows(store, Memory)] == ["drink/coffee"]
    assert server.calls == 1


@pytest.mark.parametrize(
    ("model", "kept"),
    [
        ("m" * 300, "m" * MODEL_MAX_CHARS),
        ("local\u0000model", "local\ufffdmodel"),
        ("local\ud800model", "local\ufffdmodel"),
    ],
    ids=["too-long", "nul", "surrogate"],
)
def test_a_model_name_the_ledger_cannot_hold_is_kept_as_it_can(
    make_store, backend: str, server: LLMServer, model: str, kept: str
) -> None:
    store: Store = make_store(backend, **model_settings(server))
    server.script(completion(model, [note("Prefers dark roast coffee")]))
    result = run_one_job(store)
    assert result is not None
    assert (result["status"], result["notes_written"], result["model"]) == ("harvested", 1, kept)
    [entry] = rows(store, HarvestLedger)
    assert (entry.model, entry.model_calls) == (kept, 1)
    [job] = rows(store, Job)
    assert (job.state, job.model_calls, job.result["model"]) == ("done", 1, kept)
    assert server.calls == 1


@pytest.mark.parametrize("bad", HOSTILE, ids=["nul", "surrogate"])
def test_a_server_error_holding_unstorable_text_fails_the_job_once_with_its_call_counted(
    make_store, backend: str, server: LLMServer, bad: str
) -> None:
    store: Store = make_store(backend, **model_settings(server))
    server.script(refusal(f"unknown field{bad} in the request"))
    result = run_one_job(store)  # no StorageFailure: a worker would have retried it
    assert result is not None and result["status"] == "failed"
    assert result["model_calls"] == 1
    assert "unknown field\ufffd in the request" in result["error"]
    [job] = rows(store, Job)
    assert (job.state, job.model_calls) == ("failed", 1)
    assert job.last_error.startswith("model_permanent: HTTP 400: unknown field\ufffd in")
    assert job.result["error"] == result["error"]
    assert server.calls == 1
    assert rows(store, Memory) == []


# litellm validates the usage itself: a count that is no number is its error (a retried
# InternalServerError), True and 12.5 are 1 and 12 by then; whole numbers it passes on.
NUMBERS = [(10**12, 0), (10**7 + 1, 0), (-5, 0), (1500.0, 1500), (10**7, 10**7), (30, 30)]
NOT_NUMBERS = [(12.5, 0), ("12abc", 0), ([1], 0), (True, 0), (None, 0)]


# litellm's own Usage model warns when it serializes the 1500.0 it was sent.
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
@pytest.mark.parametrize(
    ("client", "sent", "counted"),
    [("auto", *case) for case in NUMBERS + NOT_NUMBERS] + [("litellm", *case) for case in NUMBERS],
)
def test_a_token_count_that_is_no_count_is_unknown_and_the_answer_kept(
    make_store, server: LLMServer, client: str, sent: object, counted: int
) -> None:
    store: Store = make_store("postgresql", **model_settings(server, harvest_llm=client))
    server.script(completion("test-model", [note("Prefers dark roast coffee")], sent))
    result = run_one_job(store)
    assert result is not None
    assert (result["status"], result["notes_written"]) == ("harvested", 1), result["error"]
    assert (result["prompt_tokens"], result["completion_tokens"]) == (counted, 7)
    [entry] = rows(store, HarvestLedger)
    assert (entry.prompt_tokens, entry.model_calls) == (counted, 1)
    assert server.calls == 1


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
def test_litellm_quoting_the_whole_answer_it_refused_is_cut_to_one_short_line(
    make_store, server: LLMServer
) -> None:
    # litellm refuses a count that is no number, quoting its traceback and the whole answer
    # (the notes the model wrote included): the job keeps the start of it, on one line.
    store: Store = make_store("sqlite", **model_settings(server, harvest_llm="litellm"))
    server.default = completion("test-model", [note("Prefers dark roast coffee")], "12abc")
    outcome = harvest_transcript(store, transcript("I drink dark roast."))
    assert (outcome.status, outcome.model_calls) == ("failed", server.calls)
    assert outcome.error is not None and outcome.error.startswith("model_transient: litellm.")
    assert "\n" not in outcome.error and len(outcome.error) <= 520
    assert "dark roast" not in outcome.error
