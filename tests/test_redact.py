"""The privacy strip on transcripts and the content hash that identifies a conversation."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gleaner.harvest.errors import HarvestError
from gleaner.harvest.intake import settle
from gleaner.harvest.queue import new_jobs
from gleaner.harvest.readers import read_path
from gleaner.harvest.redact import (
    REDACTED_ID_PREFIX,
    redact_text,
    redact_transcript,
    transcript_hash,
)
from gleaner.harvest.transcript import Message, Transcript
from gleaner.privacy import REDACTED, redact_private, strip_private

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
INDEX_BLOCK = (
    '<gleaner-memory-index scope="owner:alice" notes="2" seq="7">\n'
    "## Prefers tabs [prefers-tabs]\nIndented with tabs.\n"
    "- Decided to use uv [decided-to-use-uv]\n"
    "</gleaner-memory-index>"
)
SAID = [
    ("user", "I prefer tabs over spaces."),
    ("assistant", "Noted, tabs it is."),
    ("user", "We decided to use uv for the lockfiles."),
    ("assistant", "Done."),
]


def transcript(*messages: tuple[str, str], **fields: object) -> Transcript:
    return Transcript.model_validate(
        {
            "conversation_id": "c1",
            "messages": [{"role": r, "content": c} for r, c in messages],
            **fields,
        }
    )


def test_private_spans_are_redacted_in_messages_and_title() -> None:
    t = transcript(
        ("user", "My token is <private>sk-live-123</private> and I prefer tabs."),
        ("assistant", "Use <PRIVATE>\nmulti\nline</Private> carefully."),
        ("user", "cut off <private>never closed secret"),
        title="Deploy <private>project-x</private>",
    )
    r = redact_transcript(t)
    joined = "\n".join(m.content for m in r.messages) + (r.title or "")
    for secret in ("sk-live-123", "multi", "never closed secret", "project-x"):
        assert secret not in joined
    assert r.messages[0].content == "My token is [REDACTED] and I prefer tabs."
    assert r.title == "Deploy [REDACTED]"
    assert t.messages[0].content.startswith("My token is <private>")  # the input is unchanged


def test_injected_memory_index_is_removed_and_an_emptied_turn_dropped() -> None:
    t = transcript(
        ("system", f"You are helpful.\n{INDEX_BLOCK}"),
        ("user", INDEX_BLOCK),
        ("user", f"{INDEX_BLOCK}\nI prefer tabs."),
        ("assistant", "Sure <gleaner-memory-index scope='x'>\n- cut off mid-prompt"),
    )
    r = redact_transcript(t)
    assert [m.role for m in r.messages] == ["system", "user", "assistant"]
    assert all("gleaner-memory-index" not in m.content for m in r.messages)
    assert all("Decided to use uv" not in m.content for m in r.messages)
    assert r.messages[0].content == "You are helpful.\n"
    assert r.messages[1].content == "\nI prefer tabs."
    assert r.messages[2].content == "Sure "


def test_redaction_keeps_timestamps_ids_and_owner_and_is_idempotent() -> None:
    at = datetime(2024, 5, 1, tzinfo=UTC)
    t = Transcript(
        conversation_id="c9",
        owner="alice",
        ended_at=at,
        messages=[Message(role="user", content="hi <private>x</private>", at=at)],
        source_format="chatgpt",
    )
    r = redact_transcript(t)
    assert (r.conversation_id, r.owner, r.ended_at, r.source_format) == (
        "c9",
        "alice",
        at,
        "chatgpt",
    )
    assert r.messages[0].at == at
    assert redact_transcript(r) == r


def test_private_tag_inside_an_index_block_leaves_no_trace() -> None:
    text = "<gleaner-memory-index>- <private>pin 1234</private></gleaner-memory-index>ok"
    assert redact_text(text) == "ok"


def test_hash_ignores_ids_titles_times_owner_and_source() -> None:
    a = transcript(*SAID)
    b = transcript(
        *SAID,
        conversation_id="other",
        owner="bob",
        title="A title",
        ended_at="2024-01-01T00:00:00Z",
        source_format="claude",
    )
    assert transcript_hash(a) == transcript_hash(b)
    assert len(transcript_hash(a)) == 64
    int(transcript_hash(a), 16)


def test_hash_changes_with_what_was_said_and_who_said_it() -> None:
    base = transcript_hash(transcript(*SAID))
    reworded = [*SAID[:-1], ("assistant", "Done!")]
    swapped = [("assistant", SAID[0][1]), *SAID[1:]]
    reordered = [SAID[2], SAID[3], SAID[0], SAID[1]]
    hashes = {transcript_hash(transcript(*m)) for m in (reworded, swapped, reordered)}
    assert base not in hashes
    assert len(hashes) == 3


def test_hash_is_of_redacted_text() -> None:
    one = transcript(("user", "key <private>AAA</private>"), ("assistant", "ok"))
    two = transcript(("user", "key <private>BBB</private>"), ("assistant", "ok"))
    injected = transcript(("user", f"{INDEX_BLOCK}key [REDACTED]"), ("assistant", "ok"))
    assert transcript_hash(one) == transcript_hash(two) == transcript_hash(injected)


def _same_conversation_in_every_format(tmp_path: Path) -> list[Transcript]:
    """One conversation (with a private span) written as each supported format."""
    said = [
        ("user", "I prefer tabs. My key is <private>sk-1</private>."),
        ("assistant", "Tabs it is."),
    ]
    native = {
        "conversation_id": "n1",
        "owner": "alice",
        "ended_at": "2024-05-01T10:00:00Z",
        "messages": [{"role": r, "content": c, "at": "2024-05-01T09:00:00Z"} for r, c in said],
    }
    openai = {"messages": [{"role": r, "content": [{"type": "text", "text": c}]} for r, c in said]}
    mapping: dict[str, dict[str, Any]] = {
        "root": {"id": "root", "message": None, "parent": None, "children": ["m0"]}
    }
    for i, (role, content) in enumerate(said):
        mapping[f"m{i}"] = {
            "id": f"m{i}",
            "parent": "root" if i == 0 else f"m{i - 1}",
            "children": [f"m{i + 1}"] if i + 1 < len(said) else [],
            "message": {
                "author": {"role": role},
                "create_time": 1714550000.0 + i,
                "content": {"content_type": "text", "parts": [content]},
                "metadata": {},
            },
        }
    chatgpt = [{"id": "g1", "title": "Tabs", "mapping": mapping, "current_node": "m1"}]
    claude = [
        {
            "uuid": "k1",
            "name": "Tabs",
            "created_at": "2024-06-01T00:00:00Z",
            "chat_messages": [
                {
                    "sender": "human" if r == "user" else "assistant",
                    "text": c,
                    "content": [{"type": "text", "text": c}],
                }
                for r, c in said
            ],
        }
    ]
    files = {
        "native.json": json.dumps(native),
        "lines.jsonl": json.dumps(native) + "\n",
        "openai.json": json.dumps(openai),
        "chatgpt/conversations.json": json.dumps(chatgpt),
        "claude/conversations.json": json.dumps(claude),
    }
    transcripts = []
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        transcripts.extend(read_path(path).transcripts)
    return transcripts


def test_hash_is_the_same_for_one_conversation_in_every_format(tmp_path: Path) -> None:
    transcripts = _same_conversation_in_every_format(tmp_path)
    assert sorted(t.source_format for t in transcripts) == [
        "chatgpt",
        "claude",
        "jsonl",
        "native",
        "openai",
    ]
    assert len({transcript_hash(t) for t in transcripts}) == 1
    assert len({transcript_hash(redact_transcript(t)) for t in transcripts}) == 1
    assert all("sk-1" not in m.content for t in transcripts for m in redact_transcript(t).messages)


def test_native_example_private_span_is_stripped() -> None:
    (t,) = read_path(EXAMPLES / "native.json").transcripts
    assert any("hunter2" in m.content for m in t.messages)  # the reader keeps text as is
    redacted = redact_transcript(t)
    assert all("hunter2" not in m.content for m in redacted.messages)
    assert any("[REDACTED]" in m.content for m in redacted.messages)


# the rule: nesting, stray tags, hostile input -------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<private><private>a</private>SECRET</private>", "[REDACTED]"),
        ("x <private>a <PRIVATE>b</private> SECRET </Private > y", "x [REDACTED] y"),
        (
            "<private>a<private>b<private>c</private>SECRET</private>SECRET</private>ok",
            "[REDACTED]ok",
        ),
        ("<private>a<private>b</private> SECRET never closed", "[REDACTED]"),
        ("<private note='x'>\n<private>\n</private>\nSECRET\n</private>\nend", "[REDACTED]\nend"),
        ("<private>a</private><private>b</private>", "[REDACTED][REDACTED]"),
        # An opening tag's attributes end at a "<": a tag there still counts.
        ("<private a <private b>c</private> SECRET</private>d", "[REDACTED]d"),
        ("<private a <private b>c</private> SECRET", "[REDACTED]"),
        # A closing tag with no span open hides nothing: it stays, and opens nothing.
        ("plain </private> text", "plain </private> text"),
        ("a</private><private>SECRET</private>b", "a</private>[REDACTED]b"),
        # Tags cut off before their ">" fail closed.
        ("tail <private", "tail [REDACTED]"),
        ("tail <private reason='pw' SECRET", "tail [REDACTED]"),
        # Not privacy tags.
        ("<privateer> </privately> <private/> ok", "<privateer> </privately> <private/> ok"),
        ("<private>SECRET</private x>", "[REDACTED]"),  # not a closing tag: fails closed
    ],
)
def test_outermost_span_is_redacted_whole_nesting_counted(text: str, expected: str) -> None:
    assert strip_private(text) == expected
    assert strip_private(expected) == expected


def test_redact_private_carries_the_depth_of_an_open_span() -> None:
    assert redact_private("a <private>b <private>c</private>") == ("a [REDACTED]", 1)
    assert redact_private("SECRET</private> after", 1) == (" after", 0)
    assert redact_private("SECRET</private> SECRET", 2) == ("", 1)
    assert redact_private("plain", 0) == ("plain", 0)


@pytest.mark.parametrize(
    ("unit", "expected"),
    [
        ("<private>", REDACTED),
        ("<", None),
        ("<private ", REDACTED),
        ("<private", None),
        ("</private", None),
        ("</private ", None),
        ("<private x=", REDACTED),
        ("<private><private></private>", REDACTED),
    ],
)
def test_hostile_megabyte_inputs_are_redacted_in_one_pass(unit: str, expected: str | None) -> None:
    # Each of these took the old regexes quadratic time (a lazy or [^>]* scan to the end from
    # every tag); the scanner reads the text once.
    text = unit * (1_000_000 // len(unit))
    out = strip_private(text)
    if expected is not None:
        assert out == expected
    else:
        assert len(out) >= len(text) - len("<private")  # left alone, or cut at a final tag
        assert not re.search(r"<private(\s|>|$)", out, re.IGNORECASE)


# a transcript is one stream -------------------------------------------------------------------


def test_a_span_open_at_the_end_of_a_message_goes_on_into_the_next_ones() -> None:
    t = transcript(
        ("user", "My keys: <private>first SECRET-1"),
        ("assistant", "SECRET-2, noted"),
        ("user", "and SECRET-3</private> I prefer tabs."),
        ("assistant", "Tabs it is."),
    )
    r = redact_transcript(t)
    assert [(m.role, m.content) for m in r.messages] == [
        ("user", "My keys: [REDACTED]"),
        ("user", " I prefer tabs."),
        ("assistant", "Tabs it is."),
    ]
    assert redact_transcript(r) == r


def test_a_nested_span_across_messages_closes_at_its_outermost_tag() -> None:
    t = transcript(
        ("user", "<private>a <private>b"),
        ("assistant", "c</private> SECRET"),
        ("user", "SECRET</private>kept"),
    )
    assert [m.content for m in redact_transcript(t).messages] == ["[REDACTED]", "kept"]


def test_a_span_never_closed_redacts_the_rest_of_the_transcript() -> None:
    t = transcript(("user", "ok <private>SECRET"), ("assistant", "SECRET"), ("user", "SECRET"))
    assert [m.content for m in redact_transcript(t).messages] == ["ok [REDACTED]"]


def test_the_title_is_its_own_stream() -> None:
    t = transcript(("user", "hello"), ("assistant", "hi"), title="Plan <private>SECRET")
    r = redact_transcript(t)
    assert r.title == "Plan [REDACTED]"
    assert [m.content for m in r.messages] == ["hello", "hi"]


def test_an_index_block_in_a_private_stream_does_not_close_or_open_spans() -> None:
    t = transcript(
        ("user", "key <private>SECRET"),
        ("system", INDEX_BLOCK),
        ("user", "SECRET</private> I prefer tabs."),
    )
    assert [m.content for m in redact_transcript(t).messages] == [
        "key [REDACTED]",
        " I prefer tabs.",
    ]


def test_hash_sees_a_span_across_messages() -> None:
    one = transcript(("user", "a <private>AAA"), ("assistant", "AAA</private> ok"))
    two = transcript(("user", "a <private>BBB"), ("assistant", "BBB</private> ok"))
    assert transcript_hash(one) == transcript_hash(two)


# ids and other stored fields ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cid", "expected"),
    [
        ("chat-<private>SECRET</private>", "chat-[REDACTED]"),
        ("chat-<private>SECRET", "chat-[REDACTED]"),
        ("<private>a<private>b</private>SECRET</private>-7", "[REDACTED]-7"),
        ("plain-id", "plain-id"),
    ],
)
def test_a_conversation_id_gets_the_same_rule(cid: str, expected: str) -> None:
    r = redact_transcript(transcript(*SAID, conversation_id=cid))
    assert r.conversation_id == expected
    assert redact_transcript(r) == r


@pytest.mark.parametrize(
    "cid", ["<private>SECRET</private>", " <private>SECRET", "<gleaner-memory-index>SECRET"]
)
def test_an_id_that_is_all_private_becomes_a_stable_hash_id(cid: str) -> None:
    r = redact_transcript(transcript(*SAID, conversation_id=cid))
    assert r.conversation_id == f"{REDACTED_ID_PREFIX}{transcript_hash(transcript(*SAID))[:16]}"
    assert "SECRET" not in r.conversation_id
    again = redact_transcript(transcript(*SAID, conversation_id="<private>OTHER</private>"))
    assert again.conversation_id == r.conversation_id  # same conversation, same id
    assert redact_transcript(r) == r


def test_an_id_that_would_outgrow_its_column_becomes_a_hash_id() -> None:
    cid = "x" * 247 + "<private"  # 255 characters; "[REDACTED]" makes it 257
    r = redact_transcript(transcript(*SAID, conversation_id=cid))
    assert r.conversation_id.startswith(REDACTED_ID_PREFIX)
    Transcript.model_validate(r.model_dump(mode="json"))  # still a valid transcript


def test_the_source_path_is_redacted_and_the_owner_is_not() -> None:
    t = transcript(
        *SAID, owner="alice", source_path="/in/<private>client-SECRET</private>/chat.json"
    )
    r = redact_transcript(t)
    assert r.source_path == "/in/[REDACTED]/chat.json"
    assert r.owner == "alice"
    assert "SECRET" not in json.dumps(r.model_dump(mode="json"))


def test_job_records_hold_no_private_text_in_any_field() -> None:
    t = transcript(
        ("user", "deploy key <private>SECRET-1"),
        ("assistant", "SECRET-2</private>ok"),
        ("user", "I prefer tabs."),
        conversation_id="conv-<private>SECRET-3</private>",
        title="<private>SECRET-4",
        owner="alice",
    )
    (job,) = new_jobs([settle(t, None)], provenance="compaction")
    assert job.conversation_id == "conv-[REDACTED]"
    assert job.owner == "alice"
    assert "SECRET" not in json.dumps(job.transcript)
    assert "SECRET" not in job.conversation_id


def test_an_owner_error_does_not_repeat_a_private_conversation_id() -> None:
    t = transcript(*SAID, conversation_id="<private>SECRET</private>")
    with pytest.raises(HarvestError) as info:
        settle(t, None)
    assert info.value.reason == "no_owner"
    assert "SECRET" not in str(info.value)


def test_blank_turns_are_dropped_and_the_rest_kept_in_order() -> None:
    redacted = redact_transcript(
        transcript(
            ("user", "I prefer tabs."),
            ("assistant", "   "),
            ("user", "<private>my pin is 1234</private>"),
            ("user", "Keep <private>this</private> quiet."),
            ("assistant", "Noted."),
        )
    )
    assert [(m.role, m.content) for m in redacted.messages] == [
        ("user", "I prefer tabs."),
        ("user", REDACTED),
        ("user", f"Keep {REDACTED} quiet."),
        ("assistant", "Noted."),
    ]
