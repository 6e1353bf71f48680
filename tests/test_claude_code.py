"""Coding-agent sessions as transcripts: Claude Code session files and Codex CLI rollouts,
read from files and from standard input (`gleaner harvest -`, `gleaner enqueue -`)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from gleaner.cli import main
from gleaner.harvest.readers import read_path
from gleaner.harvest.readers.sessions import session_kind
from gleaner.store import Scope, Store
from tests.cli_harness import redis_url_for

DATA = Path(__file__).parent / "data"
SESSION = DATA / "claude_code_session.jsonl"
ROLLOUT = DATA / "codex_rollout.jsonl"
SESSION_ID = "5d2c7a10-3f4e-4b1a-9c55-0e7f2b8d9a11"
# Text in the fixtures that must never reach the model: tool output and input, thinking and
# reasoning, the harness's own text, an abandoned branch, a sub-agent's turns, summaries.
HIDDEN = (
    "TOOL-OUTPUT-SECRET",
    "TOOL-INPUT",
    "SECRET-THOUGHT",
    "REASONING-TEXT",
    "HARNESS-TEXT",
    "ABANDONED-BRANCH",
    "SIDECHAIN",
    "COMPACT-SUMMARY",
    "CONTEXT-TEXT",
    "DEVELOPER-TEXT",
    "Caveat:",
    "Request interrupted",
    "command-name",
    "settings.py",
)


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_lines(path: Path, events: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def test_claude_code_session_keeps_what_was_said() -> None:
    result = read_path(SESSION)
    assert result.errors == []
    [transcript] = result.transcripts
    assert transcript.conversation_id == SESSION_ID
    assert transcript.owner is None  # the file names none: --owner fills it in
    assert transcript.source_format == "claude-code"
    assert transcript.title == "Connection pooling for the shop API"
    assert [m.role for m in transcript.messages] == [
        "user",
        "assistant",
        "user",
        "user",
        "assistant",
    ]
    user = [m.content for m in transcript.messages if m.role == "user"]
    assert user[0].startswith("We run PgBouncer as a sidecar in transaction mode.")
    assert user[1] == "Thanks. From now on always run the tests with pytest -x before committing."
    assert user[2] == "We deploy on Fridays only."
    # One assistant message for the reply written a block a line and split by tool calls,
    # its tools on one closing line, names only.
    reply = transcript.messages[1].content
    assert reply.splitlines() == [
        "Let me look at the database settings.",
        "psycopg prepares statements server-side; set prepare_threshold to None behind PgBouncer.",
        "[tools: Read, Bash]",
    ]
    everything = "\n".join(m.content for m in transcript.messages)
    for hidden in HIDDEN:
        assert hidden not in everything, hidden
    assert transcript.started_at is not None and transcript.ended_at is not None
    assert transcript.started_at.isoformat() == "2025-06-03T09:00:01+00:00"
    assert transcript.ended_at.isoformat() == "2025-06-03T09:05:33+00:00"


def test_codex_rollout_keeps_what_was_said() -> None:
    [transcript] = read_path(ROLLOUT).transcripts
    assert transcript.conversation_id == "0199a2d7-41c4-78b1-b7cc-a45d62a89cd5"
    assert transcript.source_format == "codex"
    assert [(m.role, m.content) for m in transcript.messages] == [
        ("user", "I keep the lockfile with uv, never pip-tools. Why does CI fail?"),
        (
            "assistant",
            "CI installs with pip; switched the job to uv sync.\n[tools: shell, apply_patch]",
        ),
        ("user", "Our staging database is called shop_stage."),
        ("assistant", "Understood."),
    ]


def test_session_files_are_told_from_other_json_lines(tmp_path: Path) -> None:
    assert session_kind(SESSION.read_text()) == "claude-code"
    assert session_kind(ROLLOUT.read_text()) == "codex"
    native = {
        "conversation_id": "c1",
        "owner": "alice",
        "messages": [{"role": "user", "content": "hi"}],
    }
    assert session_kind(json.dumps(native)) is None
    # A session file under any name, even .json, is one conversation.
    renamed = tmp_path / "session.json"
    renamed.write_text(SESSION.read_text())
    assert [t.conversation_id for t in read_path(renamed).transcripts] == [SESSION_ID]


def test_bad_session_files_fail_clearly(tmp_path: Path) -> None:
    events = lines(SESSION)
    # A sub-agent's own file: every turn is a sidechain.
    agent = [
        {**e, "isSidechain": True}
        for e in events
        if e.get("type") in ("user", "assistant") and not e.get("isMeta")
    ]
    result = read_path(write_lines(tmp_path / "agent-a1.jsonl", agent))
    assert result.transcripts == []
    assert "sub-agent" in result.errors[0][1]
    # A line cut off in the middle of the file fails the conversation, naming the line...
    broken = tmp_path / "broken.jsonl"
    text = SESSION.read_text().splitlines()
    broken.write_text("\n".join([*text[:5], '{"type": "user", "mess', *text[5:]]) + "\n")
    result = read_path(broken)
    assert result.transcripts == [] and "line 6: not JSON" in result.errors[0][1]
    # ... but a last line cut off while it was written (a session still open) is skipped.
    open_session = tmp_path / "open.jsonl"
    open_session.write_text(SESSION.read_text() + '{"type": "assistant", "mess')
    assert [t.conversation_id for t in read_path(open_session).transcripts] == [SESSION_ID]
    # No user or assistant text at all.
    empty = [e for e in events if e.get("type") not in ("user", "assistant")]
    result = read_path(
        write_lines(tmp_path / "empty.jsonl", [*empty, {**events[2], "isMeta": True}])
    )
    assert result.transcripts == [] and "empty conversation" in result.errors[0][1]


def test_a_list_or_object_where_a_type_belongs_is_passed_over(tmp_path: Path) -> None:
    # The file's first line was looked up by its type while the format was told: an object
    # there raised TypeError (unhashable) and ended the whole import.
    odd = {"type": {}, "sessionId": SESSION_ID, "uuid": "odd"}
    result = read_path(write_lines(tmp_path / "s.jsonl", [odd, *lines(SESSION)]))
    assert result.errors == []
    assert [t.messages for t in result.transcripts] == [
        t.messages for t in read_path(SESSION).transcripts
    ]
    rollout = lines(ROLLOUT)
    at = rollout[0]["timestamp"]
    odd_lines = [
        {"timestamp": at, "type": ["response_item"], "payload": {}},
        {
            "timestamp": at,
            "type": "response_item",
            "payload": {"type": ["message"], "role": "user"},
        },
        {
            "timestamp": at,
            "type": "response_item",
            "payload": {
                "type": "message",
                "role": "user",
                "content": [{"type": {}, "text": "odd part"}],
            },
        },
    ]
    result = read_path(write_lines(tmp_path / "r.jsonl", [rollout[0], *odd_lines, *rollout[1:]]))
    assert result.errors == []
    assert [t.messages for t in result.transcripts] == [
        t.messages for t in read_path(ROLLOUT).transcripts
    ]


def test_a_slash_commands_arguments_are_what_the_user_said(tmp_path: Path) -> None:
    # The wrapper is the harness's, the arguments are what the person typed: they were
    # dropped with it.
    def turn(uuid: str, parent: str | None, role: str, content: str) -> dict[str, object]:
        message = {"role": role, "content": content}
        return {
            "type": role,
            "sessionId": "s-args",
            "uuid": uuid,
            "parentUuid": parent,
            "timestamp": "2024-01-01T00:00:00Z",
            "message": message,
        }

    said = "the login bug; we decided on PostgreSQL advisory locks"
    events = [
        turn(
            "a",
            None,
            "user",
            "<command-message>fix-issue is running…</command-message>\n"
            f"<command-name>/fix-issue</command-name>\n<command-args>{said}</command-args>",
        ),
        turn("b", "a", "assistant", "Looking into it."),
        turn(
            "c", "b", "user", "<command-name>/clear</command-name>\n<command-args></command-args>"
        ),
        turn(
            "d",
            "c",
            "user",
            "<local-command-stdout><command-args>x</command-args></local-command-stdout>",
        ),
        turn("e", "d", "user", "I prefer vim."),
    ]
    [transcript] = read_path(write_lines(tmp_path / "s.jsonl", events)).transcripts
    contents = [m.content for m in transcript.messages]
    assert contents == [f"/fix-issue {said}", "Looking into it.", "I prefer vim."]


@pytest.fixture
def cli_env(store: Store, monkeypatch: pytest.MonkeyPatch) -> Store:
    """The CLI pointed at the test store's database through the environment."""
    for name in [k for k in os.environ if k.startswith("GLEANER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("GLEANER_DATABASE_URL", store.database_url)
    return store


def test_harvest_reads_a_claude_code_session_on_stdin(
    cli_env: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(SESSION.read_text()))
    assert main(["harvest", "-", "--owner", "alice", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["harvested"], summary["failed"]) == (1, 0)
    [report] = summary["conversations"]
    assert report["conversation_id"] == SESSION_ID and report["owner"] == "alice"
    notes = cli_env.list_notes(Scope.owner("alice"))
    assert notes, "the offline harvester finds the user's facts"
    assert any("psycopg 3" in n.title for n in notes)
    for note in notes:
        for hidden in HIDDEN:
            assert hidden not in note.title + note.body, (hidden, note.slug)
    assert cli_env.list_notes(Scope.owner("bob")) == []

    # The same session again: already harvested, at no cost.
    monkeypatch.setattr(sys, "stdin", io.StringIO(SESSION.read_text()))
    assert main(["harvest", "-", "--owner", "alice", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["skipped"] == 1

    # A session names no owner: without --owner it is a usage error, nothing written.
    monkeypatch.setattr(sys, "stdin", io.StringIO(ROLLOUT.read_text()))
    assert main(["harvest", "-"]) == 2
    assert "--owner" in capsys.readouterr().err
    monkeypatch.setattr(sys, "stdin", io.StringIO("not a transcript"))
    assert main(["harvest", "-", "--owner", "alice"]) == 1
    assert "<stdin>: not a transcript file" in capsys.readouterr().err
    assert main(["harvest", "-", "-", "--owner", "alice"]) == 2


def test_enqueue_reads_a_session_on_stdin(
    cli_env: Store,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    worker_id: str,
) -> None:
    broker = redis_url_for(worker_id)
    monkeypatch.setenv("GLEANER_BROKER_URL", broker)
    monkeypatch.setattr(sys, "stdin", io.StringIO(SESSION.read_text()))
    queue = redis.Redis.from_url(broker)
    queue.delete("harvest")
    try:
        assert main(["enqueue", "-", "--owner", "alice", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        [job_id] = out["job_ids"]
        job = cli_env.job(job_id)
        assert job is not None
        assert (job.owner, job.conversation_id, job.state) == ("alice", SESSION_ID, "pending")
        assert job_id.encode() in b"".join(queue.lrange("harvest", 0, -1))
    finally:
        queue.delete("harvest")


@pytest.mark.slow
def test_harvest_from_stdin_as_a_subprocess(tmp_path: Path, sqlite_template: Path) -> None:
    """`gleaner harvest -` in a real process, the session piped in (about 2 s)."""
    import shutil

    db = tmp_path / "g.db"
    shutil.copy(sqlite_template, db)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLEANER_")}
    done = subprocess.run(
        [sys.executable, "-m", "gleaner.cli", "harvest", "-", "--owner", "alice"],
        input=SESSION.read_bytes(),
        env={**env, "GLEANER_DATABASE_URL": f"sqlite:///{db}"},
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert b"harvested 1" in done.stdout
    store = Store(f"sqlite:///{db}")
    assert any("psycopg 3" in n.title for n in store.list_notes(Scope.owner("alice")))
    store.dispose()


def hook_json(transcript: Path) -> str:
    """What Claude Code passes a SessionEnd hook on standard input."""
    return json.dumps(
        {
            "session_id": SESSION_ID,
            "transcript_path": str(transcript),
            "cwd": "/home/dev/shop",
            "hook_event_name": "SessionEnd",
            "reason": "prompt_input_exit",
        }
    )


def test_claude_code_hook_hands_the_session_over(
    cli_env: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # No broker: harvested in process.
    monkeypatch.setattr(sys, "stdin", io.StringIO(hook_json(SESSION)))
    assert main(["hook", "claude-code", "--owner", "alice", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["harvested"] == 1
    assert summary["conversations"][0]["conversation_id"] == SESSION_ID
    assert any("psycopg 3" in n.title for n in cli_env.list_notes(Scope.owner("alice")))
    # Input that is not the hook's: one line, exit 2, nothing read or written.
    for raw in ("not json", "[]", json.dumps({"session_id": SESSION_ID})):
        monkeypatch.setattr(sys, "stdin", io.StringIO(raw))
        assert main(["hook", "claude-code", "--owner", "alice"]) == 2
        assert "hook input" in capsys.readouterr().err
    monkeypatch.setattr(sys, "stdin", io.StringIO(hook_json(Path("/nonexistent/s.jsonl"))))
    assert main(["hook", "claude-code", "--owner", "alice"]) == 2
    assert "no such file or folder" in capsys.readouterr().err


@pytest.mark.slow
def test_claude_code_hook_as_a_subprocess(tmp_path: Path, sqlite_template: Path) -> None:
    """The hook command as Claude Code runs it: a process, the hook JSON piped in (~2 s)."""
    import shutil

    db = tmp_path / "g.db"
    shutil.copy(sqlite_template, db)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLEANER_")}
    done = subprocess.run(
        [sys.executable, "-m", "gleaner.cli", "hook", "claude-code", "--owner", "alice"],
        input=hook_json(SESSION),
        text=True,
        env={**env, "GLEANER_DATABASE_URL": f"sqlite:///{db}"},
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "harvested 1" in done.stdout
