"""Hostile input the readers and the answer parser refuse, or read, without crashing.

Damaged zip exports, JSON integers past Python's digit limit, JSON nested past its recursion
limit (in a session file and in a model's answer), lone surrogates and NUL in message text,
and raw line and paragraph separators inside JSON Lines strings. Each is refused as a
transcript or answer error naming where, never quoting the text, or read as it should be;
the rest of a folder is still harvested.
"""

from __future__ import annotations

import io
import json
import struct
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gleaner.conversation import read_conversation
from gleaner.errors import InvalidRequest
from gleaner.harvest.answer import parse_answer
from gleaner.harvest.batch import Summary, harvest_paths, read_all
from gleaner.harvest.errors import TranscriptFormatError, UnparseableAnswer
from gleaner.harvest.job import harvest_transcript
from gleaner.harvest.readers import read_bytes, read_path
from gleaner.store import Store
from gleaner.store.schema.models import HarvestLedger, Memory
from tests.conftest import test_settings
from tests.llm_server import LLMServer, answer, llm_server, note, text_answer
from tests.test_claude_code import ROLLOUT, SESSION, lines
from tests.test_harvest_job import model_settings, transcript

TYPES = ("preference", "decision", "profile", "discovery", "pattern")
# An integer literal Python's JSON parser refuses (a ValueError, not a JSONDecodeError).
DIGITS = sys.get_int_max_str_digits() + 700
BIG = "7" * DIGITS


def write_json(path: Path, value: object) -> Path:
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def native(cid: str, content: str, **extra: Any) -> dict[str, Any]:
    return {
        "conversation_id": cid,
        "owner": "alice",
        "messages": [{"role": "user", "content": content}],
        **extra,
    }


def rows(store: Store, model: type[Any]) -> list[Any]:
    with store.transaction() as session:
        return list(session.execute(select(model)).scalars())


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with llm_server() as running:
        yield running


# --- 1. damaged zip exports ----------------------------------------------------------------


def export_zip(method: int = zipfile.ZIP_DEFLATED) -> bytes:
    """A small Claude export .zip: conversations.json, then users.json."""
    conversations = [
        {
            "uuid": "z1",
            "name": "tea",
            "chat_messages": [{"sender": "human", "text": "I prefer green tea in the morning."}],
        }
    ]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive:
        archive.writestr("conversations.json", json.dumps(conversations))
        archive.writestr("users.json", "{}")
    return buffer.getvalue()


def _end_record(data: bytearray) -> int:
    return data.rfind(b"PK\x05\x06")


def _directory_entry(data: bytearray) -> int:
    """Where the central directory's first entry (conversations.json) starts."""
    return data.find(b"PK\x01\x02")


def name_not_utf8(data: bytearray) -> None:
    """The UTF-8 flag set on a member name that is not UTF-8 (UnicodeDecodeError)."""
    entry = _directory_entry(data)
    flags = struct.unpack_from("<H", data, entry + 8)[0]
    struct.pack_into("<H", data, entry + 8, flags | 0x800)
    data[entry + 46] = 0xC0


def name_starts_with_nul(data: bytearray) -> None:
    """A member name cut to nothing at a NUL (IndexError where zipfile looks at its end)."""
    data[_directory_entry(data) + 46] = 0x00


def directory_offset_past_the_end(data: bytearray) -> None:
    """The directory's offset past the file: members seek before its start (ValueError on
    bytes, OSError EINVAL on a file)."""
    struct.pack_into("<I", data, _end_record(data) + 16, 0xB6AF)


def directory_size_huge(data: bytearray) -> None:
    """The directory's size larger than the file (a negative seek reading it; refused as
    damaged before these fixes too, kept as the case the others sit beside)."""
    struct.pack_into("<I", data, _end_record(data) + 12, 0x7FFFFF00)


# conversations.json's compressed bytes start after its local header (30 bytes) and name.
_FIRST_DATA = 30 + len("conversations.json")


def bzip2_stream_damaged(data: bytearray) -> None:
    """The bzip2 stream's magic spoiled (bz2 raises OSError "Invalid data stream")."""
    data[:] = export_zip(zipfile.ZIP_BZIP2)
    data[_FIRST_DATA] ^= 0xFF


def lzma_stream_damaged(data: bytearray) -> None:
    """The LZMA stream's properties spoiled (lzma.LZMAError)."""
    data[:] = export_zip(zipfile.ZIP_LZMA)
    data[_FIRST_DATA + 4] ^= 0xFF


DAMAGES: dict[str, Callable[[bytearray], None]] = {
    "bzip2_stream_damaged": bzip2_stream_damaged,
    "lzma_stream_damaged": lzma_stream_damaged,
    "name_not_utf8": name_not_utf8,
    "name_starts_with_nul": name_starts_with_nul,
    "directory_offset_past_the_end": directory_offset_past_the_end,
    "directory_size_huge": directory_size_huge,
}


def damaged(kind: str) -> bytes:
    data = bytearray(export_zip())
    DAMAGES[kind](data)
    return bytes(data)


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_a_damaged_zip_is_refused_as_damaged_from_disk_and_from_bytes(
    tmp_path: Path, kind: str
) -> None:
    data = damaged(kind)
    path = tmp_path / "export.zip"
    path.write_bytes(data)
    for read in (lambda: read_path(path), lambda: read_bytes(data, "upload.zip")):
        with pytest.raises(TranscriptFormatError) as info:
            read()
        assert info.value.reason == "bad_transcript"
        assert "a damaged zip archive" in str(info.value)
        assert "sers.json" not in str(info.value)  # no member name, which is the file's text


def test_a_damaged_zip_beside_a_good_export_fails_alone(store: Store, tmp_path: Path) -> None:
    folder = tmp_path / "exports"
    folder.mkdir()
    for kind in ("name_not_utf8", "name_starts_with_nul", "directory_offset_past_the_end"):
        (folder / f"a-{kind}.zip").write_bytes(damaged(kind))
    (folder / "b-good.zip").write_bytes(export_zip())

    summary = harvest_paths(store, [folder], owner="alice", provenance="import")

    assert (summary.harvested, summary.failed) == (1, 3), summary.failures
    assert sorted(f["conversation"] for f in summary.failures) == sorted(
        str(path) for path in folder.glob("a-*.zip")
    )
    assert all("a damaged zip archive" in f["error"] for f in summary.failures)
    assert any("green tea" in n.body.lower() for n in rows(store, Memory))


# --- 2. integers over Python's digit limit in a transcript --------------------------------


def test_a_json_document_with_a_huge_integer_is_not_json(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_text(
        '{"conversation_id": "c-big", "owner": "alice", "messages": '
        f'[{{"role": "user", "content": "x", "at": {BIG}}}]}}',
        encoding="utf-8",
    )
    for read in (lambda: read_path(path), lambda: read_bytes(path.read_bytes(), str(path))):
        with pytest.raises(TranscriptFormatError) as info:
            read()
        message = str(info.value)
        assert info.value.reason == "bad_transcript"
        assert str(path) in message and "not JSON" in message
        assert f"more than {sys.get_int_max_str_digits():,} digits" in message
        assert "7777" not in message


def test_a_json_lines_line_with_a_huge_integer_fails_alone(tmp_path: Path) -> None:
    good = json.dumps(native("c-good", "I prefer tabs over spaces."))
    bad = f'{{"conversation_id": {BIG}, "owner": "alice", "messages": []}}'
    for name in ("talks.jsonl", "talks.json"):  # .json: JSON Lines under another name
        path = tmp_path / name
        path.write_text(f"{good}\n{bad}\n", encoding="utf-8")
        result = read_path(path)
        assert [t.conversation_id for t in result.transcripts] == ["c-good"]
        [(label, reason)] = result.errors
        assert label == f"{path}:2"
        assert reason.startswith("line 2: not JSON (a number of more than")
        assert "7777" not in reason


def test_a_huge_integer_in_a_folder_fails_that_file_only(tmp_path: Path) -> None:
    (tmp_path / "a_bad.json").write_text(
        f'{{"conversation_id": "c-bad", "owner": "alice", "messages": [], "n": {BIG}}}',
        encoding="utf-8",
    )
    write_json(tmp_path / "b_good.json", native("c-good", "I prefer dark mode."))
    summary = Summary()
    found = read_all([tmp_path], summary)
    assert [t.conversation_id for t in found] == ["c-good"]
    [failure] = summary.failures
    assert failure["conversation"] == str(tmp_path / "a_bad.json")
    assert "not JSON" in failure["error"] and "7777" not in failure["error"]


def _session_with(tmp_path: Path, line: str, *, at: int) -> Path:
    raw = SESSION.read_text(encoding="utf-8").split("\n")
    raw.insert(at, line)
    path = tmp_path / "session.jsonl"
    path.write_text("\n".join(raw), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            f'{{"type": "user", "sessionId": "s-1", "n": {BIG}}}',
            "line {n}: not JSON (a number of more than",
        ),
        (
            '{"type": "user", "sessionId": "s-1", "n": ' + "[" * 50_000 + "]" * 50_000 + "}",
            "too_deep: line {n}: JSON nested too deeply to read",
        ),
    ],
    ids=["huge_integer", "nested_too_deeply"],
)
def test_a_session_file_line_python_cannot_parse_fails_the_session(
    tmp_path: Path, line: str, expected: str
) -> None:
    # Among the first lines (they are parsed to tell a session file), and past them.
    for at in (0, 8):
        path = _session_with(tmp_path, line, at=at)
        result = read_path(path)
        assert result.transcripts == []
        [(label, why)] = result.errors
        assert label.startswith(str(path))
        assert why.startswith(expected.format(n=at + 1)), why
        assert "7777" not in why


# --- 3. model answers Python's parser cannot hold ----------------------------------------

DEEP_OPEN = '{"notes": ' + "[" * 50_000
DEEP_CLOSED = '{"notes": ' + "[" * 50_000 + "]" * 50_000 + "}"
BIG_CONFIDENCE = json.dumps({"notes": [note("Adopted a cat")]}).replace(
    '"confidence": 0.8', f'"confidence": {BIG}'
)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (DEEP_OPEN, "nested too deeply"),
        (DEEP_CLOSED, "nested too deeply"),
        (BIG_CONFIDENCE, "a number of more than"),
        (f"Here you go:\n{DEEP_CLOSED}\nDone.", 'holds no JSON object with a "notes" list'),
        (f"Here you go: {BIG_CONFIDENCE}", 'holds no JSON object with a "notes" list'),
        (f"```json\n{DEEP_OPEN}\n```", 'holds no JSON object with a "notes" list'),
    ],
    ids=["deep_open", "deep_closed", "huge_integer", "deep_in_prose", "huge_in_prose", "fenced"],
)
def test_an_answer_python_cannot_parse_is_unparseable(text: str, problem: str) -> None:
    assert "Adopted" in BIG_CONFIDENCE and BIG in BIG_CONFIDENCE  # the fixture is what it says
    with pytest.raises(UnparseableAnswer) as info:
        parse_answer(text, TYPES)
    assert info.value.reason == "unparseable_answer"
    assert problem in info.value.problem
    assert "7777" not in str(info.value) and "[[[" not in str(info.value)


def test_an_unparseable_deep_or_huge_answer_fails_the_transcript(
    make_store: Callable[..., Store], backend: str, server: LLMServer
) -> None:
    store = make_store(backend, **model_settings(server))
    server.script(text_answer(DEEP_OPEN), text_answer(BIG_CONFIDENCE))
    chat = transcript("I adopted a cat last week.")

    failed = harvest_transcript(store, chat)

    assert failed.status == "failed", failed
    assert "unparseable_answer" in (failed.error or "")
    assert "Traceback" not in (failed.error or "") and "7777" not in (failed.error or "")
    assert server.calls == 2  # asked again once, then refused
    assert rows(store, Memory) == [] and rows(store, HarvestLedger) == []

    server.script(answer([note("Adopted a cat", type="profile")]))
    assert harvest_transcript(store, chat).status == "harvested"


# --- 4. lone surrogates and NUL in message text ------------------------------------------


@pytest.mark.parametrize(
    ("conversation", "field"),
    [
        (native("c-sur", "I prefer vim over emacs. \ud800 I decided to use Redis."), "message 1"),
        (native("c-sur", "I prefer vim.", title="Editors \udfff"), "title"),
        (native("c-\ud800", "I prefer vim."), "conversation id"),
    ],
    ids=["content", "title", "conversation_id"],
)
def test_a_lone_surrogate_is_refused_without_quoting_the_text(
    tmp_path: Path, conversation: dict[str, Any], field: str
) -> None:
    # json.dumps writes a lone surrogate as the escape "\ud800", as a hostile file would.
    path = write_json(tmp_path / "sur.json", [conversation, native("c-ok", "I prefer tea.")])
    result = read_path(path)
    assert [t.conversation_id for t in result.transcripts] == ["c-ok"]
    [(_, reason)] = result.errors
    assert reason.startswith(f"{field}") and "lone surrogate" in reason
    assert "vim" not in reason and "Editors" not in reason and "Redis" not in reason


def test_a_lone_surrogate_is_refused_before_a_conversation_is_taken() -> None:
    # What the HTTP API and Gleaner.submit read: refused there, so no job is ever recorded.
    document = json.dumps(native("h-sur", "I prefer vim. \ud800 I decided to use Kafka."))
    with pytest.raises(InvalidRequest) as info:
        read_conversation(document.encode(), test_settings())
    assert info.value.reason == "bad_transcript"
    assert "lone surrogate" in str(info.value)
    assert "vim" not in str(info.value) and "Kafka" not in str(info.value)


def test_nul_is_taken_out_of_message_text_and_the_rest_is_harvested(
    store: Store, tmp_path: Path
) -> None:
    path = write_json(
        tmp_path / "nul.json",
        native("c-nul", "I prefer vim.\u0000 I decided to use Kafka.", title="Edi\u0000tors"),
    )
    [read] = read_path(path).transcripts
    assert read.messages[0].content == "I prefer vim. I decided to use Kafka."
    assert read.title == "Editors"

    summary = harvest_paths(store, [path])

    assert (summary.harvested, summary.failed) == (1, 0), summary.failures
    bodies = " ".join(n.body for n in rows(store, Memory))
    assert "vim" in bodies and "Kafka" in bodies
    assert "\u0000" not in bodies


# --- 5. line and paragraph separators inside JSON Lines strings ----------------------------

SEPARATORS = {"U+2028": "\u2028", "U+2029": "\u2029", "U+0085": "\u0085"}


@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_json_lines_keep_raw_separators_inside_strings(tmp_path: Path, newline: str) -> None:
    path = tmp_path / "talks.jsonl"
    conversations = [
        native(f"ls-{name}", f"I prefer rooibos tea.{char}Second line.")
        for name, char in SEPARATORS.items()
    ]
    # ensure_ascii=False writes the separators raw, as many JSON writers do.
    text = "".join(json.dumps(c, ensure_ascii=False) + newline for c in conversations)
    path.write_bytes(text.encode("utf-8"))

    result = read_path(path)

    assert result.errors == []
    assert [t.messages[0].content for t in result.transcripts] == [
        f"I prefer rooibos tea.{char}Second line." for char in SEPARATORS.values()
    ]


@pytest.mark.parametrize("char", list(SEPARATORS.values()), ids=list(SEPARATORS))
def test_session_files_keep_raw_separators_inside_strings(tmp_path: Path, char: str) -> None:
    said = f"I prefer the Fish shell.{char}Really."
    claude = lines(SESSION)
    for event in claude:
        message = event.get("message")
        if isinstance(message, dict) and message.get("content") == "We deploy on Fridays only.":
            message["content"] = said
    codex = lines(ROLLOUT)
    for event in codex:
        payload = event["payload"]
        assert isinstance(payload, dict)
        for part in payload.get("content") or []:
            if "lockfile with uv" in part.get("text", ""):
                part["text"] = said
    for name, events in (("claude.jsonl", claude), ("rollout.jsonl", codex)):
        path = tmp_path / name
        path.write_text(
            "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in events), encoding="utf-8"
        )
        assert char in path.read_text(encoding="utf-8")

        result = read_path(path)

        assert result.errors == [], name
        [read] = result.transcripts
        assert said in [m.content for m in read.messages], name


def test_a_model_server_body_nested_too_deeply_is_a_failed_call_not_a_crash(
    make_store: Callable[..., Store], server: LLMServer
) -> None:
    from tests.llm_server import Behaviour

    store = make_store("sqlite", **model_settings(server, harvest_max_attempts=1))
    deep = b'{"choices": ' + b"[" * 100_000
    server.script(Behaviour(raw_body=deep), Behaviour(status=500, raw_body=deep))
    failed = harvest_transcript(store, transcript("I adopted a cat last week."))
    assert failed.status == "failed" and "not a chat completion" in (failed.error or "")
    failed = harvest_transcript(store, transcript("I adopted a dog last week."))
    assert failed.status == "failed" and "HTTP 500" in (failed.error or "")
