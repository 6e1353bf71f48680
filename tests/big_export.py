"""A large ChatGPT export of tiny messages, written a conversation at a time (the file is
never held whole), for the memory tests of the readers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def tiny_conversation(i: int, messages: int) -> dict[str, Any]:
    """One ChatGPT-export conversation of ``messages`` tiny turns in a straight branch."""
    created = 1_700_000_000 + i * 60
    mapping: dict[str, Any] = {"root": {"id": "root", "message": None, "parent": None}}
    parent = "root"
    for n in range(messages):
        node = f"n{n}"
        mapping[node] = {
            "id": node,
            "message": {
                "id": node,
                "author": {"role": "user" if n % 2 == 0 else "assistant"},
                "create_time": created + n,
                "content": {"content_type": "text", "parts": [f"ok {n}"]},
            },
            "parent": parent,
            "children": [],
        }
        mapping[parent]["children"] = [node]
        parent = node
    return {
        "title": f"Tiny {i}",
        "create_time": created,
        "update_time": created + messages,
        "mapping": mapping,
        "current_node": parent,
        "conversation_id": f"tiny-{i}",
    }


def write_tiny_export(
    path: Path, target_bytes: int, messages: int = 40, *, lines: bool = False
) -> tuple[int, int]:
    """Write conversations of ``messages`` tiny turns until the file reaches
    ``target_bytes``, as a JSON array (an export's conversations.json) or, with ``lines``,
    as JSON Lines; returns (conversations, the largest one's bytes)."""
    written = count = largest = 0
    start, between, end = ("", "\n", "\n") if lines else ("[", ",", "]")
    with path.open("w", encoding="utf-8") as out:
        out.write(start)
        while written < target_bytes:
            text = json.dumps(tiny_conversation(count, messages))
            out.write((between if count else "") + text)
            written += len(text) + 1
            largest = max(largest, len(text))
            count += 1
        out.write(end)
    return count, largest
