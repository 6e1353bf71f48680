"""Synthetic transcripts and exports for tests and benchmarks: realistic shape, unique facts."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

TOOLS = ["vim", "emacs", "vscode", "helix", "zed", "nano", "kate", "sublime"]
DBS = ["PostgreSQL", "SQLite", "MariaDB", "DuckDB", "ClickHouse", "Redis"]
CITIES = ["Lisbon", "Porto", "Berlin", "Oslo", "Lyon", "Turin", "Gdansk", "Tartu"]


def user_lines(i: int, facts: int = 3) -> list[str]:
    """Statements the offline extractor recognises, unique to conversation ``i``."""
    # Two tokens unique to i in each line keep notes of different conversations below the
    # duplicate threshold (title Jaccard), so every conversation's notes stay its own.
    lines = [
        f"I prefer {TOOLS[i % len(TOOLS)]} with the kit{i} keymap{i} for every repo.",
        f"We decided to use {DBS[i % len(DBS)]} for the svc{i} ledger{i}.",
        f"Turns out the bug{i} was a missing index on table{i}.",
        f"Every time I ship release{i} I run the smoke{i} suite first.",
    ]
    return lines[:facts]


def native(i: int, owner: str = "alice", facts: int = 3, extra: str = "") -> dict[str, Any]:
    """A native transcript of 2 * facts + 2 messages."""
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are helpful."}]
    for line in user_lines(i, facts):
        messages.append({"role": "user", "content": line + extra})
        messages.append({"role": "assistant", "content": "Understood, noted."})
    messages.append({"role": "assistant", "content": "Anything else?"})
    return {
        "conversation_id": f"conv-{i}",
        "owner": owner,
        "ended_at": "2024-05-01T10:00:00Z",
        "messages": messages,
    }


def write_natives(
    folder: Path,
    count: int,
    *,
    start: int = 0,
    owner: str = "alice",
    facts: int = 3,
    extra: str = "",
) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(start, start + count):
        path = folder / f"conv-{i}.json"
        path.write_text(json.dumps(native(i, owner, facts, extra)))
        paths.append(path)
    return paths


def chatgpt_conversation(
    i: int, facts: int = 3, rng: random.Random | None = None
) -> dict[str, Any]:
    """One ChatGPT-export conversation: a mapping tree, with an edited (abandoned) branch."""
    rng = rng or random.Random(i)
    created = 1_700_000_000 + i * 3_600
    mapping: dict[str, Any] = {
        "root": {"id": "root", "message": None, "parent": None, "children": []}
    }
    parent = "root"

    def add(node_id: str, role: str, text: str, at: float) -> None:
        mapping[node_id] = {
            "id": node_id,
            "message": {
                "id": node_id,
                "author": {"role": role},
                "create_time": at,
                "content": {"content_type": "text", "parts": [text]},
                "metadata": {},
            },
            "parent": parent,
            "children": [],
        }
        mapping[parent]["children"].append(node_id)

    for n, line in enumerate(user_lines(i, facts)):
        if n == 0:  # an edited first message: the abandoned branch must not be harvested
            add(f"u{n}-old", "user", f"ABANDONED draft {rng.random()}", created)
        add(f"u{n}", "user", line, created + n * 60)
        parent = f"u{n}"
        add(f"a{n}", "assistant", "Sounds good.", created + n * 60 + 5)
        parent = f"a{n}"
    return {
        "title": f"Conversation {i}",
        "create_time": float(created),
        "update_time": float(created + 600),
        "mapping": mapping,
        "current_node": parent,
        "conversation_id": f"chatgpt-{i}",
    }


def write_chatgpt_export(path: Path, count: int, facts: int = 3) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([chatgpt_conversation(i, facts) for i in range(count)]))
    return path
