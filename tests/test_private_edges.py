"""Private text never escapes through what is stored or shown as given: topic keys, the
refusal of a bad owner, the id of a conversation that has none, and import paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select

from gleaner.harvest.batch import Summary, check_owners, read_all
from gleaner.harvest.errors import HarvestError
from gleaner.harvest.imports import plan_import
from gleaner.harvest.readers import read_path
from gleaner.harvest.redact import redact_transcript
from gleaner.store import InvalidInput, Scope, Store
from gleaner.store.errors import ReasonedError
from gleaner.store.notes import notes
from gleaner.store.schema.tables import IMPORTS
from gleaner.store.text import check_principal
from tests.cli_harness import Cli, cli

__all__ = ["cli"]  # the fixture, used by name

SECRET = "7391"  # short: a hash of it alone would be found by trying every PIN
PRIVATE = f"<private>{SECRET}</private>"
ALICE = Scope.owner("alice")


def test_mem_save_refuses_a_topic_key_holding_private_text(store: Store) -> None:
    # A key is stored, made into the slug and shown to the harvest model as given.
    with pytest.raises(InvalidInput) as caught:
        store.mem_save(
            "alice", "Door code noted.", type="decision", title="Door", topic_key=f"door/{PRIVATE}"
        )
    assert caught.value.reason == "bad_topic_key"
    assert SECRET not in str(caught.value)
    assert store.fingerprint(ALICE) == (0, 0)
    with store.transaction() as session, pytest.raises(InvalidInput, match="<private> tag"):
        notes.write(
            session, store.settings, ALICE, {"title": "Door", "body": "b"}, topic_key=PRIVATE
        )
    batch = store._run(
        notes.write_batch,
        store.settings,
        ALICE,
        [notes.BatchItem({"title": "Door", "body": "b"}, topic_key=f"x {PRIVATE}")],
    )
    assert [r.outcome for r in batch] == ["invalid"]
    assert store.fingerprint(ALICE) == (0, 0)


@pytest.mark.parametrize(
    "owner",
    [f"{PRIVATE} ", f" {PRIVATE}", f"{PRIVATE}\u200b", f"<private>{SECRET}", PRIVATE],
)
def test_a_refused_owner_is_never_quoted_with_its_private_text(owner: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_principal(owner)
    assert caught.value.reason == "bad_owner"
    assert SECRET not in str(caught.value)


def test_the_cli_refuses_such_an_owner_without_echoing_it(cli: Cli, tmp_path: Path) -> None:
    cli.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/g.db")
    ran = cli("search", "--owner", f"{PRIVATE} ", "anything")
    assert ran.code == 2 and "trailing space" in ran.err
    assert SECRET not in ran.err + ran.out


def openai_file(path: Path, pin: str) -> Path:
    said = [
        {"role": "user", "content": f"My door code is <private>{pin}</private>; I prefer tea."},
        {"role": "assistant", "content": "Noted: tea."},
    ]
    path.write_text(json.dumps({"messages": said}))
    return path


def test_an_openai_conversation_id_says_nothing_of_its_private_text(tmp_path: Path) -> None:
    path = tmp_path / "chat.json"
    first = read_path(openai_file(path, SECRET)).transcripts[0].conversation_id
    other = read_path(openai_file(path, "0000")).transcripts[0].conversation_id
    assert first.startswith("openai-") and first == other  # only redacted text counts
    path.write_text(path.read_text().replace("tea", "coffee"))
    assert read_path(path).transcripts[0].conversation_id != first  # what was said counts


def test_import_paths_are_stored_and_shown_redacted(store: Store, tmp_path: Path) -> None:
    folder = tmp_path / f"export {PRIVATE}"
    folder.mkdir(parents=True)  # "</private>" holds a slash: two folders
    openai_file(folder / "chat.json", "1111")
    (folder / "broken.json").write_text(json.dumps([{"role": "user"}, {"nothing": 1}]))
    summary = Summary()
    found = read_all([folder], summary)
    assert len(found) == 1 and summary.failures
    assert SECRET not in json.dumps(summary.failures)
    with pytest.raises(HarvestError) as caught:
        check_owners(found, None)
    assert caught.value.reason == "no_owner" and SECRET not in str(caught.value)
    planned = plan_import(store, folder, owner="alice")
    with store.transaction() as session:
        (source,) = session.execute(
            select(IMPORTS.c.source).where(IMPORTS.c.id == planned.import_id)
        ).scalars()
    assert "[REDACTED]" in source and SECRET not in source


def test_a_private_span_opened_inside_an_injected_index_stays_open() -> None:
    from gleaner.harvest.redact import redact_messages, redact_text
    from gleaner.harvest.transcript import Message

    block = '<gleaner-memory-index scope="owner:alice" notes="1" seq="1">\n- Tea <private>'
    opened = f"{block}</gleaner-memory-index> my PIN is {SECRET}</private> and I like tea."
    assert redact_text(opened) == "[REDACTED] and I like tea."
    balanced = f"{block}x</private></gleaner-memory-index> I like tea."
    assert redact_text(balanced) == " I like tea."  # no trace of the block
    closing = "<private>my PIN <gleaner-memory-index>a</private></gleaner-memory-index> " + SECRET
    assert SECRET not in redact_text(closing)  # a close inside the block closes nothing
    said = [
        Message(role="system", content=f"{block}</gleaner-memory-index>"),
        Message(role="user", content=f"my PIN is {SECRET}</private> Tea, please."),
    ]
    assert SECRET not in json.dumps([m.content for m in redact_messages(said)])


def test_a_span_split_across_content_parts_stays_private(tmp_path: Path) -> None:
    """Readers join a message's text parts: a span opened in one part and closed in a later
    one (an image or tool block between them) redacts everything in between once the
    transcript is redacted, in every format that has parts."""
    parts = [
        {"type": "text", "text": "My PIN is <private>"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": f"{SECRET}</private> and I like tea."},
    ]
    openai = {
        "messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "ok"}]
    }
    claude = [
        {
            "uuid": "k1",
            "chat_messages": [
                {
                    "sender": "human",
                    "content": [
                        {"type": "text", "text": "My PIN is <private>"},
                        {"type": "tool_use", "name": "x", "input": {}},
                        {"type": "text", "text": f"{SECRET}</private> and I like tea."},
                    ],
                }
            ],
        }
    ]
    message = {
        "author": {"role": "user"},
        "content": {
            "content_type": "multimodal_text",
            "parts": ["My PIN is <private>", {"asset_pointer": "file-1"}, f"{SECRET}</private> hi"],
        },
    }
    chatgpt = [
        {
            "id": "g1",
            "mapping": {"m0": {"id": "m0", "parent": None, "children": [], "message": message}},
            "current_node": "m0",
        }
    ]
    files = {
        "openai.json": openai,
        "claude/conversations.json": claude,
        "chatgpt/conversations.json": chatgpt,
    }
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(content), encoding="utf-8")
        (read,) = read_path(path).transcripts
        redacted = redact_transcript(read)  # as every job records it
        said = redacted.messages[0].content
        assert SECRET not in json.dumps(redacted.model_dump(mode="json")), name
        assert said.startswith("My PIN is [REDACTED]"), (name, said)


def _refusals(store: Store) -> list[tuple[str, object]]:
    """Calls that refuse a value the caller sent, each with that value holding a private
    span: every refusal names the value, but never what the span hid."""
    from gleaner import Gleaner

    api = Gleaner(store=store)
    store.write(ALICE, {"title": "Kept", "body": "b"})
    return [
        ("slug", lambda: store.write(ALICE, {"title": "t", "body": "b", "slug": PRIVATE})),
        ("topics", lambda: store.write(ALICE, {"title": "t", "body": "b", "topics": PRIVATE})),
        ("topic", lambda: store.write(ALICE, {"title": "t", "body": "b", "topics": [1, PRIVATE]})),
        ("source", lambda: store.write(ALICE, {"title": "t", "body": "b", "source": PRIVATE})),
        ("pinned", lambda: store.write(ALICE, {"title": "t", "body": "b", "pinned": PRIVATE})),
        ("provenance", lambda: store.write(ALICE, {"title": "t", "body": "b"}, provenance=PRIVATE)),
        ("type", lambda: store.mem_save("alice", "c", type=PRIVATE, title="t")),
        ("read", lambda: store.read(ALICE, PRIVATE)),
        ("history", lambda: store.history(ALICE, PRIVATE)),
        ("pin", lambda: store.pin(ALICE, PRIVATE)),
        ("link", lambda: store.link(ALICE, "kept", PRIVATE, "related")),
        ("rel", lambda: store.link(ALICE, "kept", "kept", PRIVATE)),
        ("status", lambda: store.list_notes(ALICE, status=PRIVATE)),
        ("list limit", lambda: store.list_notes(ALICE, limit=PRIVATE)),  # type: ignore[arg-type]
        ("search limit", lambda: store.search(ALICE, "kept", limit=PRIVATE)),  # type: ignore[arg-type]
        ("scope kind", lambda: store.search((PRIVATE, "alice"), "kept")),
        ("revoke", lambda: store.revoke_api_key(PRIVATE)),
        ("job", lambda: api.job(PRIVATE)),
    ]


def test_a_refusal_never_quotes_what_a_private_span_hid(store: Store) -> None:
    for name, refused_call in _refusals(store):
        with pytest.raises(ReasonedError) as caught:
            refused_call()  # type: ignore[operator]
        assert SECRET not in str(caught.value), (name, str(caught.value))
        assert "[REDACTED]" in str(caught.value), (name, str(caught.value))
