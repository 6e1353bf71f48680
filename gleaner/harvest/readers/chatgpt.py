"""Reader for one conversation of a ChatGPT data export (``conversations.json``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gleaner.harvest.readers._common import (
    ROLES,
    bad,
    build,
    identifier,
    name_of,
    optional_str,
    parse_time,
)
from gleaner.harvest.readers.native import _owner as named_owner
from gleaner.harvest.transcript import (
    DEFAULT_LIMITS,
    Limits,
    Message,
    Transcript,
    check_message_count,
)

# Content types that hold what was said; code, browsing output, reasoning, custom
# instructions and the like are not the conversation.
_TEXT_TYPES = frozenset({"text", "multimodal_text"})


def _get(obj: object, key: str) -> Any:
    """``obj[key]`` when obj is a mapping, else None: export fields vary between versions."""
    return obj.get(key) if isinstance(obj, Mapping) else None


def _branch(mapping: Mapping[str, Any], current: object) -> list[Any]:
    """The nodes of the current branch, root first.

    Walks up from ``current_node`` through ``parent`` (edits and regenerations leave sibling
    branches that are not what the user ended with). Without a usable ``current_node``, walks
    down from the root through each node's last child, the newest edit. Linear in the branch.
    """
    chain: list[Any] = []
    seen: set[str] = set()
    if isinstance(current, str) and current in mapping:
        node_id: object = current
        while isinstance(node_id, str) and node_id in mapping and node_id not in seen:
            seen.add(node_id)
            chain.append(mapping[node_id])
            node_id = _get(mapping[node_id], "parent")
        chain.reverse()
        return chain
    roots = [k for k, n in mapping.items() if name_of(_get(n, "parent")) not in mapping]
    node_id = roots[0] if roots else None
    while isinstance(node_id, str) and node_id in mapping and node_id not in seen:
        seen.add(node_id)
        chain.append(mapping[node_id])
        children = _get(mapping[node_id], "children")
        node_id = children[-1] if isinstance(children, list) and children else None
    return chain


def _part_text(part: object) -> str | None:
    """A part's text: a string, or what was said in voice mode (an ``audio_transcription``
    part beside its audio pointer). Image, file and audio pointers are no text."""
    if isinstance(part, str):
        return part
    text = _get(part, "text")
    if _get(part, "content_type") == "audio_transcription" and isinstance(text, str):
        return text
    return None


def _message(node: object, number: int) -> Message | None:
    """The node's message when it is user or assistant text shown in the conversation."""
    message = _get(node, "message")
    role = ROLES.get(str(_get(_get(message, "author"), "role")))
    if role not in ("user", "assistant"):
        return None
    if _get(_get(message, "metadata"), "is_visually_hidden_from_conversation"):
        return None
    # An assistant message addressed to a tool (a search query, an image prompt) is not text
    # the user read.
    if _get(message, "recipient") not in (None, "all"):
        return None
    content = _get(message, "content")
    if name_of(_get(content, "content_type")) not in _TEXT_TYPES:
        return None
    parts = _get(content, "parts")
    texts = (
        [t for p in parts if (t := _part_text(p)) is not None] if isinstance(parts, list) else []
    )
    return Message(
        role=role,
        content="\n".join(texts),
        at=parse_time(_get(message, "create_time"), f"node {number} create_time"),
    )


def read_chatgpt(
    obj: Mapping[str, Any],
    *,
    path: Path,
    default_owner: str | None,
    source_format: str,
    limits: Limits = DEFAULT_LIMITS,
) -> Transcript:
    """One ChatGPT conversation: the current branch of its ``mapping`` tree, text only."""
    mapping = obj.get("mapping")
    if not isinstance(mapping, Mapping):
        raise bad("mapping must be an object of message nodes")
    conversation_id = identifier(obj.get("conversation_id") or obj.get("id"), "conversation_id")
    if conversation_id is None:
        raise bad("conversation has no conversation_id or id")
    branch = _branch(mapping, obj.get("current_node"))
    check_message_count(len(branch), limits)  # the nodes followed, before a Message is built
    messages = [m for n, node in enumerate(branch, 1) if (m := _message(node, n)) is not None]
    return build(
        conversation_id=conversation_id,
        # An export names no owner, but a conversation made to look like one may: it keeps
        # it (moving it to another owner takes --reassign-owner, as for a native one).
        owner=named_owner(obj, default_owner),
        title=optional_str(obj.get("title"), "title"),
        started_at=parse_time(obj.get("create_time"), "create_time"),
        ended_at=parse_time(obj.get("update_time"), "update_time"),
        messages=messages,
        source_format=source_format,
        path=path,
        limits=limits,
    )
