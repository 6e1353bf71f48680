"""Reader for a Claude Code session file (``~/.claude/projects/<project>/<session-id>.jsonl``).

The file is JSON Lines, one event a line: ``user`` and ``assistant`` turns (``message`` with a
``role`` and ``content``, a string or a list of ``text``, ``tool_use``, ``tool_result``,
``thinking`` and image blocks), and bookkeeping (``summary``, ``system``, ``progress``,
``file-history-snapshot``, ``queue-operation``). Each event has a ``uuid`` and the
``parentUuid`` it follows; the whole file is one conversation whose id is its ``sessionId``.

What the model is shown, and why: tool output is what a program printed, not something the
user said, so only what the person typed and what the assistant wrote are kept:

- user text, and a slash command's arguments with its name (``/fix-issue the login bug``);
  tool results, images and harness text (slash-command wrappers and their output,
  ``!`` shell input and output, ``<system-reminder>`` blocks, "[Request interrupted ...]",
  meta and compaction-summary turns) are left out;
- assistant text; ``thinking`` is left out, and the tools the assistant called become one
  line naming them (``[tools: Bash, Edit]``) with no arguments, which can hold whole files;
- sub-agent turns (``isSidechain``) are left out: their prompts are the agent's, not the
  user's; a file holding only those is refused;
- only the branch that ends at the last turn is read: an edited or rewound message leaves
  its abandoned branch in the file, and a compaction boundary is followed back through its
  ``logicalParentUuid``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gleaner.harvest.readers._common import bad, build, name_of, optional_str, parse_time
from gleaner.harvest.readers.turns import Turns
from gleaner.harvest.transcript import DEFAULT_LIMITS, Limits, Role, Transcript

TURNS: dict[str, Role] = {"user": "user", "assistant": "assistant"}
# Line types that only Claude Code writes: with ``sessionId`` on user and assistant lines,
# how a session file is told from JSON Lines of other conversations.
BOOKKEEPING = frozenset(
    {"summary", "system", "progress", "file-history-snapshot", "queue-operation", "custom-title"}
)
# Text the harness puts in the user's turn: slash commands and their output, `!` shell
# commands, reminders, interruption notices. Not what the person said.
_HARNESS_PREFIXES = (
    "<command-name>",
    "<command-message>",
    "<command-args>",
    "<local-command-stdout>",
    "<local-command-stderr>",
    "<local-command-caveat>",
    "<bash-input>",
    "<bash-stdout>",
    "<bash-stderr>",
    "<system-reminder>",
    "<user-prompt-submit-hook>",
    "[Request interrupted by user",
)
_REMINDER = re.compile(r"<system-reminder>.*?(?:</system-reminder>|\Z)", re.DOTALL)
# A slash command's wrapper: its name and the arguments the person typed after it.
_COMMAND_WRAPPERS = ("<command-name>", "<command-message>", "<command-args>")
_COMMAND_NAME = re.compile(r"<command-name>(.*?)</command-name>", re.DOTALL)
_COMMAND_ARGS = re.compile(r"<command-args>(.*?)</command-args>", re.DOTALL)


def is_session_event(obj: object) -> bool:
    """Whether one JSON line is a Claude Code session event (see ``BOOKKEEPING``)."""
    if not isinstance(obj, Mapping):
        return False
    kind = name_of(obj.get("type"))
    if kind in TURNS:
        return isinstance(obj.get("message"), Mapping) and "sessionId" in obj
    return kind in BOOKKEEPING and ("sessionId" in obj or "leafUuid" in obj or "messageId" in obj)


def _said(text: str) -> str:
    """User or assistant text without the harness's own text."""
    if "<system-reminder>" in text:
        text = _REMINDER.sub("", text)
    stripped = text.lstrip()
    if stripped.startswith(_COMMAND_WRAPPERS):
        return _typed_command(stripped)
    return "" if stripped.startswith(_HARNESS_PREFIXES) else text


def _typed_command(text: str) -> str:
    """What the person typed of a slash command, as typed (``/fix-issue the login bug``), or
    "" for a command without arguments: the arguments are their words, the wrapper is not."""
    args = _COMMAND_ARGS.search(text)
    if args is None or not args.group(1).strip():
        return ""
    name = _COMMAND_NAME.search(text)
    command = name.group(1).strip() if name is not None else ""
    return f"{command} {args.group(1).strip()}".strip()


def _content(content: object, role: Role, where: str) -> tuple[str, list[str]]:
    """The text kept of one message's content, and the tools it calls (module doc)."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return _said(content), []
    if not isinstance(content, list):
        raise bad(f"{where}: message content must be text or a list of blocks")
    texts: list[str] = []
    tools: list[str] = []
    for block in content:
        if isinstance(block, str):
            texts.append(_said(block))
        elif isinstance(block, Mapping):
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(_said(block["text"]))
            elif kind == "tool_use" and role == "assistant":
                name = block.get("name")
                tools.append(name if isinstance(name, str) and name else "tool")
            # tool_result, thinking, redacted_thinking, image, document: left out
    return "\n".join(t for t in texts if t.strip()), tools


def _branch(events: Sequence[Mapping[str, Any]], leaf: str | None) -> set[str] | None:
    """The uuids on the branch ending at ``leaf`` (None: no leaf, read every turn)."""
    if leaf is None:
        return None
    parents: dict[str, str | None] = {}
    for event in events:
        uuid = event.get("uuid")
        if isinstance(uuid, str):
            parent = event.get("parentUuid") or event.get("logicalParentUuid")
            parents[uuid] = parent if isinstance(parent, str) else None
    branch: set[str] = set()
    current: str | None = leaf
    while current is not None and current not in branch and current in parents:
        branch.add(current)
        current = parents[current]
    return branch


def _turns(events: Sequence[Mapping[str, Any]]) -> list[tuple[int, Mapping[str, Any]]]:
    """The user and assistant turns of the main conversation, with their line numbers."""
    return [
        (number, event)
        for number, event in enumerate(events, 1)
        if name_of(event.get("type")) in TURNS
        and not event.get("isSidechain")
        and not event.get("isMeta")
        and not event.get("isCompactSummary")
        and not event.get("isApiErrorMessage")
    ]


def _title(events: Sequence[Mapping[str, Any]], branch: set[str] | None) -> str | None:
    """A title the user set (``custom-title``), else the summary of this branch's leaf."""
    title: str | None = None
    for event in events:
        if event.get("type") == "custom-title":
            title = optional_str(event.get("customTitle"), "customTitle") or title
    if title is not None:
        return title
    for event in reversed(events):
        leaf = event.get("leafUuid")
        if event.get("type") == "summary" and (branch is None or leaf in branch):
            return optional_str(event.get("summary"), "summary")
    return None


def read_claude_code(
    events: Sequence[Mapping[str, Any]],
    *,
    path: Path,
    default_owner: str | None,
    source_format: str,
    limits: Limits = DEFAULT_LIMITS,
) -> Transcript:
    """One Claude Code session: its main branch's user and assistant text (module doc)."""
    everything = [(n, e) for n, e in enumerate(events, 1) if name_of(e.get("type")) in TURNS]
    kept = _turns(events)
    if everything and all(e.get("isSidechain") for _, e in everything):
        raise bad("a sub-agent's session (every turn isSidechain): its prompts are not the user's")
    leaf_uuid = next((e["uuid"] for _, e in reversed(kept) if isinstance(e.get("uuid"), str)), None)
    branch = _branch(events, leaf_uuid)
    session_id: str | None = None
    turns = Turns()
    for number, event in kept:
        uuid = event.get("uuid")
        if branch is not None and isinstance(uuid, str) and uuid not in branch:
            continue
        session_id = optional_str(event.get("sessionId"), f"line {number} sessionId") or session_id
        role = TURNS[event["type"]]
        message = event.get("message")
        if not isinstance(message, Mapping):
            raise bad(f"line {number}: a {role} turn's message must be an object")
        text, tools = _content(message.get("content"), role, f"line {number}")
        at = parse_time(event.get("timestamp"), f"line {number} timestamp") if text else None
        turns.add(role, text, at, tools)
    messages = turns.done()
    if session_id is None:  # no turn kept: the file's id, so the refusal can name it
        session_id = next(
            (e["sessionId"] for e in events if isinstance(e.get("sessionId"), str)), None
        )
    if not session_id:
        raise bad("no sessionId on any line")
    return build(
        conversation_id=session_id,
        owner=default_owner,
        title=_title(events, branch),
        started_at=messages[0].at if messages else None,
        ended_at=messages[-1].at if messages else None,
        messages=messages,
        source_format=source_format,
        path=path,
        limits=limits,
    )
