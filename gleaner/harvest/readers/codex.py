"""Reader for an OpenAI Codex CLI session (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``).

A rollout file is JSON Lines of ``{"timestamp", "type", "payload"}``: ``session_meta`` first
(``payload.id`` is the session id), then ``response_item`` (the model's history: ``message``
with a ``role`` and ``input_text``/``output_text`` parts, ``function_call``,
``custom_tool_call``, ``local_shell_call``, ``web_search_call``, their outputs, ``reasoning``),
``event_msg`` (the UI's events, repeating the messages), ``turn_context`` and ``compacted``.
The whole file is one conversation.

Kept, as for Claude Code: the user's and the assistant's text from ``response_item``
messages; the context Codex puts in the user's turn (``<environment_context>``,
``<user_instructions>``, AGENTS.md instructions, aborted-turn notices, ``!`` shell commands)
and developer or system messages are left out, and so are tool outputs, reasoning,
``event_msg`` (a second copy of the messages) and ``compacted`` summaries (what they sum up
is earlier in the same file). The tools called become one line naming them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gleaner.harvest.readers._common import (
    TEXT_PART_TYPES,
    bad,
    build,
    identifier,
    name_of,
    parse_time,
)
from gleaner.harvest.readers.turns import Turns
from gleaner.harvest.transcript import DEFAULT_LIMITS, Limits, Role, Transcript

ROLLOUT_TYPES = frozenset(
    {"session_meta", "response_item", "event_msg", "turn_context", "compacted"}
)
_TURNS: dict[str, Role] = {"user": "user", "assistant": "assistant"}
# Tool calls and the name each is shown under when the item carries none.
_CALLS = {
    "function_call": "function",
    "custom_tool_call": "tool",
    "local_shell_call": "shell",
    "web_search_call": "web_search",
}
# Text Codex itself puts in the user's turn, not typed by the person.
_CONTEXT_PREFIXES = (
    "<environment_context>",
    "<user_instructions>",
    "<user_shell_command>",
    "<turn_aborted>",
    "<subagent_notification>",
    "<skill>",
    "# AGENTS.md instructions",
)


def is_rollout_line(obj: object) -> bool:
    """Whether one JSON line is a Codex rollout line (``{timestamp, type, payload}``)."""
    return (
        isinstance(obj, Mapping)
        and name_of(obj.get("type")) in ROLLOUT_TYPES
        and isinstance(obj.get("payload"), Mapping)
        and "timestamp" in obj
    )


def _text(content: object, where: str) -> str:
    if not isinstance(content, list):
        raise bad(f"{where}: message content must be a list of parts")
    texts = [
        part["text"]
        for part in content
        if isinstance(part, Mapping)
        and name_of(part.get("type")) in TEXT_PART_TYPES
        and isinstance(part.get("text"), str)
        and not part["text"].lstrip().startswith(_CONTEXT_PREFIXES)
    ]
    return "\n".join(t for t in texts if t.strip())


def read_codex(
    events: Sequence[Mapping[str, Any]],
    *,
    path: Path,
    default_owner: str | None,
    source_format: str,
    limits: Limits = DEFAULT_LIMITS,
) -> Transcript:
    """One Codex CLI session: its user and assistant text (see the module doc)."""
    session_id: str | None = None
    turns = Turns()
    for number, event in enumerate(events, 1):
        payload = event.get("payload")
        if not isinstance(payload, Mapping):
            continue
        kind = event.get("type")
        if kind == "session_meta" and session_id is None:
            session_id = identifier(payload.get("id"), f"line {number} session_meta id")
        if kind != "response_item":
            continue
        item = name_of(payload.get("type"))
        if item in _CALLS:
            name = payload.get("name")
            tool = name if isinstance(name, str) and name else _CALLS[str(item)]
            turns.add("assistant", "", None, [tool])
            continue
        role = _TURNS.get(str(payload.get("role")))
        if item != "message" or role is None:
            continue
        text = _text(payload.get("content"), f"line {number}")
        at = parse_time(event.get("timestamp"), f"line {number} timestamp") if text else None
        turns.add(role, text, at, [])
    if session_id is None:
        raise bad("no session_meta line with the session id")
    messages = turns.done()
    return build(
        conversation_id=session_id,
        owner=default_owner,
        started_at=messages[0].at if messages else None,
        ended_at=messages[-1].at if messages else None,
        messages=messages,
        source_format=source_format,
        path=path,
        limits=limits,
    )
