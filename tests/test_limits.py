"""Bounds on size and cost: a transcript's bytes, messages and model calls, a file's bytes (a
zip's conversations.json inflated), JSON nesting, and what the tokenizer is handed at once.

Every limit here is configured small, so nothing needs gigabytes; the zips that inflate to
500 MB are built as a stream (2 MB on disk) and must be refused unread.
"""

from __future__ import annotations

import json
import os
import random
import string
import subprocess
import sys
import time
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import pytest

import gleaner.harvest.readers.files as files_module
from gleaner.harvest.batch import Summary, harvest_paths, read_all
from gleaner.harvest.chunks import PIECE_CHARS, chunk_sizes, cl100k, count_tokens, pack_chunks
from gleaner.harvest.errors import ContextWindowExceeded, TranscriptFormatError
from gleaner.harvest.imports import estimate
from gleaner.harvest.llm import LLMAnswer, Messages
from gleaner.harvest.model import extract
from gleaner.harvest.options import ModelOptions
from gleaner.harvest.prompt import render_message
from gleaner.harvest.readers import read_path
from gleaner.harvest.transcript import Limits, Message, Transcript
from gleaner.store import ConfigError, Store, load_settings
from tests.conftest import test_settings
from tests.test_readers import chatgpt_node, native, write_json

SMALL = Limits(transcript_bytes=2_000, transcript_messages=6, file_bytes=1_000_000)
SECRET = "SECRET-TEXT "


def big_native(cid: str = "big", size: int = 3_000) -> dict[str, Any]:
    """A native conversation with ``size`` bytes of text that must never show in an error."""
    return native(cid, messages=[{"role": "user", "content": SECRET * (size // len(SECRET))}])


def chatty_messages(count: int) -> list[dict[str, str]]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"}
        for i in range(count)
    ]


# --- one transcript's bytes and messages, while reading ---------------------------------


def test_a_conversation_over_the_byte_limit_is_refused_and_the_rest_read(tmp_path: Path) -> None:
    path = write_json(tmp_path / "t.json", [native("a"), big_native(size=3_000), native("b")])
    result = read_path(path, limits=SMALL)

    assert [t.conversation_id for t in result.transcripts] == ["a", "b"]
    ((label, reason),) = result.errors
    assert label == f"{path}[1] big"
    assert reason.startswith("too_large: conversation too large: ")
    size = len((SECRET * (3_000 // len(SECRET))).encode())
    assert f"{size:,} bytes of message text" in reason
    assert "over the limit of 2,000 (GLEANER_MAX_TRANSCRIPT_BYTES" in reason
    assert "SECRET" not in reason


def _chatgpt(cid: str, turns: int) -> dict[str, Any]:
    nodes = {"n0": chatgpt_node("n0", None, ["n1"])}
    for i in range(1, turns + 1):
        role = "user" if i % 2 else "assistant"
        children = [f"n{i + 1}"] if i < turns else []
        nodes[f"n{i}"] = chatgpt_node(f"n{i}", f"n{i - 1}", children, role, [f"turn {i}"])
    return {"id": cid, "title": cid, "mapping": nodes, "current_node": f"n{turns}"}


def _claude(cid: str, turns: int) -> dict[str, Any]:
    chat = [
        {"sender": "human" if i % 2 == 0 else "assistant", "text": f"turn {i}"}
        for i in range(turns)
    ]
    return {"uuid": cid, "name": cid, "chat_messages": chat}


def _native(cid: str, turns: int) -> dict[str, Any]:
    return native(cid, messages=chatty_messages(turns))


@pytest.mark.parametrize(
    ("make", "suffix"),
    [(_native, ".json"), (_native, ".jsonl"), (_chatgpt, ".json"), (_claude, ".json")],
    ids=["native", "jsonl", "chatgpt", "claude"],
)
def test_a_conversation_over_the_message_limit_is_refused_in_every_format(
    tmp_path: Path, make: Any, suffix: str
) -> None:
    # ChatGPT counts the nodes of the branch followed (its root has no message): 7 of them.
    conversations = [make("ok", 4), make("long", 6 if make is _chatgpt else 7)]
    path = tmp_path / f"conversations{suffix}"
    if suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(c) for c in conversations), encoding="utf-8")
    else:
        write_json(path, conversations)
    result = read_path(path, limits=SMALL)

    assert [t.conversation_id for t in result.transcripts] == ["ok"]
    ((label, reason),) = result.errors
    assert label.endswith(" long")
    assert reason.startswith("too_large: ")
    assert "7 messages, over the limit of 6 (GLEANER_MAX_TRANSCRIPT_MESSAGES" in reason


def test_an_openai_conversation_is_counted_before_its_id_is_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_hashing(*_: object) -> str:
        raise AssertionError("the whole conversation was hashed before its size was checked")

    monkeypatch.setattr("gleaner.harvest.readers.native.openai_id", no_hashing)
    path = write_json(tmp_path / "o.json", {"messages": chatty_messages(50)})
    ((_, reason),) = read_path(path, limits=SMALL).errors
    assert reason.startswith("too_large: ") and "50 messages" in reason


def test_read_all_takes_its_limits_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_json(tmp_path / "a.json", [native("fine"), big_native(size=1_000)])
    monkeypatch.setenv("GLEANER_MAX_TRANSCRIPT_BYTES", "500")
    summary = Summary()
    found = read_all([tmp_path], summary)
    assert [t.conversation_id for t in found] == ["fine"]
    assert [f["error"].split(":")[0] for f in summary.failures] == ["too_large"]


def test_limits_come_from_the_settings_and_bad_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = test_settings(
        harvest_model="openai/x",
        harvest_max_calls=7,
        max_transcript_bytes=123,
        max_transcript_messages=4,
        max_file_bytes=99,
    )
    assert Limits.from_settings(settings) == Limits(
        transcript_bytes=123, transcript_messages=4, file_bytes=99
    )
    assert Limits.from_settings(test_settings(max_zip_entries=5)).zip_entries == 5
    options = ModelOptions.from_settings(settings)
    assert (options.max_calls, options.max_transcript_bytes, options.max_transcript_messages) == (
        7,
        123,
        4,
    )
    defaults = test_settings()
    assert (defaults.harvest_max_calls, defaults.max_transcript_bytes) == (20, 4_000_000)
    assert (defaults.max_transcript_messages, defaults.max_file_bytes) == (10_000, 256_000_000)
    assert Limits.from_settings(defaults) == Limits()
    for name in ("GLEANER_MAX_FILE_BYTES", "GLEANER_MAX_ZIP_ENTRIES", "GLEANER_HARVEST_MAX_CALLS"):
        monkeypatch.setenv(name, "0")
        with pytest.raises(ConfigError, match=name):
            load_settings()
        monkeypatch.delenv(name)


# --- files and zip members -----------------------------------------------------------------


def test_a_file_over_the_file_limit_is_refused_unread_and_the_folder_goes_on(
    tmp_path: Path,
) -> None:
    write_json(tmp_path / "a-big.json", [native(f"c{i}") for i in range(6_000)])
    write_json(tmp_path / "b-good.json", native("good"))
    assert (tmp_path / "a-big.json").stat().st_size > SMALL.file_bytes

    with pytest.raises(TranscriptFormatError) as caught:
        read_path(tmp_path / "a-big.json", limits=SMALL)
    assert caught.value.reason == "too_large"
    assert "over the limit of 1,000,000 (GLEANER_MAX_FILE_BYTES" in str(caught.value)

    summary = Summary()
    found = read_all([tmp_path], summary, limits=SMALL)
    assert [t.conversation_id for t in found] == ["good"]
    ((failure),) = summary.failures
    assert failure["conversation"] == str(tmp_path / "a-big.json")
    assert failure["error"].startswith("too_large: ")


def zeros_zip(
    path: Path,
    megabytes: int,
    *,
    extra: int = 0,
    fill: bytes = b"0",
    head: bytes = b"",
    tail: bytes = b"",
) -> Path:
    """An export zip whose conversations.json is ``megabytes`` MiB of ``fill`` (between
    ``head`` and ``tail``), streamed in so building it holds 1 MiB, plus ``extra`` small
    members."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        with zf.open("conversations.json", "w") as member:
            member.write(head)
            block = fill * (1 << 20)
            for _ in range(megabytes):
                member.write(block)
            member.write(tail)
        for i in range(extra):
            zf.writestr(f"files/{i}.txt", "x")
    return path


def _never_read_whole(*_: object, **__: object) -> bytes:
    raise AssertionError("a zip member was read whole")


def test_a_zip_that_inflates_to_500_mb_is_refused_at_once_with_the_default_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bomb = zeros_zip(tmp_path / "export.zip", 500)
    assert bomb.stat().st_size < 5_000_000
    monkeypatch.setattr(zipfile.ZipFile, "read", _never_read_whole)
    tracemalloc.start()
    try:
        with pytest.raises(TranscriptFormatError) as caught:
            read_path(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.reason == "too_large"
    assert "524,288,000 bytes declared" in str(caught.value)
    assert "GLEANER_MAX_FILE_BYTES" in str(caught.value)
    assert peak < 5_000_000  # refused on the declared size: nothing was inflated


def test_a_zip_member_is_inflated_in_pieces_and_stopped_at_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive_path = zeros_zip(tmp_path / "export.zip", 5)
    # The declared size alone refuses it (5 MB over a 1 MB limit) ...
    with pytest.raises(TranscriptFormatError) as caught:
        read_path(archive_path, limits=SMALL)
    assert caught.value.reason == "too_large"
    # ... and a member that declares less than it holds is still cut at the limit.
    monkeypatch.setattr(zipfile.ZipFile, "read", _never_read_whole)
    tracemalloc.start()
    try:
        with zipfile.ZipFile(archive_path) as archive:
            member = archive.getinfo("conversations.json")
            with pytest.raises(TranscriptFormatError) as inflated:
                files_module._inflate(archive, member, archive_path, 1_000_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert inflated.value.reason == "too_large"
    assert "more than 1,000,000 bytes inflated" in str(inflated.value)
    assert peak < 4_000_000


def test_a_zip_whose_member_lies_about_its_size_stays_bounded(tmp_path: Path) -> None:
    path = zeros_zip(tmp_path / "export.zip", 5)
    data = bytearray(path.read_bytes())
    # The uncompressed size in the local header and in the central directory: 1,000 bytes.
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = data.index(signature) + offset
        data[at : at + 4] = (1_000).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with zipfile.ZipFile(path) as archive:
        assert archive.getinfo("conversations.json").file_size == 1_000
    tracemalloc.start()
    try:
        with pytest.raises(TranscriptFormatError) as caught:
            read_path(path, limits=SMALL)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert caught.value.reason in ("bad_transcript", "too_large")
    assert peak < 4_000_000


def test_a_zip_declaring_too_many_entries_is_refused_unopened(tmp_path: Path) -> None:
    path = zeros_zip(tmp_path / "export.zip", 0, extra=10, head=json.dumps(native("z")).encode())
    assert len(read_path(path, limits=Limits(zip_entries=11)).transcripts) == 1  # at the limit
    with pytest.raises(TranscriptFormatError) as caught:
        read_path(path, limits=Limits(zip_entries=10))
    assert caught.value.reason == "too_large"
    assert "11 entries, over the limit of 10 (GLEANER_MAX_ZIP_ENTRIES" in str(caught.value)


# --- JSON nested too deeply ----------------------------------------------------------------


def test_a_folder_with_one_deeply_nested_file_reads_the_others(tmp_path: Path) -> None:
    (tmp_path / "a-deep.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    (tmp_path / "b-deep-object.json").write_text(
        '{"messages": ' + '{"a": ' * 100_000 + "1" + "}" * 100_001, encoding="utf-8"
    )
    write_json(tmp_path / "c-good.json", native("good"))
    lines = tmp_path / "d-lines.jsonl"
    lines.write_text(
        json.dumps(native("line-1")) + "\n" + "[" * 100_000 + "\n" + json.dumps(native("line-3")),
        encoding="utf-8",
    )

    with pytest.raises(TranscriptFormatError) as caught:
        read_path(tmp_path / "a-deep.json")
    assert caught.value.reason == "too_deep"

    summary = Summary()
    found = read_all([tmp_path], summary)
    assert sorted(t.conversation_id for t in found) == ["good", "line-1", "line-3"]
    errors = {f["conversation"]: f["error"] for f in summary.failures}
    assert errors[str(tmp_path / "a-deep.json")].startswith("too_deep: ")
    assert errors[str(tmp_path / "b-deep-object.json")].startswith("too_deep: ")
    assert errors[f"{lines}:2"] == "too_deep: line 2: JSON nested too deeply to read " + (
        "(no transcript format nests that deep)"
    )


# --- the tokenizer ---------------------------------------------------------------------------


class SpyEncoding:
    """cl100k, recording the longest text it was handed at once."""

    def __init__(self) -> None:
        real = cl100k()
        assert real is not None, "these tests need the cl100k file litellm bundles"
        self.real = real
        self.longest = 0

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        self.longest = max(self.longest, len(text))
        return self.real.encode(text, **kwargs)

    def decode_with_offsets(self, tokens: list[int]) -> tuple[str, list[int]]:
        return self.real.decode_with_offsets(tokens)


@pytest.fixture
def spy() -> SpyEncoding:
    return SpyEncoding()


@pytest.mark.slow
def test_a_long_unbroken_word_is_counted_and_chunked_in_bounded_pieces(spy: SpyEncoding) -> None:
    word = "".join(random.Random(7).choices(string.ascii_letters, k=1_000_000))
    block = f"User: {word}"

    tokens = count_tokens(block, spy)
    assert 0 < spy.longest <= PIECE_CHARS
    exact = len(spy.real.encode(block, disallowed_special=()))
    assert abs(tokens - exact) <= exact // 500  # a hard cut may shift a token, no more

    chunks = pack_chunks(["User: hello", block, "Assistant: ok"], 6_000, spy)
    assert spy.longest <= PIECE_CHARS
    assert chunks[0] == "User: hello" and chunks[-1] == "Assistant: ok"
    assert "".join(chunks[1:-1]) == block
    assert len(chunks) - 2 == -(-tokens // 6_000)
    # Counted on its own a slice's hard cuts fall elsewhere: a token or two either way.
    assert all(count_tokens(c, spy) <= 6_000 + 12 for c in chunks)
    assert sum(chunk_sizes([block], 6_000, spy)) == tokens


def test_a_short_transcript_is_one_chunk_without_being_tokenized(spy: SpyEncoding) -> None:
    # A token is at least one byte: blocks of at most the budget's bytes fit untokenized
    # (a job's chunking did tokenize them, for a count nothing read).
    blocks = ["User: I prefer vim.", "Assistant: noted."]
    assert pack_chunks(blocks, 40, spy) == ["User: I prefer vim.\nAssistant: noted."]
    assert spy.longest == 0
    assert pack_chunks([], 40, spy) == []
    assert len(pack_chunks(blocks, 10, spy)) == 2 and spy.longest > 0  # over: counted


def test_counts_are_exact_where_the_text_has_spaces(spy: SpyEncoding) -> None:
    rng = random.Random(3)
    separators = [" ", "  ", "\n", "\n\n  ", " \t ", "   "]
    text = "".join(
        "".join(rng.choices(string.ascii_letters + "éü日本,.'!", k=rng.randint(1, 12)))
        + rng.choice(separators)
        for _ in range(30_000)
    )
    assert count_tokens(text, spy) == len(spy.real.encode(text, disallowed_special=()))
    assert 0 < spy.longest <= PIECE_CHARS


# A probe's own peak resident memory: VmHWM of its address space, which exec starts anew.
# (getrusage's ru_maxrss is carried over from the parent across fork and exec: a child of a
# pytest process grown to 500 MB by an earlier test reports 500 MB before doing anything.)
PEAK_KIB = (
    "def peak_kib():\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmHWM:'):\n"
    "            return int(line.split()[1])\n"
    "    raise RuntimeError('no VmHWM')\n"
)


@pytest.mark.slow
def test_counting_a_5_mb_word_keeps_memory_flat() -> None:
    # Before: ~46 bytes per character (231 MiB here for 5 MB; a 64 MB word took 3 GiB).
    probe = (
        PEAK_KIB + "from gleaner.harvest.chunks import cl100k, count_tokens, pack_chunks\n"
        "assert cl100k() is not None\n"
        "count_tokens('warm up')\n"
        "before = peak_kib()\n"
        "word = 'a' * 5_000_000\n"
        "assert count_tokens(word) == 625_000\n"
        "assert len(pack_chunks([word], 6_000)) == 105\n"
        "grown = peak_kib() - before\n"
        "print(grown // 1024)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    grown_mib = int(done.stdout.strip())
    assert grown_mib < 40, f"counting a 5 MB word grew the process by {grown_mib} MiB"


# --- model calls ---------------------------------------------------------------------------


class CountingLLM:
    """A model that answers one note per request and counts the requests."""

    def __init__(self, context_chars: int | None = None) -> None:
        self.calls = 0
        self.context_chars = context_chars

    def __call__(self, messages: Messages, *, options: ModelOptions) -> LLMAnswer:
        self.calls += 1
        prompt = messages[-1]["content"]
        if self.context_chars is not None and len(prompt) > self.context_chars:
            raise ContextWindowExceeded("prompt too long")
        note = {"type": "preference", "title": f"Fact {self.calls}", "body": "The user says so."}
        return LLMAnswer(text=json.dumps({"notes": [note]}), prompt_tokens=10)


def long_transcript(messages: int = 40, words: int = 60, cid: str = "long") -> Transcript:
    rng = random.Random(messages)
    vocabulary = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
    return Transcript(
        conversation_id=cid,
        owner="alice",
        messages=[
            Message(
                role="user" if i % 2 == 0 else "assistant",
                content=" ".join(rng.choices(vocabulary, k=words)),
            )
            for i in range(messages)
        ],
    )


def model_options(**overrides: Any) -> ModelOptions:
    return ModelOptions(model="openai/test-model", **overrides)


def test_a_transcript_needing_more_calls_is_refused_before_the_first_call() -> None:
    transcript = long_transcript()
    blocks = [render_message(m) for m in transcript.messages]
    assert len(chunk_sizes(blocks, 200)) > 3
    llm = CountingLLM()
    with pytest.raises(TranscriptFormatError) as caught:
        extract(transcript, model_options(context_tokens=200, max_calls=3), llm)
    assert llm.calls == 0
    assert caught.value.reason == "too_large"
    message = str(caught.value)
    assert "model requests in chunks of 200 tokens" in message
    assert "over the limit of 3 (GLEANER_HARVEST_MAX_CALLS" in message

    # At the limit it runs, one call per chunk: the limit is a bound, not a cut.
    result = extract(transcript, model_options(context_tokens=200, max_calls=50), CountingLLM())
    again = CountingLLM()
    exact = extract(transcript, model_options(context_tokens=200, max_calls=result.chunks), again)
    assert again.calls == exact.cost.model_calls == exact.chunks == result.chunks


def test_rechunking_past_the_call_limit_is_refused() -> None:
    transcript = long_transcript(messages=12)
    # One 4,000-token chunk is refused; halving makes more requests than 3 allow.
    llm = CountingLLM(context_chars=3_000)
    with pytest.raises(TranscriptFormatError) as caught:
        extract(transcript, model_options(context_tokens=4_000, max_calls=3), llm)
    assert caught.value.reason == "too_large" and llm.calls == 1
    # With room for the smaller chunks, the same transcript is harvested.
    roomy = CountingLLM(context_chars=3_000)
    result = extract(transcript, model_options(context_tokens=4_000, max_calls=20), roomy)
    assert result.chunks >= 2 and roomy.calls == result.cost.model_calls <= 20


class NoTokenizer:
    """An encoding that fails the test when anything is tokenized."""

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        raise AssertionError("tokenized before the size was checked")

    def decode_with_offsets(self, tokens: list[int]) -> tuple[str, list[int]]:
        raise AssertionError("tokenized before the size was checked")


def test_extract_checks_bytes_and_messages_before_tokenizing() -> None:
    llm, refuse = CountingLLM(), NoTokenizer()
    big = long_transcript(messages=4, words=400)
    with pytest.raises(AssertionError, match="tokenized"):  # the seam is the one used
        extract(big, model_options(), llm, encoding=refuse)
    with pytest.raises(TranscriptFormatError, match="GLEANER_MAX_TRANSCRIPT_BYTES") as caught:
        extract(big, model_options(max_transcript_bytes=1_000), llm, encoding=refuse)
    assert caught.value.reason == "too_large"
    with pytest.raises(TranscriptFormatError, match="GLEANER_MAX_TRANSCRIPT_MESSAGES"):
        extract(
            long_transcript(messages=30, words=2),
            model_options(max_transcript_messages=20),
            encoding=refuse,
        )
    assert llm.calls == 0


def test_harvest_refuses_the_costly_transcript_and_harvests_the_rest(
    make_store: Any, backend: str, tmp_path: Path
) -> None:
    store: Store = make_store(
        backend, harvest_model="openai/test-model", harvest_context_tokens=200, harvest_max_calls=3
    )
    write_json(tmp_path / "a-long.json", json.loads(long_transcript(cid="long").model_dump_json()))
    write_json(tmp_path / "b-short.json", native("short"))
    llm = CountingLLM()
    summary = harvest_paths(store, [tmp_path], llm=llm)

    assert (summary.harvested, summary.failed) == (1, 1)
    ((failure),) = summary.failures
    assert failure["conversation"] == "long"
    assert failure["error"].startswith("too_large: ")
    assert "GLEANER_HARVEST_MAX_CALLS" in failure["error"]
    assert summary.model_calls == llm.calls == 1  # the short one's only


# --- import --dry-run --------------------------------------------------------------------------


@pytest.mark.slow
def test_dry_run_counts_what_harvest_would_refuse_and_never_expands_it(tmp_path: Path) -> None:
    zeros_zip(tmp_path / "a-export.zip", 5)
    (tmp_path / "b-deep.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    write_json(tmp_path / "c-long.json", json.loads(long_transcript(cid="long").model_dump_json()))
    word = native("word", messages=[{"role": "user", "content": "w" * 600_000}])
    write_json(tmp_path / "d-word-and-good.json", [word, native("good"), big_native(size=60_000)])
    settings = test_settings(
        harvest_model="openai/gpt-4o-mini",
        harvest_context_tokens=50_000,
        harvest_max_calls=3,
        max_file_bytes=1_000_000,
        max_transcript_bytes=50_000,
    )
    started = time.perf_counter()
    found = estimate([tmp_path], settings)
    assert time.perf_counter() - started < 30

    # zip (file limit) and big (byte limit) refused when read; deep unreadable. The 600 KB
    # word is over the byte limit too, so it joins them.
    assert found.unreadable == 1
    assert found.too_large == 3
    assert found.conversations == 2  # long and good
    assert found.model_calls == 2  # one chunk each


def test_dry_run_refuses_a_transcript_needing_too_many_calls(tmp_path: Path) -> None:
    write_json(tmp_path / "long.json", json.loads(long_transcript(cid="long").model_dump_json()))
    word = native("word", messages=[{"role": "user", "content": "w" * 600_000}])
    write_json(tmp_path / "word.json", word)
    write_json(tmp_path / "good.json", native("good"))
    settings = test_settings(
        harvest_model="openai/gpt-4o-mini", harvest_context_tokens=200, harvest_max_calls=3
    )
    found = estimate([tmp_path], settings)
    assert (found.conversations, found.unreadable, found.too_large) == (3, 0, 2)
    assert found.model_calls == 1  # only the good one would be sent


@pytest.mark.slow
def test_import_dry_run_of_a_500_mb_export_answers_at_once_in_bounded_memory(
    tmp_path: Path,
) -> None:
    # conversations.json holds one Claude conversation whose message is a 500 MB word: read
    # whole and tokenized, it took tens of GB (the kernel killed the command).
    export = zeros_zip(
        tmp_path / "export.zip",
        500,
        fill=b"a",
        head=b'[{"uuid": "c1", "chat_messages": [{"sender": "human", "text": "',
        tail=b'"}]}]',
    )
    probe = (
        PEAK_KIB + "import sys\n"
        "from gleaner.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "print(peak_kib() // 1024, file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GLEANER_")}
    args = ["import", str(export), "--owner", "alice", "--dry-run", "--json"]
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", probe, *args],
        cwd=Path(__file__).resolve().parent.parent,
        env={
            **clean,
            "GLEANER_DATABASE_URL": f"sqlite:///{tmp_path}/g.db",
            "GLEANER_HARVEST_MODEL": "openai/gpt-4o-mini",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert (found["too_large"], found["conversations"], found["model_calls"]) == (1, 0, 0)
    peak_mib = int(done.stderr.strip().splitlines()[-1])
    assert peak_mib < 500, f"the dry run peaked at {peak_mib} MiB"
    assert elapsed < 30


def test_a_transcript_from_python_meets_the_limits_before_anything_else(make_store) -> None:
    from gleaner.harvest.job import harvest_transcript

    store = make_store("sqlite", max_transcript_bytes=100)
    big = Transcript(
        conversation_id="big",
        owner="alice",
        messages=[Message(role="user", content="I prefer tabs. " * 20)],
    )
    with pytest.raises(TranscriptFormatError) as caught:
        harvest_transcript(store, big)  # the offline extractor: no model to stop it
    assert caught.value.reason == "too_large" and "tabs" not in str(caught.value)
    assert store.fingerprint(("owner", "alice"))[0] == 0


@pytest.mark.parametrize(
    ("model", "priced"),
    [("openai/gpt-4o-mini", "a price"), ("openai/no-such-model-here", None), (None, 0.0)],
)
def test_dry_run_prices_the_calls_from_litellms_table(
    tmp_path: Path, model: str | None, priced: str | float | None
) -> None:
    # The cost a person decides an import on: from the bundled table (no network), unknown
    # for a model it lacks (never a made-up 0), nothing for the offline harvester.
    write_json(tmp_path / "good.json", native("good"))
    found = estimate([tmp_path], test_settings(harvest_model=model))
    if priced == "a price":
        assert found.model_calls == 1 and found.cost_usd is not None and found.cost_usd > 0
        import litellm

        prompt, completion = litellm.cost_per_token(
            model="openai/gpt-4o-mini",
            prompt_tokens=found.prompt_tokens,
            completion_tokens=found.completion_tokens,
        )
        assert found.cost_usd == round(prompt + completion, 4)
    else:
        assert found.cost_usd == priced
