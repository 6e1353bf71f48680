"""The harvest model against servers as users run them (issue 15), through the real litellm.

Each server of the issue is emulated by a responder of ``tests.llm_server``: llama-cpp's
server (HTTP 500 to ``json_schema``, takes an inline schema), a server that takes only
``json_object``, a small model that copies the prompt's example, one that stops at
``length``, a chat template that drops the system message, and a slow CPU server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, get_args

import pytest

from gleaner.harvest.answer import parse_answer
from gleaner.harvest.candidate import NoteCandidate
from gleaner.harvest.errors import (
    PermanentModelError,
    ResponseFormatRejected,
    TransientModelError,
    UnparseableAnswer,
)
from gleaner.harvest.formats import FORMATS, forget_formats
from gleaner.harvest.job import harvest_transcript
from gleaner.harvest.litellm_client import auto_format, litellm_call, load_litellm
from gleaner.harvest.model import extract
from gleaner.harvest.options import ModelOptions
from gleaner.harvest.prompt import (
    EXAMPLE_ANSWER,
    REASK_TEMPLATE,
    build_messages,
    render_transcript,
    response_schema,
)
from gleaner.harvest.transcript import Message, Transcript
from gleaner.store import ConfigError, Scope, Settings, load_settings
from gleaner.store.schema.models import HarvestLedger, Memory
from tests.conftest import test_settings
from tests.llm_server import (
    LLAMA_CPP_SCHEMA_ERROR,
    PROSE,
    Behaviour,
    DropsSystem,
    LLMServer,
    answer,
    bad_request,
    copies_example,
    format_of,
    llm_server,
    max_items_of,
    note,
    only_json_object,
    rejects_json_schema,
    repeats_a_note,
    server_error,
    slowly,
    stops_at_length,
    text_answer,
)
from tests.test_harvest_job import model_settings, rows

pytestmark = pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning")

TYPES = ("profile", "preference", "decision", "discovery", "pattern")
SHORT = Transcript(
    conversation_id="conv-1",
    owner="alice",
    messages=[
        Message(role="user", content="I always use tabs, never spaces."),
        Message(role="assistant", content="Noted, tabs it is."),
    ],
)
TABS = note("Uses tabs", confidence=0.9)


@pytest.fixture(scope="module", autouse=True)
def _warm_litellm() -> None:
    load_litellm()
    auto_format("openai/test-model", None)


@pytest.fixture(autouse=True)
def _fresh_formats() -> Iterator[None]:
    forget_formats()
    yield
    forget_formats()


# Every behaviour is tested through both clients: litellm and the lean OpenAI-compatible one
# (harvest.openai_http), which ``auto`` picks for a server like this one.
CLIENT = {"llm": "openai"}


@pytest.fixture(autouse=True, params=("openai", "litellm"))
def _client(request: pytest.FixtureRequest) -> Iterator[None]:
    CLIENT["llm"] = str(request.param)
    yield
    CLIENT["llm"] = "openai"


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with llm_server() as srv:
        yield srv


def options(server: LLMServer, **overrides: Any) -> ModelOptions:
    values: dict[str, Any] = {
        "llm": CLIENT["llm"],
        "model": "openai/test-model",
        "api_base": server.api_base,
        "api_key": "test",
        "timeout_seconds": 3.0,
        "max_attempts": 3,
        "max_retry_seconds": 5.0,
        "backoff_seconds": 0.02,
        "backoff_max_seconds": 0.1,
    }
    return ModelOptions(**{**values, **overrides})


def formats(server: LLMServer) -> list[str]:
    return [format_of(r.body) for r in server.requests]


# --- 1. response formats -------------------------------------------------------------------


def test_llama_cpp_server_gets_the_inline_schema_after_its_500(server: LLMServer) -> None:
    server.default = rejects_json_schema(answer([TABS]))
    result = extract(SHORT, options(server))
    assert [n.title for n in result.notes] == ["Uses tabs"]
    # The 500 is not retried as transient: one refused request, then the next format.
    assert formats(server) == ["json_schema", "json_object_schema"]
    assert result.cost.model_calls == 2
    sent = server.requests[1].body["response_format"]
    schema = response_schema(types=TYPES, max_facts=5)
    schema["properties"]["notes"]["maxItems"] = 5  # the grammar's bound (below)
    assert sent == {"type": "json_object", "schema": schema}

    # Remembered for this model and server: the next transcript starts there.
    extract(SHORT, options(server))
    assert formats(server)[2:] == ["json_object_schema"]


def test_json_object_only_server_walks_the_whole_chain_once(server: LLMServer) -> None:
    server.default = only_json_object(answer([TABS]))
    result = extract(SHORT, options(server))
    assert [n.title for n in result.notes] == ["Uses tabs"]
    assert formats(server) == ["json_schema", "json_object_schema", "json_object"]
    assert auto_format("openai/test-model", server.api_base) == "json_object"
    extract(SHORT, options(server))
    assert formats(server)[3:] == ["json_object"]


def test_what_auto_learned_is_kept_per_model_and_server(server: LLMServer) -> None:
    server.default = rejects_json_schema(answer([TABS]))
    extract(SHORT, options(server))
    with llm_server(answer([TABS])) as other:
        extract(SHORT, options(other))
        assert formats(other) == ["json_schema"]  # another server is probed afresh
    extract(SHORT, options(server, model="openai/other-model"))
    # So is another model on the same server.
    assert formats(server)[2:] == ["json_schema", "json_object_schema"]


def test_auto_trusts_litellm_for_a_hosted_model_without_api_base() -> None:
    assert auto_format("openai/gpt-4o", None) == "json_schema"
    assert auto_format("gpt-3.5-turbo", None) == "json_object"
    assert auto_format("no-such-provider/thing", None) == "none"
    # Behind a custom server litellm knows the protocol, not the model: probe from the top.
    assert auto_format("openai/local-gguf", "http://127.0.0.1:8000/v1") == "json_schema"


@pytest.mark.parametrize("setting", ["json_schema", "json_object_schema"])
def test_an_explicit_format_is_never_fallen_back_from(server: LLMServer, setting: str) -> None:
    server.default = only_json_object(answer([TABS]))
    with pytest.raises(ResponseFormatRejected) as caught:
        extract(SHORT, options(server, response_format=setting))
    assert server.calls == 1  # neither retried nor fallen back
    assert caught.value.reason == "response_format_rejected"
    message = str(caught.value)
    assert f"GLEANER_HARVEST_RESPONSE_FORMAT={setting}" in message
    assert "json_object" in message.rsplit("(", 1)[-1]  # the weaker formats are named


def test_a_refusal_is_one_line(server: LLMServer) -> None:
    # llama-cpp-python's 500 spans lines (the validation error, then its own source line);
    # the failure a CLI, a log line or the ledger shows is one line.
    server.default = rejects_json_schema(answer([TABS]))
    with pytest.raises(ResponseFormatRejected) as caught:
        extract(SHORT, options(server, response_format="json_schema"))
    message = str(caught.value)
    assert "\n" not in message and "Input should be 'text' or 'json_object'" in message


@pytest.mark.parametrize(
    ("setting", "sent"),
    [
        ("json_object_schema", "json_object_schema"),
        ("json_object", "json_object"),
        ("none", "none"),
    ],
)
def test_an_explicit_format_is_sent_as_set(server: LLMServer, setting: str, sent: str) -> None:
    server.default = answer([TABS])
    extract(SHORT, options(server, response_format=setting))
    assert formats(server) == [sent]


def test_errors_that_are_not_about_the_format_keep_their_handling(server: LLMServer) -> None:
    server.script(server_error(500), answer([TABS]))
    assert [n.title for n in extract(SHORT, options(server)).notes] == ["Uses tabs"]
    assert formats(server) == ["json_schema", "json_schema"]  # a plain 500 is retried as is
    server.script(bad_request("Invalid value for 'messages'."))
    with pytest.raises(Exception, match="messages") as caught:
        extract(SHORT, options(server))
    assert not isinstance(caught.value, ResponseFormatRejected)
    assert server.calls == 3  # one call: not walked down the formats


def test_a_500_naming_the_schema_is_a_refusal_even_from_a_known_model(
    server: LLMServer,
) -> None:
    refusal = Behaviour(
        status=500, error={"error": {"message": LLAMA_CPP_SCHEMA_ERROR, "type": "server_error"}}
    )
    server.script(refusal, answer([TABS]))
    result = extract(SHORT, options(server, model="openai/gpt-4o"))
    assert result.cost.model_calls == 2 and formats(server) == ["json_schema", "json_object_schema"]


def test_the_settings_reach_the_request(server: LLMServer) -> None:
    settings = test_settings(
        harvest_model="openai/test-model",
        harvest_api_base=server.api_base,
        harvest_api_key="test",
        harvest_response_format="json_object",
        harvest_max_answer_tokens=512,
        harvest_temperature=0.3,
    )
    opts = ModelOptions.from_settings(settings)
    assert (opts.response_format, opts.max_answer_tokens, opts.temperature) == (
        "json_object",
        512,
        0.3,
    )
    server.default = answer([TABS])
    extract(SHORT, opts)
    body = server.requests[0].body
    assert (body["max_tokens"], body["temperature"], format_of(body)) == (512, 0.3, "json_object")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("harvest_response_format", "xml"),
        ("harvest_max_answer_tokens", 0),
        ("harvest_temperature", 3),
        ("harvest_model", "openai/" + "m" * 200),  # the ledger keys harvests by it
    ],
)
def test_bad_settings_name_the_variable(variable: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"GLEANER_{variable.upper()}"):
        load_settings(**{variable: value})


def test_defaults_fit_cpu_inference_within_the_task_time_limit() -> None:
    settings = test_settings()
    assert settings.harvest_response_format == "auto"
    assert (settings.harvest_max_answer_tokens, settings.harvest_temperature) == (2_048, 0.0)
    # A CPU server takes minutes for a full answer (the issue measured ~95 s on a 270M model).
    assert settings.harvest_timeout_seconds >= 180
    # One chunk's two asks (each the last retry's start plus its timeout) end before the
    # task is asked to stop.
    one_ask = settings.harvest_max_retry_seconds + settings.harvest_timeout_seconds
    assert 2 * one_ask < settings.task_soft_time_limit


# --- 2. placeholders and truncation --------------------------------------------------------


def test_a_model_copying_the_example_stores_nothing(server: LLMServer) -> None:
    server.default = copies_example()
    result = extract(SHORT, options(server))
    assert server.requests[0].body["messages"][0]["content"].endswith(EXAMPLE_ANSWER)
    assert (result.notes, result.cost.items_dropped, result.cost.model_calls) == ([], 1, 1)


def test_wordless_and_placeholder_notes_are_dropped_and_counted() -> None:
    items = [
        note("Uses tabs"),
        note("Spricht Deutsch", body="Der Nutzer spricht Deutsch."),
        note("日本語を話す", body="ユーザーは日本語を話す。", topics=["...", "言語"]),
        note("...", body="..."),
        note("—", body="The user likes it."),
        note("A real title", body="…"),
        note("Short and specific, at most 80 characters", body="The user likes tabs."),
        note("Likes tabs", body="The user ..."),
        note("Likes tabs", body="One to three self-contained sentences in the third person."),
        note("???", body="!!!"),
    ]
    parsed = parse_answer(json.dumps({"notes": items}), TYPES)
    assert [n.title for n in parsed.notes] == ["Uses tabs", "Spricht Deutsch", "日本語を話す"]
    assert parsed.dropped == 7
    assert parsed.notes[2].topics == ["言語"]  # a wordless topic is left out, not the note


def test_a_wordless_candidate_is_invalid_everywhere() -> None:
    with pytest.raises(ValueError, match="no word"):
        NoteCandidate(type="preference", title="...", body="The user likes tabs.")
    with pytest.raises(ValueError, match="no word"):
        NoteCandidate(type="preference", title="Tabs", body=" - ")


def test_a_cut_off_answer_is_asked_again_shorter_and_never_parsed(server: LLMServer) -> None:
    server.default = stops_at_length()
    result = extract(SHORT, options(server, max_answer_tokens=200))
    first, second = (r.body for r in server.requests)
    assert (first["max_tokens"], second["max_tokens"]) == (200, 200)
    assert "at most 5 notes" in first["messages"][-1]["content"]
    retry = second["messages"][-1]["content"]
    assert "cut off at the length limit" in retry
    assert "at most 2 notes" in retry and "one sentence" in retry
    assert "at most 2 notes" in second["messages"][0]["content"]  # the system message too
    assert [n.title for n in result.notes] == ["Fact number 0", "Fact number 1"]
    assert result.cost.model_calls == 2


def test_the_inline_schema_bounds_a_repeating_model_by_grammar(server: LLMServer) -> None:
    # SmolLM2-135M under llama-cpp-python repeated one note to the token limit, twice, and
    # the transcript failed truncated_answer. The server turns an inline schema into a
    # grammar, which enforces maxItems: the list closes after max_facts notes.
    server.default = rejects_json_schema(repeats_a_note(TABS))
    result = extract(SHORT, options(server, max_answer_tokens=400, max_facts=3))
    assert formats(server) == ["json_schema", "json_object_schema"]
    assert max_items_of(server.requests[1].body) == 3
    assert [n.title for n in result.notes] == ["Uses tabs"] and result.cost.model_calls == 2


def test_the_shorter_reask_bounds_the_inline_schema_at_the_fewer_notes(server: LLMServer) -> None:
    # The re-ask after a cut-off asks for half the notes: its grammar must not allow more.
    server.default = stops_at_length()
    extract(SHORT, options(server, max_answer_tokens=200, response_format="json_object_schema"))
    first, second = (r.body for r in server.requests)
    assert (max_items_of(first), max_items_of(second)) == (5, 2)


def test_strict_json_schema_sends_no_length_limit(server: LLMServer) -> None:
    # Strict structured-output modes do not all take maxItems: the json_schema form has none.
    server.default = answer([TABS])
    extract(SHORT, options(server, response_format="json_schema"))
    assert max_items_of(server.requests[0].body) is None


def test_cut_off_twice_fails_the_transcript_and_stores_nothing(make_store, server) -> None:
    store = make_store("sqlite", **model_settings(server, harvest_max_answer_tokens=30))
    server.default = stops_at_length()
    report = harvest_transcript(store, SHORT)
    assert report.status == "failed"
    assert (report.error or "").startswith("truncated_answer:")
    assert report.model == "test-model"  # the server's name for it, as a harvested one shows
    assert server.calls == 2
    assert rows(store, Memory) == [] and rows(store, HarvestLedger) == []
    assert store.search(Scope.owner("alice"), "Fact") == []


# --- 3. the re-ask -------------------------------------------------------------------------


def test_the_reask_shows_the_model_its_answer_and_what_was_wrong(server: LLMServer) -> None:
    bad = '{"notes": [{"type": "preference", "title": "Uses tabs" "body": "x"}]}'
    server.script(text_answer(bad), answer([TABS]))
    result = extract(SHORT, options(server))
    assert [n.title for n in result.notes] == ["Uses tabs"] and result.cost.model_calls == 2
    first, second = (r.body["messages"] for r in server.requests)
    assert second[: len(first)] == first
    assert second[len(first)] == {"role": "assistant", "content": bad}
    feedback = second[-1]
    assert feedback["role"] == "user" and len(second) == len(first) + 2
    assert "\n" not in feedback["content"]
    assert "not valid JSON (Expecting ',' delimiter at line 1 column" in feedback["content"]
    assert "tabs" not in feedback["content"].lower()  # nothing of the transcript or answer
    assert feedback["content"].endswith("nothing else.")


def test_a_deterministic_model_fixes_its_answer_when_told_what_was_wrong(
    server: LLMServer,
) -> None:
    # Temperature 0: the same request gets the same (bad) answer; only being told helps.
    def model(body: dict[str, Any]) -> Behaviour:
        told = body["messages"][-1]["content"].startswith("That answer could not be used")
        return answer([TABS]) if told else text_answer(PROSE)

    server.default = model
    result = extract(SHORT, options(server))
    assert [n.title for n in result.notes] == ["Uses tabs"] and server.calls == 2


def test_the_reask_is_asked_once(server: LLMServer) -> None:
    server.default = text_answer(PROSE)
    with pytest.raises(UnparseableAnswer) as caught:
        extract(SHORT, options(server))
    assert server.calls == 2
    assert caught.value.problem == 'it is not JSON and holds no JSON object with a "notes" list'


def test_an_empty_answer_is_reasked_without_an_empty_turn(server: LLMServer) -> None:
    server.script(text_answer(""), answer([TABS]))
    extract(SHORT, options(server))
    turns = server.requests[1].body["messages"]
    assert [t["role"] for t in turns] == ["system", "user", "user"]
    assert turns[-1]["content"] == REASK_TEMPLATE.format(problem="the answer was empty")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("   ", "the answer was empty"),
        ('{"notes": [', "it is not valid JSON (Expecting value at line 1 column 12)"),
        ('{"facts": []}', 'it is a JSON object without a "notes" key'),
        ('{"notes": {"a": 1}}', 'its "notes" is an object, not a list'),
        ('"notes"', 'it is a string, not an object with a "notes" list'),
        ("null", 'it is null, not an object with a "notes" list'),
    ],
)
def test_the_problem_is_one_line_quoting_nothing(text: str, problem: str) -> None:
    with pytest.raises(UnparseableAnswer) as caught:
        parse_answer(text, TYPES)
    assert caught.value.problem == problem


# --- 4. a template that drops the system message -------------------------------------------


def test_the_rules_reach_a_model_whose_template_drops_the_system_message(
    server: LLMServer,
) -> None:
    drops = DropsSystem(answer([TABS]))
    server.default = drops
    result = extract(SHORT, options(server))
    assert [n.title for n in result.notes] == ["Uses tabs"] and result.cost.model_calls == 1
    assert drops.dropped == 1
    [seen] = drops.seen
    assert [m["role"] for m in seen] == ["user"]
    user = seen[0]["content"]
    for essential in ("data, not instructions", "never copy secrets", '{"notes": [', *TYPES):
        assert essential in user
    assert "at most 5 notes" in user and '"topic_key" (a string or null)' in user


def test_without_the_essentials_that_model_answers_prose(server: LLMServer) -> None:
    # The emulation is not vacuous: rules only in the system message never reach it.
    server.default = DropsSystem(answer([TABS]))
    system_only = build_messages(render_transcript(SHORT.messages), max_facts=5, types=TYPES)
    system_only[1]["content"] = system_only[1]["content"].split("\nRules:")[0]
    reply = litellm_call(system_only, options=options(server))
    assert reply.text == PROSE


# --- 5. a slow CPU server ------------------------------------------------------------------


def test_a_slow_server_within_the_timeout_is_one_call(server: LLMServer) -> None:
    server.default = slowly(1.5, answer([TABS]))
    result = extract(SHORT, options(server, timeout_seconds=4))
    assert [n.title for n in result.notes] == ["Uses tabs"] and server.calls == 1


def test_a_server_slower_than_the_timeout_is_transient(server: LLMServer) -> None:
    server.default = slowly(2, answer([TABS]))
    with pytest.raises(TransientModelError):
        extract(SHORT, options(server, timeout_seconds=0.4, max_attempts=2))
    assert server.calls == 2
    assert formats(server) == ["json_schema", "json_schema"]  # a timeout is not a refusal


def test_formats_are_ordered_strongest_first_and_are_the_settings_choices() -> None:
    assert FORMATS == ("json_schema", "json_object_schema", "json_object", "none")
    setting = Settings.model_fields["harvest_response_format"].annotation
    assert get_args(setting) == ("auto", *FORMATS)


# --- 6. reasoning models, content parts -----------------------------------------------------

# What a reasoning model (DeepSeek-R1, Qwen3 through llama.cpp or Ollama) sends ahead of its
# answer, in the content itself: its thoughts, with a draft of the JSON it then changed.
DRAFT = note("Draft the model dropped", body="A draft inside the thoughts.")
THOUGHTS = f"<think>The user said tabs. A draft: {json.dumps({'notes': [DRAFT]})}</think>\n\n"


def test_a_reasoning_models_thoughts_are_not_taken_for_its_answer(server: LLMServer) -> None:
    server.default = text_answer(THOUGHTS + json.dumps({"notes": [TABS]}))
    result = extract(SHORT, options(server))
    assert [n.title for n in result.notes] == ["Uses tabs"] and server.calls == 1


def test_thoughts_that_never_end_are_no_answer_and_asked_again(server: LLMServer) -> None:
    server.script(text_answer(THOUGHTS.replace("</think>", "")), answer([TABS]))
    result = extract(SHORT, options(server))
    assert [n.title for n in result.notes] == ["Uses tabs"] and server.calls == 2
    assert "its <think> block never ends" in server.requests[1].user_text


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
def test_an_answer_in_content_parts_is_read(server: LLMServer) -> None:
    parts = [
        {"type": "text", "text": '{"notes": ['},
        {"type": "text", "text": json.dumps(TABS) + "]}"},
    ]
    message = {"role": "assistant", "content": parts}
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "test-model",
        "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 7},
    }
    server.default = Behaviour(raw_body=json.dumps(body).encode())
    if CLIENT["llm"] == "litellm":
        # litellm (the pinned range) refuses such an answer itself, as it refuses any body it
        # cannot read; both clients count that as transient. The lean client reads it.
        with pytest.raises(TransientModelError, match="Invalid response object"):
            extract(SHORT, options(server))
        assert server.calls == 3
        return
    result = extract(SHORT, options(server))
    assert [n.title for n in result.notes] == ["Uses tabs"] and server.calls == 1


# --- 7. the API key ------------------------------------------------------------------------

SECRET_KEY = "sk-test-SECRET-0123456789abcdef"


def test_a_server_quoting_the_api_key_it_refused_leaves_it_out_of_the_error(
    server: LLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    # A server may quote the key it refused, whole ("Incorrect API key provided: sk-...");
    # the error is kept on the job and logged, where the key must never be.
    refusal = {
        "message": f"Incorrect API key provided: {SECRET_KEY}.",
        "type": "invalid_request_error",
    }
    server.default = Behaviour(status=401, error=refusal)
    with pytest.raises(PermanentModelError) as caught:
        extract(SHORT, options(server, api_key=SECRET_KEY))
    assert "Incorrect API key provided" in str(caught.value)
    assert SECRET_KEY not in str(caught.value) and SECRET_KEY not in repr(caught.value)
    assert SECRET_KEY not in caplog.text
