"""Coding-agent session files: telling one from other JSON Lines, and reading its events.

A session file (Claude Code, Codex CLI) is one conversation written an event a line, so it
is read whole, where other JSON Lines hold one conversation a line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from gleaner.harvest.readers._common import bad, json_problem, split_lines, too_deep
from gleaner.harvest.readers.claude_code import is_session_event
from gleaner.harvest.readers.codex import is_rollout_line

# How many of the first lines are looked at to tell a session file; its first line is
# bookkeeping more often than not, so one is not enough.
SNIFF_LINES = 5
# Keys one of which every session event line holds.
_MARKERS = ('"sessionId"', '"leafUuid"', '"messageId"', '"payload"')
SESSION_KINDS: dict[str, Callable[[object], bool]] = {
    "claude-code": is_session_event,
    "codex": is_rollout_line,
}


def _first_lines(text: str, count: int) -> Iterator[str]:
    """The first ``count`` non-blank lines, found without splitting the whole text (an export
    can be hundreds of megabytes)."""
    start = found = 0
    while found < count and start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        line = text[start:end]
        start = end + 1
        if line.strip():
            found += 1
            yield line


def session_kind(text: str) -> str | None:
    """``claude-code`` or ``codex`` when one of the first JSON lines of ``text`` is that
    agent's session event, else None (then the text is read as any other JSON or JSON Lines)."""
    for line in _first_lines(text, SNIFF_LINES):
        # Only a JSON object line naming a session is parsed: never a whole export twice.
        if not line.lstrip().startswith("{") or not any(m in line for m in _MARKERS):
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, or JSON Python cannot hold
            continue
        for kind, test in SESSION_KINDS.items():
            if test(obj):
                return kind
    return None


def session_id(events: Sequence[Mapping[str, Any]]) -> object:
    """The session's id as the file first names it (for labels), or None."""
    for event in events:
        if "sessionId" in event:
            return event["sessionId"]
        payload = event.get("payload")
        if event.get("type") == "session_meta" and isinstance(payload, Mapping):
            return payload.get("id")
    return None


def session_events(text: str) -> list[Mapping[str, Any]]:
    """Every event of a session file, in order. A line that is not a JSON object fails the
    conversation, except a last line cut off while it was written (a session still open)."""
    lines = [line for line in split_lines(text) if line.strip()]
    events: list[Mapping[str, Any]] = []
    for number, line in enumerate(lines, 1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break
            raise bad(f"line {number}: not JSON ({exc.msg})") from None
        except ValueError as exc:  # valid JSON Python's parser refuses
            raise bad(f"line {number}: not JSON ({json_problem(exc)})") from None
        except RecursionError:
            raise too_deep(f"line {number}: ") from None
        if not isinstance(obj, Mapping):
            raise bad(f"line {number}: not a JSON object")
        events.append(obj)
    return events
