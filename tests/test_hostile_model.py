"""Hostile model servers: an answer trickled a byte at a time is cut off at
GLEANER_HARVEST_TIMEOUT_SECONDS, one deadline over the whole call, on both clients, in
process and through a real worker with ``--pool threads``; template and placeholder text the
model sends is never a note, nor a topic key.

The deadline is the promise, so its tests read the clock: the call's end is awaited (it
raises), and its time is checked against the timeout (2 s, the setting made short; at 1 s
litellm's own work before its request reaches the server can outlast it on a loaded
machine)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from gleaner.harvest.answer import parse_answer
from gleaner.harvest.candidate import placeholder
from gleaner.harvest.errors import TransientModelError
from gleaner.harvest.job import harvest_transcript
from gleaner.harvest.litellm_client import litellm_call, load_litellm
from gleaner.harvest.openai_http import openai_call
from gleaner.harvest.options import ModelOptions
from gleaner.harvest.transcript import Message, Transcript
from gleaner.store import Store
from gleaner.store.schema.models import Job, Memory
from tests.llm_server import LLMServer, answer, llm_server, note, trickling
from tests.samples import write_natives
from tests.workers_harness import Cluster, cluster_store, fresh_cluster, wait_for

TYPES = ("profile", "preference", "decision", "discovery", "pattern")
MESSAGES = [{"role": "user", "content": "I use tabs."}]
CHAT = Transcript(
    conversation_id="c1", owner="alice", messages=[Message(role="user", content="I use tabs.")]
)
TIMEOUT = 2.0
# Past the deadline a call ends within this: the socket's shutdown, or the waiting thread
# giving up, is immediate; the rest is slack for a loaded machine.
SLACK = 3.0


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with llm_server() as running:
        yield running


CLIENTS = {"openai": openai_call, "litellm": litellm_call}


def options(api_base: str, client: str, **overrides: object) -> ModelOptions:
    values: dict[str, object] = {
        "llm": client,
        "model": "openai/test-model",
        "api_base": api_base,
        "api_key": "k",
        "timeout_seconds": TIMEOUT,
        "response_format": "json_object",
        **overrides,
    }
    return ModelOptions(**values)  # type: ignore[arg-type]


# --- one deadline over the whole call ---------------------------------------------------


@pytest.mark.parametrize("client", ["openai", "litellm"])
def test_a_trickled_answer_is_cut_off_at_the_timeout(server: LLMServer, client: str) -> None:
    # Each byte comes within a tenth of a second, far inside any per-read timeout; the whole
    # answer would take over a minute.
    server.default = trickling(0.1, answer([note("Uses tabs")]))
    load_litellm()  # imported beforehand: its first import takes seconds of its own
    started = time.monotonic()
    with pytest.raises(
        TransientModelError, match=f"did not finish its answer within {TIMEOUT:g} s"
    ):
        CLIENTS[client](MESSAGES, options=options(server.api_base, client))
    took = time.monotonic() - started
    assert TIMEOUT - 0.2 <= took < TIMEOUT + SLACK
    assert server.calls == 1


@pytest.mark.parametrize("client", ["openai", "litellm"])
def test_an_answer_within_the_deadline_is_read_whole(server: LLMServer, client: str) -> None:
    # The deadline must not cut a slow but timely answer: a few bytes trickled, then done.
    server.default = trickling(0.001, answer([note("Uses tabs")]))
    got = CLIENTS[client](MESSAGES, options=options(server.api_base, client))
    assert "Uses tabs" in got.text


def test_the_lean_clients_connection_is_usable_after_a_cut_off(server: LLMServer) -> None:
    server.script(trickling(0.1), answer([note("Uses tabs")]))
    with pytest.raises(TransientModelError, match="Timeout"):
        openai_call(MESSAGES, options=options(server.api_base, "openai"))
    got = openai_call(MESSAGES, options=options(server.api_base, "openai"))
    assert "Uses tabs" in got.text and server.calls == 2


@pytest.mark.parametrize("client", ["openai", "litellm"])
def test_a_harvest_in_process_fails_with_a_timeout(
    make_store: Callable[..., Store], backend: str, client: str
) -> None:
    with llm_server(trickling(0.2)) as server:
        store = make_store(
            backend,
            harvest_model="openai/test-model",
            harvest_api_base=server.api_base,
            harvest_api_key="k",
            harvest_llm=client,
            harvest_timeout_seconds=TIMEOUT,
            harvest_max_attempts=1,
        )
        started = time.monotonic()
        outcome = harvest_transcript(store, CHAT)
        took = time.monotonic() - started
        assert outcome.status == "failed" and outcome.error is not None
        assert outcome.error.startswith("model_transient: Timeout: ")
        assert took < TIMEOUT + SLACK and server.calls == 1


@pytest.fixture
def cluster(tmp_path: Path, worker_id: str) -> Iterator[Cluster]:
    yield from fresh_cluster("hostile_model", worker_id, tmp_path)


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.parametrize(
    ("pool", "client"), [("threads", "auto"), ("threads", "litellm"), ("prefork", "auto")]
)
def test_a_worker_cuts_a_trickled_answer_off(
    cluster: Cluster, tmp_path: Path, pool: str, client: str
) -> None:
    # Celery's threads pool enforces no time limit: the deadline alone ends the call (and in
    # a prefork child, long before the soft time limit).
    with llm_server(trickling(0.2)) as server:
        cluster.env.update(
            {
                "GLEANER_HARVEST_MODEL": "openai/test-model",
                "GLEANER_HARVEST_API_BASE": server.api_base,
                "GLEANER_HARVEST_API_KEY": "k",
                "GLEANER_HARVEST_LLM": client,
                "GLEANER_HARVEST_TIMEOUT_SECONDS": str(TIMEOUT),
                "GLEANER_HARVEST_MAX_ATTEMPTS": "1",
            }
        )
        cluster.start_worker(concurrency=2, pool=pool)
        files = write_natives(tmp_path / "in", 1)
        started = time.monotonic()
        assert cluster.gleaner("enqueue", str(files[0])).returncode == 0
        store = next(cluster_store(cluster))
        try:

            def failed() -> Job | None:
                with store.transaction() as session:
                    return session.execute(select(Job).where(Job.state == "failed")).scalar()

            wait_for(lambda: failed() is not None, 60)
            took = time.monotonic() - started
            job = failed()
            assert job is not None and job.last_error is not None
            assert job.last_error.startswith("model_transient: Timeout: the model server did")
            assert "GLEANER_HARVEST_TIMEOUT_SECONDS" in job.last_error
            assert job.model_calls == 1 and server.calls == 1
            # The enqueue's own start-up and the job's claim come before the call.
            assert took < TIMEOUT + 15
        finally:
            store.dispose()


# --- placeholder and template text ------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["string", "<title>", "<body>", "{title}", "{{ body }}", "[insert title]", "N/A", "None",
     "null", "TODO", "...", "  ", "Undefined.", "<topic_key>", "integer"],
)  # fmt: skip
def test_template_and_null_ish_text_is_a_placeholder(text: str) -> None:
    assert placeholder(text) is not None


@pytest.mark.parametrize(
    "text",
    ["Uses tabs", "None of the above apply to Rust", "Prefers <b>bold</b> headings", "NA 2024",
     "String theory reading list", "nullable columns", "日本語", "x<y", "[1] Lisbon"],
)  # fmt: skip
def test_real_text_is_no_placeholder(text: str) -> None:
    assert placeholder(text) is None


def test_placeholder_notes_are_dropped_and_placeholder_keys_are_no_keys() -> None:
    items = [
        note("string", body="string", topic_key="string"),
        note("<title>", body="<body>", topic_key="<topic_key>"),
        note("N/A", body="None"),
        note("Uses tabs", body="null"),
        note("Uses tabs for indentation", body="The user indents with tabs.", topic_key="null"),
        note("Editor", body="The user edits in vim.", topic_key="<topic_key>"),
        note("Shell", body="The user runs fish.", topic_key="shell"),
    ]
    content = answer(items).content
    parsed = parse_answer(content, TYPES)
    assert parsed.dropped == 4
    assert [(n.title, n.topic_key) for n in parsed.notes] == [
        ("Uses tabs for indentation", None),
        ("Editor", None),
        ("Shell", "shell"),
    ]


def test_placeholder_notes_never_reach_the_store(
    make_store: Callable[..., Store], backend: str
) -> None:
    junk = [
        note("string", body="string", topic_key="string"),
        note("<title>", body="<body>", topic_key="<topic_key>"),
        note("N/A", body="None", topic_key="N/A"),
        note("TODO", body="..."),
    ]
    real = note("Uses tabs", body="The user indents with tabs.", topic_key="<topic_key>")
    with llm_server(answer([*junk, real])) as server:
        store = make_store(
            backend,
            harvest_model="openai/test-model",
            harvest_api_base=server.api_base,
            harvest_response_format="json_object",
        )
        outcome = harvest_transcript(store, CHAT)
    assert outcome.status == "harvested"
    assert (outcome.notes_written, outcome.items_dropped) == (1, 4)
    with store.transaction() as session:
        stored = session.execute(select(Memory.title, Memory.body, Memory.topic_key)).all()
    assert [tuple(row) for row in stored] == [("Uses tabs", "The user indents with tabs.", None)]
