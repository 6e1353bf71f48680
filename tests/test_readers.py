"""Format detection and every transcript reader, on realistic samples and the examples/."""

from __future__ import annotations

import json
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gleaner.harvest.batch import Summary, read_all
from gleaner.harvest.errors import TranscriptFormatError
from gleaner.harvest.readers import ReadResult, iter_paths, load, read_path
from gleaner.harvest.redact import redact_transcript
from gleaner.harvest.transcript import DEFAULT_LIMITS

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def write_json(path: Path, value: object) -> Path:
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def native(cid: str = "c1", **extra: Any) -> dict[str, Any]:
    return {
        "conversation_id": cid,
        "owner": "alice",
        "messages": [
            {"role": "user", "content": "I prefer tabs over spaces.", "at": "2024-05-01T10:00:00Z"},
            {"role": "assistant", "content": "Noted: tabs.", "at": "2024-05-01T10:00:05Z"},
        ],
        **extra,
    }


def chatgpt_node(
    node_id: str,
    parent: str | None,
    children: list[str],
    role: str | None = None,
    parts: list[Any] | None = None,
    *,
    content_type: str = "text",
    created: float | None = None,
    hidden: bool = False,
) -> dict[str, Any]:
    message = None
    if role is not None:
        message = {
            "id": node_id,
            "author": {"role": role, "metadata": {}},
            "create_time": created,
            "content": {"content_type": content_type, "parts": parts or []},
            "metadata": {"is_visually_hidden_from_conversation": True} if hidden else {},
            "recipient": "all",
        }
    return {"id": node_id, "message": message, "parent": parent, "children": children}


def chatgpt_branching_conversation() -> dict[str, Any]:
    """The user edited their second message: two children of one node, the edit is current."""
    nodes = [
        chatgpt_node("root", None, ["sys"]),
        chatgpt_node("sys", "root", ["u1"], "system", ["You are ChatGPT."], hidden=True),
        chatgpt_node("u1", "sys", ["a1"], "user", ["Which queue should we use?"], created=1.7e9),
        chatgpt_node("a1", "u1", ["u2-old", "u2-new"], "assistant", ["RabbitMQ or Redis."]),
        chatgpt_node("u2-old", "a1", ["a2-old"], "user", ["ABANDONED: we will use RabbitMQ."]),
        chatgpt_node("a2-old", "u2-old", [], "assistant", ["ABANDONED reply about RabbitMQ."]),
        chatgpt_node("u2-new", "a1", ["a2-new"], "user", ["Let's go with Redis streams."]),
        chatgpt_node("a2-new", "u2-new", ["u3"], "assistant", ["Redis streams it is."]),
        chatgpt_node(
            "u3",
            "a2-new",
            ["a3"],
            "user",
            [
                {"content_type": "image_asset_pointer", "asset_pointer": "file-service://x"},
                "Here is the dashboard screenshot.",
            ],
            content_type="multimodal_text",
        ),
        chatgpt_node("a3", "u3", [], "assistant", ["The consumer lag looks fine."]),
    ]
    return {
        "title": "Queue choice",
        "create_time": 1714730400.0,
        "update_time": 1714731214.5,
        "mapping": {n["id"]: n for n in nodes},
        "current_node": "a3",
        "conversation_id": "conv-queue",
        "id": "conv-queue",
    }


def claude_conversation(uuid: str = "claude-1") -> dict[str, Any]:
    return {
        "uuid": uuid,
        "name": "Pooling",
        "created_at": "2024-06-03T14:02:11.503918Z",
        "updated_at": "2024-06-03T14:21:47Z",
        "chat_messages": [
            {
                "sender": "human",
                "created_at": "2024-06-03T14:02:11Z",
                "text": "We decided to run PgBouncer as a sidecar.",
                "content": [{"type": "text", "text": "We decided to run PgBouncer as a sidecar."}],
            },
            {
                "sender": "assistant",
                "created_at": "2024-06-03T14:02:40Z",
                "text": "Good. TOOL PLACEHOLDER Transaction mode is the usual choice.",
                "content": [
                    {"type": "thinking", "thinking": "SECRET REASONING"},
                    {"type": "text", "text": "Good."},
                    {"type": "tool_use", "name": "web_search", "input": {"q": "pgbouncer"}},
                    {"type": "text", "text": "Transaction mode is the usual choice."},
                ],
            },
            {"sender": "human", "created_at": "2024-06-03T14:03:00Z", "text": "Thanks!"},
        ],
    }


def only(result: ReadResult) -> Any:
    assert result.errors == []
    assert len(result.transcripts) == 1
    return result.transcripts[0]


# native -------------------------------------------------------------------------------------


def test_native_object_keeps_owner_times_and_source(tmp_path: Path) -> None:
    path = write_json(tmp_path / "t.json", native(ended_at="2024-05-01T10:05:00+02:00"))
    t = only(read_path(path, default_owner="someone-else"))
    assert t.conversation_id == "c1"
    assert t.owner == "alice"  # the transcript's own owner beats the default
    assert t.source_format == "native"
    assert t.source_path == str(path)
    assert t.ended_at == datetime(2024, 5, 1, 8, 5, tzinfo=UTC)
    assert [m.role for m in t.messages] == ["user", "assistant"]
    assert t.messages[0].at == datetime(2024, 5, 1, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize("scope", ["bob", {"kind": "owner", "id": "bob"}])
def test_native_scope_gives_the_owner(tmp_path: Path, scope: object) -> None:
    obj = native()
    del obj["owner"]
    obj["scope"] = scope
    assert only(read_path(write_json(tmp_path / "t.json", obj))).owner == "bob"


def test_native_without_owner_takes_the_default_or_none(tmp_path: Path) -> None:
    obj = native()
    del obj["owner"]
    path = write_json(tmp_path / "t.json", obj)
    assert only(read_path(path, default_owner="carol")).owner == "carol"
    assert only(read_path(path)).owner is None


def test_native_list_skips_one_bad_conversation_and_reads_the_rest(tmp_path: Path) -> None:
    bad_role = native("c2")
    bad_role["messages"][0]["role"] = "robot"
    empty = native("c3", messages=[{"role": "user", "content": "   "}])
    global_scope = native("c4", scope={"kind": "global", "id": ""})
    del global_scope["owner"]
    path = write_json(tmp_path / "many.json", [native("c1"), bad_role, empty, global_scope])
    result = read_path(path)
    assert [t.conversation_id for t in result.transcripts] == ["c1"]
    labels = [label for label, _ in result.errors]
    assert labels == [f"{path}[1] c2", f"{path}[2] c3", f"{path}[3] c4"]
    reasons = dict(result.errors)
    assert reasons[f"{path}[1] c2"] == (
        "message 1: role must be one of user, assistant, system, tool "
        "(got a string of 5 characters)"
    )
    assert "empty conversation" in reasons[f"{path}[2] c3"]
    assert "scope kind" in reasons[f"{path}[3] c4"]


def test_native_bad_timestamp_is_a_bad_conversation(tmp_path: Path) -> None:
    path = write_json(tmp_path / "t.json", [native("ok"), native("late", ended_at="yesterday")])
    result = read_path(path)
    assert [t.conversation_id for t in result.transcripts] == ["ok"]
    assert "ended_at" in result.errors[0][1]


# JSON Lines ---------------------------------------------------------------------------------


def test_jsonl_reads_each_line_and_reports_a_bad_line_by_number(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    lines = [json.dumps(native("a")), "{not json", "", json.dumps(native("b")), "[1, 2]"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = read_path(path)
    assert [t.conversation_id for t in result.transcripts] == ["a", "b"]
    assert {t.source_format for t in result.transcripts} == {"jsonl"}
    assert [label for label, _ in result.errors] == [f"{path}:2", f"{path}:5"]
    assert result.errors[0][1].startswith("line 2: not JSON")
    assert result.errors[1][1].startswith("line 5:")


def test_jsonl_bad_conversation_keeps_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    broken = native("b", messages="not a list")
    path.write_text(f"{json.dumps(native('a'))}\n{json.dumps(broken)}\n", encoding="utf-8")
    result = read_path(path)
    assert [t.conversation_id for t in result.transcripts] == ["a"]
    assert result.errors == [(f"{path}:2 b", "line 2: messages must be a list")]


def test_json_lines_under_a_json_name_are_detected(tmp_path: Path) -> None:
    path = tmp_path / "batch.json"
    path.write_text(f"{json.dumps(native('a'))}\n{json.dumps(native('b'))}\n", encoding="utf-8")
    result = read_path(path)
    assert [t.conversation_id for t in result.transcripts] == ["a", "b"]


# OpenAI -------------------------------------------------------------------------------------


def test_openai_messages_with_parts_and_a_derived_stable_id(tmp_path: Path) -> None:
    obj = {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "I prefer short answers."},
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                    {"type": "text", "text": "Thanks."},
                ],
            },
            {"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]},
            {"role": "assistant", "content": "Will do."},
        ],
    }
    path = write_json(tmp_path / "chat.json", obj)
    t = only(read_path(path, default_owner="dan"))
    assert t.source_format == "openai"
    assert t.owner == "dan"
    assert [m.role for m in t.messages] == ["system", "user", "assistant"]
    assert t.messages[1].content == "I prefer short answers.\nThanks."
    assert t.conversation_id.startswith("openai-")
    assert only(read_path(path)).conversation_id == t.conversation_id  # stable
    other = write_json(tmp_path / "other.json", obj)
    assert only(read_path(other)).conversation_id != t.conversation_id  # the path counts


def test_openai_bare_message_list(tmp_path: Path) -> None:
    msgs = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    t = only(read_path(write_json(tmp_path / "m.json", msgs)))
    assert t.source_format == "openai"
    assert [m.content for m in t.messages] == ["hello", "hi"]


# ChatGPT ------------------------------------------------------------------------------------


def test_chatgpt_follows_only_the_current_branch(tmp_path: Path) -> None:
    path = write_json(tmp_path / "conversations.json", [chatgpt_branching_conversation()])
    t = only(read_path(path))
    text = "\n".join(m.content for m in t.messages)
    assert "Let's go with Redis streams." in text
    assert "ABANDONED" not in text
    assert "You are ChatGPT." not in text  # hidden system node
    assert [m.role for m in t.messages] == ["user", "assistant"] * 3
    assert t.conversation_id == "conv-queue"
    assert t.title == "Queue choice"
    assert t.owner is None
    assert t.source_format == "chatgpt"
    assert t.started_at == datetime.fromtimestamp(1714730400.0, UTC)
    assert t.ended_at == datetime.fromtimestamp(1714731214.5, UTC)
    assert t.messages[0].at == datetime.fromtimestamp(1.7e9, UTC)


def test_chatgpt_current_node_on_the_other_branch(tmp_path: Path) -> None:
    conv = chatgpt_branching_conversation()
    conv["current_node"] = "a2-old"
    t = only(read_path(write_json(tmp_path / "conversations.json", [conv])))
    text = "\n".join(m.content for m in t.messages)
    assert "ABANDONED: we will use RabbitMQ." in text
    assert "Redis streams" not in text


def test_chatgpt_non_text_parts_and_content_types_are_skipped(tmp_path: Path) -> None:
    conv = chatgpt_branching_conversation()
    mapping = conv["mapping"]
    mapping["a3"]["children"] = ["code", "user-ctx"]
    mapping["code"] = chatgpt_node("code", "a3", ["out"], "assistant", None, content_type="code")
    mapping["code"]["message"]["content"] = {"content_type": "code", "text": "print(1)"}
    mapping["out"] = chatgpt_node("out", "code", ["last"], "tool", ["1"])
    mapping["last"] = chatgpt_node("last", "out", [], "user", ["Thanks, that works."])
    mapping["user-ctx"] = chatgpt_node("user-ctx", "a3", [], "user", ["x"])
    conv["current_node"] = "last"
    t = only(read_path(write_json(tmp_path / "conversations.json", [conv])))
    contents = [m.content for m in t.messages]
    assert "Here is the dashboard screenshot." in contents  # the string part survives
    assert not any("asset_pointer" in c or "file-service" in c for c in contents)
    assert "print(1)" not in contents
    assert "1" not in contents  # tool output
    assert contents[-1] == "Thanks, that works."


def test_chatgpt_without_current_node_takes_the_newest_edit(tmp_path: Path) -> None:
    conv = chatgpt_branching_conversation()
    del conv["current_node"]
    t = only(read_path(write_json(tmp_path / "conversations.json", [conv])))
    text = "\n".join(m.content for m in t.messages)
    assert "Redis streams" in text
    assert "ABANDONED" not in text


def test_chatgpt_deep_tree_is_read_without_recursion(tmp_path: Path) -> None:
    depth = 5000
    nodes = {"n0": chatgpt_node("n0", None, ["n1"])}
    for i in range(1, depth + 1):
        role = "user" if i % 2 else "assistant"
        children = [f"n{i + 1}"] if i < depth else []
        nodes[f"n{i}"] = chatgpt_node(f"n{i}", f"n{i - 1}", children, role, [f"turn {i}"])
    conv = {"id": "deep", "title": "deep", "mapping": nodes, "current_node": f"n{depth}"}
    t = only(read_path(write_json(tmp_path / "conversations.json", [conv])))
    assert len(t.messages) == depth
    assert t.messages[0].content == "turn 1"
    assert t.messages[-1].content == f"turn {depth}"


def test_chatgpt_export_zip_reads_only_conversations_json(tmp_path: Path) -> None:
    path = tmp_path / "chatgpt-export.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("user.json", json.dumps({"email": "a@example.com"}))
        archive.writestr("chat.html", "<html></html>")
        archive.writestr("conversations.json", json.dumps([chatgpt_branching_conversation()]))
    t = only(read_path(path))
    assert t.source_format == "chatgpt"
    assert t.source_path == str(path)
    assert "Let's go with Redis streams." in [m.content for m in t.messages]


def test_zip_without_conversations_json_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "photos.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("cat.txt", "meow")
    with pytest.raises(TranscriptFormatError, match=r"photos\.zip.*conversations\.json"):
        read_path(path)


def test_chatgpt_export_with_one_broken_conversation(tmp_path: Path) -> None:
    broken: dict[str, Any] = {"id": "broken", "title": "x", "mapping": {}, "current_node": None}
    hidden_only = {
        "id": "sys-only",
        "mapping": {"s": chatgpt_node("s", None, [], "system", ["system prompt"])},
    }
    path = write_json(
        tmp_path / "conversations.json", [broken, chatgpt_branching_conversation(), hidden_only]
    )
    result = read_path(path)
    assert [t.conversation_id for t in result.transcripts] == ["conv-queue"]
    assert [label for label, _ in result.errors] == [
        f"{path}[0] broken",
        f"{path}[2] sys-only",
    ]


def test_chatgpt_voice_mode_turns_keep_what_was_said(tmp_path: Path) -> None:
    # Voice mode stores what was said as an audio_transcription part beside the audio's
    # pointer: only string parts were read, and a voice-only conversation was "empty".
    conv = chatgpt_branching_conversation()
    voice = [
        {"content_type": "audio_transcription", "text": "I moved to Porto.", "direction": "in"},
        {"content_type": "audio_asset_pointer", "asset_pointer": "sediment://file_a"},
    ]
    conv["mapping"]["u3"]["message"]["content"] = {
        "content_type": "multimodal_text",
        "parts": voice,
    }
    reply = [{"content_type": "audio_transcription", "text": "Porto, noted.", "direction": "out"}]
    conv["mapping"]["a3"]["message"]["content"] = {
        "content_type": "multimodal_text",
        "parts": reply,
    }
    t = only(read_path(write_json(tmp_path / "conversations.json", [conv])))
    assert [m.content for m in t.messages][-2:] == ["I moved to Porto.", "Porto, noted."]
    assert not any("sediment" in m.content for m in t.messages)


def test_a_list_or_object_where_a_name_belongs_does_not_stop_the_file(tmp_path: Path) -> None:
    # A list or an object where an export has a content type, a part type or a node id was
    # looked up in a set or dict: TypeError (unhashable) ended the whole file's import.
    odd_type = chatgpt_branching_conversation()
    odd_type["mapping"]["u3"]["message"]["content"]["content_type"] = {"type": "text"}
    odd_parent = {**chatgpt_branching_conversation(), "id": "c2", "conversation_id": "c2"}
    odd_parent["mapping"]["root"]["parent"] = ["root"]
    del odd_parent["current_node"]  # so the root is looked for through the parents
    odd_part = native("n1")
    odd_part["messages"][0]["content"] = [
        {"type": ["text"], "text": "A part of no known type."},
        {"type": "text", "text": "I prefer tabs."},
    ]
    path = write_json(tmp_path / "conversations.json", [odd_type, odd_parent, odd_part])
    result = read_path(path)
    assert result.errors == []
    first, second, third = result.transcripts
    assert "Here is the dashboard screenshot." not in [m.content for m in first.messages]
    assert second.messages[-1].content == "The consumer lag looks fine."
    assert third.messages[0].content == "I prefer tabs."


def test_a_reader_tripping_on_a_value_fails_that_conversation_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whatever type check a reader still lacks: its TypeError fails the one conversation
    # (logged), never the file or the folder's import, and the reason quotes no value.
    real = load._READERS["native"]

    def tripping(obj: Any, **kwargs: Any) -> Any:
        if obj["conversation_id"] == "odd":
            return obj["messages"] in frozenset({"text"})  # a list looked up in a set: TypeError
        return real(obj, **kwargs)

    monkeypatch.setitem(load._READERS, "native", tripping)
    path = write_json(tmp_path / "n.json", [native("odd"), native("fine")])
    folder_file = write_json(tmp_path / "m.json", native("other"))
    summary = Summary()
    found = read_all([tmp_path], summary, limits=DEFAULT_LIMITS)
    assert sorted(t.conversation_id for t in found) == ["fine", "other"]
    assert summary.failures == [
        {
            "conversation": f"{path}[0] odd",
            "error": "a field holds a JSON value of an unexpected type (TypeError)",
        }
    ]
    assert folder_file.exists()


# Claude -------------------------------------------------------------------------------------


def test_claude_export_reads_text_blocks_only(tmp_path: Path) -> None:
    path = write_json(tmp_path / "conversations.json", [claude_conversation()])
    t = only(read_path(path, default_owner="erin"))
    assert t.source_format == "claude"
    assert t.conversation_id == "claude-1"
    assert t.title == "Pooling"
    assert t.owner == "erin"
    assert [m.role for m in t.messages] == ["user", "assistant", "user"]
    assert t.messages[1].content == "Good.\nTransaction mode is the usual choice."
    assert t.messages[2].content == "Thanks!"  # no content blocks: the flat text
    assert "SECRET REASONING" not in t.messages[1].content
    assert "PLACEHOLDER" not in t.messages[1].content
    assert t.started_at == datetime(2024, 6, 3, 14, 2, 11, 503918, tzinfo=UTC)
    assert t.ended_at == datetime(2024, 6, 3, 14, 21, 47, tzinfo=UTC)
    assert t.messages[0].at == datetime(2024, 6, 3, 14, 2, 11, tzinfo=UTC)


def test_claude_export_keeps_pasted_text_from_attachments(tmp_path: Path) -> None:
    # claude.ai turns a long paste into an attachment's extracted_content and leaves the
    # message's text empty: that paste was lost.
    conv = claude_conversation()
    first, _, last = conv["chat_messages"]
    first["text"] = ""
    first["content"] = [{"type": "text", "text": ""}]
    paste = "My notes: we run PgBouncer as a sidecar."
    first["attachments"] = [
        {"file_name": "paste.txt", "file_type": "txt", "extracted_content": paste},
        {"file_name": "diagram.png", "file_type": "png"},
    ]
    first["files"] = [{"file_name": "diagram.png"}]
    last["attachments"] = [{"file_name": "", "extracted_content": "Pasted too."}]
    t = only(read_path(write_json(tmp_path / "conversations.json", [conv])))
    assert t.messages[0].content == f"[attached: paste.txt]\n{paste}"
    assert t.messages[2].content == "Thanks!\n\n[attached]\nPasted too."


def claude_tree(leaf: str | None = None) -> dict[str, Any]:
    """A claude.ai conversation as its flat list keeps it: the user edited their second
    message (h2 -> h2-new) and retried the answer to it (a2-new -> a2-retry)."""

    def message(uuid: str, parent: str, sender: str, text: str) -> dict[str, Any]:
        return {"uuid": uuid, "parent_message_uuid": parent, "sender": sender, "text": text}

    chat = [
        message("h1", "00000000-0000-4000-8000-000000000000", "human", "Which database?"),
        message("a1", "h1", "assistant", "Postgres or Mongo."),
        message("h2", "a1", "human", "ABANDONED: we will use MongoDB."),
        message("a2", "h2", "assistant", "ABANDONED reply."),
        message("h2-new", "a1", "human", "We will use PostgreSQL."),
        message("a2-new", "h2-new", "assistant", "ABANDONED answer, retried."),
        message("a2-retry", "h2-new", "assistant", "PostgreSQL it is."),
    ]
    conversation: dict[str, Any] = {"uuid": "tree", "chat_messages": chat}
    if leaf is not None:
        conversation["current_leaf_message_uuid"] = leaf
    return conversation


@pytest.mark.parametrize("leaf", [None, "a2-retry", "gone"])
def test_claude_export_reads_the_branch_the_user_ended_on(tmp_path: Path, leaf: str | None) -> None:
    # Every edit and retry sits in the one list: all of it was read, so an abandoned
    # decision reached the model as if it stood.
    t = only(read_path(write_json(tmp_path / "conversations.json", [claude_tree(leaf)])))
    assert [m.content for m in t.messages] == [
        "Which database?",
        "Postgres or Mongo.",
        "We will use PostgreSQL.",
        "PostgreSQL it is.",
    ]


def test_claude_export_without_a_whole_chain_is_read_whole(tmp_path: Path) -> None:
    older = claude_tree("a2")  # the leaf the export names wins over the newest
    broken = {**claude_tree(), "uuid": "broken"}  # a parent the list lacks: lose nothing
    broken["chat_messages"][0]["parent_message_uuid"] = "not-in-the-export"
    flat = {**claude_tree(), "uuid": "flat"}  # no parents at all: the list as it is
    for item in flat["chat_messages"]:
        del item["parent_message_uuid"]
    path = write_json(tmp_path / "conversations.json", [older, broken, flat])
    first, second, third = read_path(path).transcripts
    assert [m.content for m in first.messages][2:] == [
        "ABANDONED: we will use MongoDB.",
        "ABANDONED reply.",
    ]
    assert len(second.messages) == len(third.messages) == 7


def test_claude_export_skips_an_empty_conversation(tmp_path: Path) -> None:
    empty = {"uuid": "empty", "name": "", "chat_messages": []}
    path = write_json(tmp_path / "conversations.json", [empty, claude_conversation("ok")])
    result = read_path(path)
    assert [t.conversation_id for t in result.transcripts] == ["ok"]
    assert result.errors == [(f"{path}[0] empty", "empty conversation: no user or assistant text")]


def test_claude_export_zip(tmp_path: Path) -> None:
    path = tmp_path / "data-2024-06-03.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("users.json", "[]")
        archive.writestr("conversations.json", json.dumps([claude_conversation()]))
    assert only(read_path(path)).source_format == "claude"


# not transcripts ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("notes.json", '{"hello": "world"}'),
        ("numbers.json", "[1, 2, 3]"),
        ("empty.json", ""),
        ("blank.jsonl", "\n  \n"),
        ("readme.json", "# Title\n\nnot json at all\n"),
        ("list.json", "[]"),
        ("scalar.json", '"just a string"'),
        ("lines.jsonl", '{"a": 1}\n{"b": 2}\n'),
        ("binary.json", b"\xff\xfe\x00garbage"),
    ],
)
def test_a_non_transcript_file_names_the_file_and_what_was_expected(
    tmp_path: Path, name: str, content: str | bytes
) -> None:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(TranscriptFormatError) as info:
        read_path(path)
    message = str(info.value)
    assert str(path) in message
    assert "expected one of" in message
    assert "ChatGPT" in message
    assert info.value.reason == "bad_transcript"


def test_a_missing_file_is_a_transcript_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.json"
    with pytest.raises(TranscriptFormatError, match=r"nowhere\.json"):
        read_path(path)


# iter_paths ---------------------------------------------------------------------------------


def test_iter_paths_expands_folders_sorted_and_keeps_files(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "deep").mkdir(parents=True)
    (tmp_path / ".git").mkdir()
    for name in ("b/2.jsonl", "a/deep/1.json", "a/x.zip", "a/skip.txt", ".git/c.json", "z.JSON"):
        (tmp_path / name).write_text("{}")
    export = tmp_path / "export"
    export.mkdir()
    for name in ("conversations.json", "user.json", "projects.json"):
        (export / name).write_text("[]")
    single = tmp_path / "a" / "skip.txt"
    got = list(iter_paths([tmp_path, single]))
    assert got == [
        tmp_path / "a" / "deep" / "1.json",
        tmp_path / "a" / "x.zip",
        tmp_path / "b" / "2.jsonl",
        export / "conversations.json",
        tmp_path / "z.JSON",
        single,
    ]


# the examples -------------------------------------------------------------------------------


def test_every_example_reads_cleanly() -> None:
    formats: dict[str, set[str]] = {}
    for path in iter_paths([EXAMPLES]):
        result = read_path(path, default_owner="example-owner")
        assert result.errors == [], path
        assert result.transcripts, path
        formats[path.relative_to(EXAMPLES).as_posix()] = {
            t.source_format for t in result.transcripts
        }
    assert formats == {
        "native.json": {"native"},
        "conversations.jsonl": {"jsonl"},
        "openai-messages.json": {"openai"},
        "chatgpt-export/conversations.json": {"chatgpt"},
        "claude-export/conversations.json": {"claude"},
    }


def test_examples_keep_their_owners() -> None:
    assert only(read_path(EXAMPLES / "native.json")).owner == "alice"
    owners = [t.owner for t in read_path(EXAMPLES / "conversations.jsonl").transcripts]
    assert owners == ["bob", "bob", "carol"]
    chatgpt = read_path(EXAMPLES / "chatgpt-export" / "conversations.json")
    assert {t.owner for t in chatgpt.transcripts} == {None}


def test_chatgpt_example_resolves_its_edited_message() -> None:
    first = read_path(EXAMPLES / "chatgpt-export" / "conversations.json").transcripts[0]
    text = "\n".join(m.content for m in first.messages)
    assert "FastAPI and a small React admin" in text
    assert "Django and its built-in admin" not in text
    assert "file-service://" not in text


# errors and labels never repeat what the file says ------------------------------------------

PRIVATE_VALUE = "<private>SECRET-1</private> SECRET-2"


def _with_message_field(key: str, value: object) -> dict[str, Any]:
    obj = native()
    obj["messages"][1][key] = value
    return obj


def _chatgpt_with_node_time(value: object) -> dict[str, Any]:
    obj = chatgpt_branching_conversation()
    obj["mapping"]["a2-new"]["message"]["create_time"] = value
    return obj


def _claude_with_message_time(value: object) -> dict[str, Any]:
    obj = claude_conversation()
    obj["chat_messages"][2]["created_at"] = value
    return obj


@pytest.mark.parametrize(
    ("obj", "says"),
    [
        (native(ended_at=PRIVATE_VALUE), "ended_at is not an ISO 8601 timestamp (got a string of"),
        (native(started_at=["SECRET"]), "started_at is not a timestamp (got a list of 1 items)"),
        (native(ended_at=1e300), "ended_at is not a timestamp (got a number out of range)"),
        (_with_message_field("at", PRIVATE_VALUE), "message 2 at is not an ISO 8601 timestamp"),
        (_with_message_field("role", PRIVATE_VALUE), "message 2: role must be one of user,"),
        (_with_message_field("content", 42), "message 2 content must be text or a list of parts"),
        (native(owner=["SECRET"]), "owner must be a non-empty string (got a list of 1 items)"),
        (native(scope="SECRET-bob"), "owner and scope name different owners"),
        (native(scope={"kind": PRIVATE_VALUE}), "scope kind must be 'owner' (got a string of"),
        (native(scope={"kind": "owner", "id": {"SECRET": 1}}), "(got an object of 1 keys)"),
        (native(title=["SECRET"]), "title must be a string (got a list of 1 items)"),
        (native("<private>SECRET</private>" + "x" * 300), "conversation_id: String should have at"),
        ({**native(), "conversation_id": ["SECRET"]}, "conversation_id must be a string"),
        ({**chatgpt_branching_conversation(), "update_time": PRIVATE_VALUE}, "update_time is"),
        (_chatgpt_with_node_time(PRIVATE_VALUE), "node 6 create_time is not an ISO 8601"),
        (_claude_with_message_time(PRIVATE_VALUE), "chat message 3 created_at is not an ISO"),
        ({**claude_conversation(), "name": {"SECRET": True}}, "name must be a string (got an"),
    ],
)
def test_a_reader_error_names_field_and_position_not_the_value(
    tmp_path: Path, obj: dict[str, Any], says: str
) -> None:
    path = write_json(tmp_path / "conversations.json", [native("fine"), obj])
    result = read_path(path)
    assert [t.conversation_id for t in result.transcripts] == ["fine"]
    ((label, reason),) = result.errors
    assert label.startswith(f"{path}[1]")
    assert says in reason
    assert "SECRET" not in label + reason
    assert "private" not in (label + reason).lower()


def test_a_label_shows_the_conversation_id_under_the_privacy_rule(tmp_path: Path) -> None:
    broken = native("chat-<private>SECRET</private>", messages="not a list")
    long_id = native("y" * 400 + "SECRET", messages="not a list")
    path = write_json(tmp_path / "t.json", [broken, long_id])
    labels = [label for label, _ in read_path(path).errors]
    assert labels == [f"{path}[0] chat-[REDACTED]", f"{path}[1] {'y' * 255}…"]
    lines = tmp_path / "t.jsonl"
    lines.write_text(json.dumps(broken) + "\n", encoding="utf-8")
    assert read_path(lines).errors == [
        (f"{lines}:1 chat-[REDACTED]", "line 1: messages must be a list")
    ]


def test_a_damaged_zip_error_does_not_repeat_member_names(tmp_path: Path) -> None:
    path = tmp_path / "export.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("conversations.json", json.dumps([claude_conversation()]))
    data = path.read_bytes()
    # The local header's name no longer matches the directory's, which zipfile reports by
    # quoting both names.
    path.write_bytes(data.replace(b"conversations.json", b"SECRETsations.json", 1))
    with pytest.raises(TranscriptFormatError) as info:
        read_path(path)
    assert "damaged zip archive" in str(info.value)
    assert "SECRET" not in str(info.value)


def test_a_private_conversation_id_is_redacted_as_it_is_read(tmp_path: Path) -> None:
    partly = native("chat-<private>SECRET</private>")
    wholly = native("<private>SECRET</private>")
    path = write_json(tmp_path / "t.json", [partly, wholly])
    first, second = read_path(path).transcripts
    assert first.conversation_id == "chat-[REDACTED]"
    assert second.conversation_id.startswith("redacted-")
    assert second.conversation_id == redact_transcript(second).conversation_id
    assert first.messages[0].content == "I prefer tabs over spaces."  # text stays as it is


@pytest.mark.parametrize("shape", ["chatgpt", "claude"])
@pytest.mark.parametrize(
    "named", [{"owner": "bob"}, {"scope": "bob"}, {"owner": "bob", "scope": "bob"}]
)
def test_an_export_shaped_conversation_that_names_an_owner_keeps_it(
    tmp_path: Path, shape: str, named: dict[str, str]
) -> None:
    # Read as an export, it was filed under the default owner (the caller's --owner).
    obj = chatgpt_branching_conversation() if shape == "chatgpt" else claude_conversation()
    path = write_json(tmp_path / "t.json", {**obj, **named})
    assert only(read_path(path, default_owner="alice")).owner == "bob"
    plain = write_json(tmp_path / "plain.json", obj)
    assert only(read_path(plain, default_owner="alice")).owner == "alice"
    clash = write_json(tmp_path / "clash.json", {**obj, "owner": "bob", "scope": "carol"})
    assert read_path(clash, default_owner="alice").transcripts == []
