"""The harvest model through both clients against a scripted local OpenAI-compatible server.

Backoff is scaled down (tens of milliseconds) so the retries are real but fast; every test is
bounded by small timeouts. What the retry layer decided (each wait, and when it was planned)
is read from its log records, never from how long a test took.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gleaner.harvest.answer import parse_answer
from gleaner.harvest.chunks import count_tokens, pack_chunks
from gleaner.harvest.errors import (
    ContextWindowExceeded,
    PermanentModelError,
    TransientModelError,
    TruncatedAnswer,
    UnparseableAnswer,
)
from gleaner.harvest.litellm_client import (
    litellm_call,
    litellm_format,
    load_litellm,
    map_litellm_error,
    retry_after_seconds,
)
from gleaner.harvest.llm import LLMAnswer
from gleaner.harvest.model import MAX_HALVINGS, extract, merge_notes, resolve_llm
from gleaner.harvest.options import SETTING_OF, ModelOptions
from gleaner.harvest.prompt import build_messages, render_transcript, user_prompt
from gleaner.harvest.retry import call_with_retries
from gleaner.harvest.transcript import Message, Transcript
from gleaner.store import ConfigError, Settings
from tests.conftest import test_settings
from tests.llm_server import (
    Behaviour,
    LLMServer,
    answer,
    bad_request,
    context_exceeded,
    llm_server,
    note,
    prose_wrapped,
    rate_limited,
    refused_port,
    server_error,
    slow,
    text_answer,
    truncated,
    unauthorized,
    unavailable,
    wrong_shape,
)

# litellm's import trips a pydantic warning about its own TypedDicts; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning")

TYPES = ("profile", "preference", "decision", "discovery", "pattern")
FILLER = (
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
)


@pytest.fixture(scope="module", autouse=True)
def _warm_litellm() -> None:
    # Importing litellm takes seconds; done inside the first attempt it would eat into the
    # retry window of whichever test happened to run first.
    load_litellm()
    litellm_format("openai/test-model")


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with llm_server() as srv:
        yield srv


@pytest.fixture
def retries(caplog: pytest.LogCaptureFixture) -> Callable[[], list[logging.LogRecord]]:
    """The retry layer's records so far: one per retry, with ``retry_in`` (the wait it chose)
    and ``since_first`` (seconds from the first attempt when it chose it)."""
    caplog.set_level(logging.WARNING, logger="gleaner.harvest.retry")
    return lambda: [r for r in caplog.records if r.name == "gleaner.harvest.retry"]


Retries = Callable[[], list[logging.LogRecord]]


OptionsFactory = Callable[..., ModelOptions]


# Every behaviour is tested through both clients: litellm and the lean OpenAI-compatible one
# (harvest.openai_http), which ``auto`` picks for a server like this one.
CLIENTS = ("openai", "litellm")


@pytest.fixture(params=CLIENTS)
def client(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def options(server: LLMServer, client: str) -> OptionsFactory:
    """Options pointing at the test server, with small timeouts and fast backoff."""

    def make(**overrides: Any) -> ModelOptions:
        values: dict[str, Any] = {
            "llm": client,
            "model": "openai/test-model",
            "api_base": server.api_base,
            "api_key": "test",
            "max_facts": 5,
            "timeout_seconds": 2.0,
            "max_attempts": 4,
            "max_retry_seconds": 10.0,
            "backoff_seconds": 0.02,
            "backoff_max_seconds": 0.1,
        }
        values.update(overrides)
        return ModelOptions(**values)

    return make


def transcript(*contents: str) -> Transcript:
    roles = ("user", "assistant")
    return Transcript(
        conversation_id="conv-1",
        owner="alice",
        messages=[Message(role=roles[i % 2], content=c) for i, c in enumerate(contents)],
    )


SHORT = transcript("I always use tabs, never spaces.", "Noted, tabs it is.")


def long_transcript(messages: int, words: int) -> Transcript:
    contents = [
        f"Message {i}: " + " ".join(FILLER[(i + j) % len(FILLER)] for j in range(words))
        for i in range(messages)
    ]
    return transcript(*contents)


def sent_transcript(body: dict[str, Any]) -> str:
    """The transcript text inside a recorded request's user message."""
    users = [m for m in body["messages"] if m["role"] == "user"]
    match = re.search(r"<transcript>\n(.*)\n</transcript>", users[-1]["content"], re.DOTALL)
    assert match, users[-1]["content"]
    return match.group(1)


# --- normal answers ----------------------------------------------------------------------


def test_normal_answer(server: LLMServer, options: OptionsFactory) -> None:
    server.script(answer([note("Uses tabs", confidence=0.9, topic_key="preference/indent")]))
    result = extract(SHORT, options())
    assert [n.title for n in result.notes] == ["Uses tabs"]
    assert result.notes[0].topic_key == "preference/indent"
    assert (result.cost.model_calls, result.chunks, result.cost.items_dropped) == (1, 1, 0)
    assert (result.cost.prompt_tokens, result.cost.completion_tokens) == (100, 20)
    assert result.model == "test-model"
    body = server.requests[0].body
    assert body["temperature"] == 0
    assert body["max_tokens"] == 2_048
    # An unknown model behind a custom api_base: auto starts at the strongest format.
    assert body["response_format"]["type"] == "json_schema"
    assert "num_retries" not in body and "max_retries" not in body


def test_request_carries_exactly_the_rendered_redacted_transcript(
    server: LLMServer, options: OptionsFactory
) -> None:
    # The caller stripped "<private>hunter2</private>" before handing the transcript over.
    redacted = transcript("My password is [REDACTED], remember I use fish shell.", "OK.")
    server.script(answer([note("Uses fish shell")]))
    extract(redacted, options())
    (request,) = server.requests
    assert "hunter2" not in json.dumps(request.body)
    assert request.user_text == user_prompt(render_transcript(redacted.messages))
    assert request.messages == build_messages(
        render_transcript(redacted.messages), max_facts=5, types=TYPES
    )


def test_structured_output_schema_where_the_model_supports_it(
    server: LLMServer, options: OptionsFactory
) -> None:
    server.script(answer([note("Uses tabs")]))
    extract(SHORT, options(model="openai/gpt-4o"))
    response_format = server.requests[0].body["response_format"]
    assert response_format["type"] == "json_schema"
    schema = response_format["json_schema"]["schema"]
    assert schema["properties"]["notes"]["items"]["properties"]["type"]["enum"] == list(TYPES)


def test_model_without_json_mode_gets_no_response_format() -> None:
    assert litellm_format("no-such-provider/thing") == "none"


def test_empty_transcript_makes_no_call(server: LLMServer, options: OptionsFactory) -> None:
    result = extract(transcript("   ", ""), options())
    assert (result.notes, result.cost.model_calls, server.calls) == ([], 0, 0)


# --- transient failures and the retry layer ----------------------------------------------


def test_slow_answer_times_out_and_is_retried(
    server: LLMServer, options: OptionsFactory, retries: Retries
) -> None:
    server.script(slow(5), answer([note("Uses tabs")]))
    result = extract(SHORT, options(timeout_seconds=0.5))
    # The slow answer (no notes) was abandoned at the timeout, not waited for.
    assert [n.title for n in result.notes] == ["Uses tabs"]
    assert result.cost.model_calls == 2 and server.calls == 2
    (retry,) = retries()
    assert "Timeout" in retry.getMessage()
    first, second = server.request_times
    # The timeout is the promise: the first call was cut at its 0.5 s, not waited for (the
    # answer takes 5 s). No lower bound: the deadline covers the client's own work before
    # its request reaches the server (litellm's first call: a third of a second, seen), so
    # the arrivals may be closer than 0.5 s (on main this flaked at 0.4993 s).
    assert second - first < 5


def test_answers_that_are_always_slow_fail_after_max_attempts(
    server: LLMServer, options: OptionsFactory, retries: Retries
) -> None:
    server.default = slow(5)
    with pytest.raises(TransientModelError, match="Timeout"):
        extract(SHORT, options(timeout_seconds=0.3, max_attempts=3))
    assert server.calls == 3 and len(retries()) == 2


def test_429_waits_at_least_retry_after(
    server: LLMServer, options: OptionsFactory, retries: Retries
) -> None:
    server.script(rate_limited(retry_after=1), answer([note("Uses tabs")]))
    result = extract(SHORT, options())
    assert result.cost.model_calls == 2 and server.calls == 2
    (retry,) = retries()
    assert retry.retry_in == 1.0  # the server's Retry-After, above the backoff (<= 0.02 s)
    first, second = server.request_times
    assert second - first >= 1.0
    assert result.cost.prompt_tokens == 100  # the 429 had no usage to count


def test_429_with_retry_after_past_the_window_gives_up_at_once(
    server: LLMServer, options: OptionsFactory, retries: Retries
) -> None:
    server.script(rate_limited(retry_after=30))
    with pytest.raises(TransientModelError) as caught:
        extract(SHORT, options(max_retry_seconds=5))
    assert server.calls == 1 and retries() == []  # no wait planned, none slept
    assert caught.value.retry_after == 30  # the caller may reschedule that far ahead


def test_5xx_then_success(server: LLMServer, options: OptionsFactory) -> None:
    server.script(server_error(500), unavailable(), server_error(502), answer([note("Tabs")]))
    result = extract(SHORT, options())
    assert [n.title for n in result.notes] == ["Tabs"]
    assert result.cost.model_calls == 4 and server.calls == 4


def test_persistent_500_fails_after_exactly_max_attempts(
    server: LLMServer, options: OptionsFactory, retries: Retries
) -> None:
    server.default = server_error(500)
    with pytest.raises(TransientModelError):
        extract(SHORT, options(max_attempts=4))
    assert server.calls == 4  # not 4 x litellm's own retries: those are off
    waits = [r.retry_in for r in retries()]
    assert len(waits) == 3 and all(0 <= w <= 0.1 for w in waits)  # capped: backoff_max_seconds


def test_retry_window_bounds_the_total_delay(
    server: LLMServer, options: OptionsFactory, retries: Retries
) -> None:
    server.default = rate_limited(retry_after=0.4)
    with pytest.raises(TransientModelError):
        extract(SHORT, options(max_attempts=10, max_retry_seconds=1.0))
    made = retries()
    # Attempts at about 0, 0.4 and 0.8 s; a fourth would start past the 1 s window, so the
    # window, not max_attempts, ended it, and no retry was planned to start past it.
    assert server.calls == len(made) + 1 and 2 <= server.calls <= 3
    assert all(r.retry_in >= 0.4 for r in made)
    assert all(r.since_first + r.retry_in < 1.0 for r in made)


def test_connection_refused_is_transient_and_retried(options: OptionsFactory) -> None:
    attempts: list[float] = []

    def counting(messages: list[dict[str, str]], *, options: ModelOptions) -> LLMAnswer:
        attempts.append(time.monotonic())
        return litellm_call(messages, options=options)

    with refused_port() as port:
        opts = options(api_base=f"http://127.0.0.1:{port}/v1", max_attempts=3)
        with pytest.raises(TransientModelError):
            extract(SHORT, opts, llm=counting)
    assert len(attempts) == 3


# --- permanent failures ------------------------------------------------------------------


@pytest.mark.parametrize("behaviour", [unauthorized(), bad_request()], ids=["401", "400"])
def test_permanent_errors_fail_after_one_call(
    server: LLMServer, options: OptionsFactory, retries: Retries, behaviour: Behaviour
) -> None:
    server.script(behaviour)
    with pytest.raises(PermanentModelError):
        extract(SHORT, options())
    assert server.calls == 1 and retries() == []


def test_exception_mapping_order() -> None:
    errors = load_litellm().exceptions
    ctx = errors.ContextWindowExceededError(message="too long", model="m", llm_provider="openai")
    policy = errors.ContentPolicyViolationError(message="no", model="m", llm_provider="openai")
    timeout = errors.Timeout(message="slow", model="m", llm_provider="openai")
    assert isinstance(map_litellm_error(ctx), ContextWindowExceeded)
    assert isinstance(map_litellm_error(policy), PermanentModelError)
    assert isinstance(map_litellm_error(timeout), TransientModelError)
    assert isinstance(map_litellm_error(ValueError("odd")), PermanentModelError)


# --- unparseable and odd answers ---------------------------------------------------------


def test_truncated_json_is_asked_again_once_then_fails(
    server: LLMServer, options: OptionsFactory
) -> None:
    server.script(truncated(), truncated())
    with pytest.raises(TruncatedAnswer) as caught:
        extract(SHORT, options())
    assert server.calls == 2
    assert caught.value.reason == "truncated_answer"
    assert "GLEANER_HARVEST_MAX_ANSWER_TOKENS" in str(caught.value)


def test_truncated_then_good_answer_counts_both_calls(
    server: LLMServer, options: OptionsFactory
) -> None:
    server.script(truncated(), answer([note("Uses tabs")]))
    result = extract(SHORT, options())
    assert [n.title for n in result.notes] == ["Uses tabs"]
    assert result.cost.model_calls == 2
    assert (result.cost.prompt_tokens, result.cost.completion_tokens) == (200, 40)


def test_wrong_top_level_shape_is_unparseable(server: LLMServer, options: OptionsFactory) -> None:
    server.script(wrong_shape(), wrong_shape())
    with pytest.raises(UnparseableAnswer):
        extract(SHORT, options())
    assert server.calls == 2


def test_prose_wrapped_json_is_parsed(server: LLMServer, options: OptionsFactory) -> None:
    server.script(prose_wrapped([note("Uses tabs"), note("Likes tea", type="profile")]))
    result = extract(SHORT, options())
    assert [n.title for n in result.notes] == ["Uses tabs", "Likes tea"]
    assert result.cost.model_calls == 1


def test_fenced_json_is_parsed(server: LLMServer, options: OptionsFactory) -> None:
    fenced = "```json\n" + json.dumps({"notes": [note("Uses tabs")]}) + "\n```"
    server.script(text_answer(fenced))
    assert [n.title for n in extract(SHORT, options()).notes] == ["Uses tabs"]


def test_invalid_items_are_dropped_and_counted(server: LLMServer, options: OptionsFactory) -> None:
    items = [
        note("Valid one"),
        note("Unknown type", type="summary"),
        {"type": "preference", "title": "No body"},
        note("Too confident", confidence=2.0),
        note("   ", body="blank title"),
        "just a string",
        {**note("Topics not strings"), "topics": [{"nested": True}]},
    ]
    server.script(Behaviour(content=json.dumps({"notes": items})))
    result = extract(SHORT, options())
    assert [n.title for n in result.notes] == ["Valid one"]
    assert result.cost.items_dropped == 6
    assert result.cost.model_calls == 1  # some valid JSON: no second call


def test_more_than_max_facts_keeps_the_most_confident(
    server: LLMServer, options: OptionsFactory
) -> None:
    confidences = [0.3, 0.9, 0.5, 0.95, 0.1, 0.7, 0.6, 0.8]
    server.script(answer([note(f"Fact {c}", confidence=c) for c in confidences]))
    result = extract(SHORT, options(max_facts=3))
    assert [n.confidence for n in result.notes] == [0.95, 0.9, 0.8]
    assert result.cost.items_dropped == 0


# --- chunking ----------------------------------------------------------------------------


def _notes_per_chunk(body: dict[str, Any]) -> Behaviour:
    numbers = [int(n) for n in re.findall(r"Message (\d+):", sent_transcript(body))]
    first = min(numbers) if numbers else -1
    return answer(
        [
            note(f"Fact from message {first}", confidence=0.5 + first / 1000),
            note("Shared fact", confidence=0.6),
            note("shared   FACT!", confidence=0.4),  # the same title, normalized
        ]
    )


def test_long_transcript_is_chunked_and_merged(server: LLMServer, options: OptionsFactory) -> None:
    server.default = _notes_per_chunk
    long = long_transcript(messages=40, words=60)
    budget = 600
    assert count_tokens(render_transcript(long.messages)) > 3 * budget
    result = extract(long, options(context_tokens=budget, max_facts=3))

    assert result.cost.model_calls == server.calls == result.chunks >= 4
    sent = [sent_transcript(r.body) for r in server.requests]
    assert all(count_tokens(text) <= budget for text in sent)
    # Every message went out exactly once, in order, and each chunk knows its place.
    assert "\n".join(sent) == render_transcript(long.messages)
    assert f"part 1 of {result.chunks}" in server.requests[0].user_text
    # Merged: the shared fact once, then the most confident per-chunk facts, capped at 3.
    titles = [n.title for n in result.notes]
    assert titles[0] == "Shared fact" and len(titles) == 3
    assert titles.count("Shared fact") == 1 and "shared   FACT!" not in titles
    confidences = [n.confidence for n in result.notes]
    assert confidences == sorted(confidences, reverse=True)
    assert result.cost.prompt_tokens == 100 * result.cost.model_calls


def test_context_window_error_rechunks_smaller(server: LLMServer, options: OptionsFactory) -> None:
    limit = 2_500  # characters of transcript this "model" accepts

    def small_context(body: dict[str, Any]) -> Behaviour:
        if len(sent_transcript(body)) > limit:
            return context_exceeded()
        return _notes_per_chunk(body)

    server.default = small_context
    long = long_transcript(messages=24, words=60)
    result = extract(long, options(context_tokens=4_000, max_facts=50))

    sizes = [len(sent_transcript(r.body)) for r in server.requests]
    assert sizes[0] > limit  # one chunk at first, refused
    accepted = [s for s in sizes if s <= limit]
    assert len(accepted) == result.chunks >= 2
    assert len(sizes) - len(accepted) <= MAX_HALVINGS
    assert result.cost.model_calls == len(sizes)
    firsts = {n.title for n in result.notes if n.title.startswith("Fact from")}
    assert len(firsts) == result.chunks  # every accepted chunk contributed


def test_context_window_error_that_never_fits_gives_up(
    server: LLMServer, options: OptionsFactory
) -> None:
    server.default = context_exceeded()
    with pytest.raises(ContextWindowExceeded):
        extract(long_transcript(messages=24, words=60), options(context_tokens=4_000))
    assert 2 <= server.calls <= MAX_HALVINGS + 1


def test_chunking_without_the_tokenizer_uses_a_byte_estimate(tmp_path: Path) -> None:
    # A tokenizer cache without the cl100k file: counts fall back to UTF-8 bytes / 3.
    probe = (
        "from gleaner.harvest.chunks import count_tokens, pack_chunks\n"
        "assert count_tokens('abcdef') == 2\n"
        "assert count_tokens('日本語') == 3  # 9 UTF-8 bytes\n"
        f"block = {''.join(FILLER)!r} * 20 + '日本語' * 50\n"
        "pieces = pack_chunks([block, 'tail'], budget=100)\n"
        "assert ''.join(pieces[:-1]) == block and pieces[-1] == 'tail'\n"
        "assert len(pieces) > 2 and all(count_tokens(p) <= 100 for p in pieces)\n"
        "assert count_tokens('hello world') == 4  # an estimate: cl100k counts 2\n"
    )
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path)}
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_pack_chunks_cuts_an_oversized_block_at_token_bounds() -> None:
    block = " ".join(FILLER * 40)
    pieces = pack_chunks(["short", block, "tail"], budget=200)
    assert pieces[0] == "short" and pieces[-1] == "tail"
    assert "".join(pieces[1:-1]) == block
    assert all(count_tokens(p) <= 200 for p in pieces)


# --- parsing, unit level -----------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"notes": [note("A")]}),
        json.dumps([note("A")]),
        "```\n" + json.dumps({"notes": [note("A")]}) + "\n```",
        "Here {you} go: " + json.dumps({"notes": [note("A")]}) + " -- done [1].",
        "Notes: " + json.dumps([note("A")]),
    ],
    ids=["raw", "bare-list", "plain-fence", "prose-braces", "prose-list"],
)
def test_parse_answer_accepts(text: str) -> None:
    parsed = parse_answer(text, TYPES)
    assert [n.title for n in parsed.notes] == ["A"] and parsed.dropped == 0


@pytest.mark.parametrize(
    "text",
    [
        "",
        "I could not find any durable facts.",
        json.dumps({"notes": None}),
        json.dumps({"note": [note("A")]}),
        json.dumps("notes"),
        json.dumps({"notes": [note("A", topics=["x", "y"])]})[:-30],  # cut inside the item
    ],
    ids=["empty", "prose", "null-notes", "wrong-key", "string", "truncated"],
)
def test_parse_answer_rejects(text: str) -> None:
    with pytest.raises(UnparseableAnswer):
        parse_answer(text, TYPES)


def test_parse_answer_empty_notes_is_a_valid_answer() -> None:
    assert parse_answer('{"notes": []}', TYPES).notes == []


def test_merge_notes_dedupes_by_normalized_title_keeping_the_most_confident() -> None:
    parsed = parse_answer(
        json.dumps(
            [
                note("Uses Tabs", confidence=0.4),
                note("uses tabs.", confidence=0.7),
                note("Other", confidence=0.5),
            ]
        ),
        TYPES,
    )
    merged = merge_notes(parsed.notes, 5)
    assert [(n.title, n.confidence) for n in merged] == [("uses tabs.", 0.7), ("Other", 0.5)]


def test_merge_notes_keeps_notes_of_one_title_that_hold_different_facts() -> None:
    # One answer's notes were merged by title words alone: the VS Code note and the C# note
    # were lost, counted nowhere.
    parsed = parse_answer(
        json.dumps(
            [
                note("Editor preference", body="Uses Vim for Python.", confidence=0.9),
                note("Editor preference", body="Uses VS Code for TypeScript.", confidence=0.8),
                note("Uses C++ at work", confidence=0.7),
                note("Uses C# at work", confidence=0.6),
                note("Editor preference.", body="Uses Vim for Python!", confidence=0.95),
            ]
        ),
        TYPES,
    )
    merged = merge_notes(parsed.notes, 5)
    assert [(n.title, n.body) for n in merged] == [
        ("Editor preference.", "Uses Vim for Python!"),
        ("Editor preference", "Uses VS Code for TypeScript."),
        ("Uses C++ at work", merged[2].body),
        ("Uses C# at work", merged[3].body),
    ]


# --- retry policy, unit level ------------------------------------------------------------


def test_retry_after_header_forms() -> None:
    class Response:
        def __init__(self, headers: dict[str, str]) -> None:
            self.headers = headers

    class Failure(Exception):
        def __init__(self, headers: dict[str, str]) -> None:
            super().__init__("x")
            self.response = Response(headers)

    now = 1_700_000_000.0
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(now + 7))
    assert retry_after_seconds(Failure({"Retry-After": "3"})) == 3
    assert retry_after_seconds(Failure({"retry-after": "1.5"})) == 1.5
    assert retry_after_seconds(Failure({"retry-after-ms": "250"})) == 0.25
    assert retry_after_seconds(Failure({"Retry-After": date}), now=now) == pytest.approx(7)
    assert retry_after_seconds(Failure({"Retry-After": "soon"})) is None
    assert retry_after_seconds(Failure({})) is None
    assert retry_after_seconds(ValueError("no response")) is None


def test_backoff_is_jittered_capped_and_never_below_retry_after() -> None:
    sleeps: list[float] = []
    failures = iter(
        [
            TransientModelError("busy"),
            TransientModelError("busy", retry_after=0.7),
            TransientModelError("busy"),
        ]
    )

    def flaky(messages: list[dict[str, str]], *, options: ModelOptions) -> LLMAnswer:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return LLMAnswer(text="{}")

    opts = ModelOptions(model="x/y", backoff_seconds=0.1, backoff_max_seconds=0.3)
    call_with_retries(flaky, [], opts, sleep=sleeps.append)
    assert len(sleeps) == 3
    assert 0 <= sleeps[0] <= 0.1
    assert sleeps[1] >= 0.7
    assert 0 <= sleeps[2] <= 0.3


def test_permanent_error_is_not_retried() -> None:
    calls: list[int] = []

    def denied(messages: list[dict[str, str]], *, options: ModelOptions) -> LLMAnswer:
        calls.append(1)
        raise PermanentModelError("no")

    with pytest.raises(PermanentModelError):
        call_with_retries(denied, [], ModelOptions(model="x/y"), sleep=lambda _: None)
    assert calls == [1]


# --- configuration -----------------------------------------------------------------------


def fake_llm(messages: list[dict[str, str]], *, options: ModelOptions) -> LLMAnswer:
    """A harvest_llm for resolve_llm's test."""
    return LLMAnswer(text=json.dumps({"notes": [note("From fake")]}), model="fake")


def test_resolve_llm() -> None:
    assert resolve_llm(ModelOptions(model="x/y")) is litellm_call
    assert resolve_llm(ModelOptions(model="x/y", llm="tests.test_model:fake_llm")) is fake_llm
    result = extract(SHORT, ModelOptions(model="x/y", llm="tests.test_model:fake_llm"))
    assert [n.title for n in result.notes] == ["From fake"] and result.model == "fake"


@pytest.mark.parametrize(
    "spec", ["nonsense", "no_such_module_xyz:call", "tests.test_model:missing", "os:sep"]
)
def test_resolve_llm_errors_name_the_setting(spec: str) -> None:
    with pytest.raises(ConfigError, match="GLEANER_HARVEST_LLM"):
        resolve_llm(ModelOptions(model="x/y", llm=spec))


def test_options_from_settings() -> None:
    settings = test_settings(
        harvest_model="openai/gpt-4o-mini",
        harvest_max_facts=3,
        harvest_api_base="http://localhost:4000",
        harvest_api_key="sk-test",
        observation_types="preference,gotcha",
        harvest_timeout_seconds=5,
        harvest_context_tokens=900,
    )
    opts = ModelOptions.from_settings(settings)
    assert opts.model == "openai/gpt-4o-mini"
    assert (opts.max_facts, opts.types) == (3, ("preference", "gotcha"))
    assert opts.api_base == "http://localhost:4000"
    assert opts.api_key is not None and opts.api_key.get_secret_value() == "sk-test"
    assert "sk-test" not in repr(opts)
    assert (opts.timeout_seconds, opts.context_tokens, opts.max_attempts) == (5, 900, 4)
    for option, setting in SETTING_OF.items():
        expected = getattr(settings, setting)
        assert getattr(opts, option) == (tuple(expected) if option == "types" else expected)


def test_options_from_settings_needs_a_model() -> None:
    with pytest.raises(ConfigError, match="GLEANER_HARVEST_MODEL"):
        ModelOptions.from_settings(test_settings())


def test_options_take_their_defaults_and_bounds_from_the_settings() -> None:
    opts = ModelOptions(model="x/y")
    for option, setting in SETTING_OF.items():
        field = Settings.model_fields[setting]
        if option not in ("model", "types"):
            assert getattr(opts, option) == field.default, option
            assert ModelOptions.model_fields[option].metadata == field.metadata, option
    # A bound declared only in Settings holds for the options built directly too.
    with pytest.raises(ValidationError, match="max_answer_tokens"):
        ModelOptions(model="x/y", max_answer_tokens=100_001)
    # Settings built without validation: the error still names the variable.
    unchecked = Settings.model_construct(harvest_model="openai/x", harvest_max_attempts=0)
    with pytest.raises(ConfigError, match="GLEANER_HARVEST_MAX_ATTEMPTS"):
        ModelOptions.from_settings(unchecked)


def test_importing_harvest_model_does_not_import_litellm() -> None:
    code = "import sys, gleaner.harvest.model; sys.exit('litellm' in sys.modules)"
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, check=False, timeout=60)
    assert done.returncode == 0
