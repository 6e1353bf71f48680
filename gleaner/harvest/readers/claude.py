"""Reader for one conversation of a Claude data export (``conversations.json``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gleaner.harvest.readers._common import bad, build, identifier, optional_str, parse_time
from gleaner.harvest.readers.native import _owner as named_owner
from gleaner.harvest.transcript import (
    DEFAULT_LIMITS,
    Limits,
    Message,
    Role,
    Transcript,
    check_message_count,
)

_SENDERS: dict[str, Role] = {"human": "user", "assistant": "assistant"}
# The parent claude.ai gives a conversation's first message.
_ROOT_PARENT = "00000000-0000-4000-8000-000000000000"


def _current_branch(chat: list[Any], leaf: object) -> set[str] | None:
    """The uuids of the messages on the branch the user ended on; None: read every message.

    claude.ai keeps every edited message and every retried answer in the one flat
    ``chat_messages`` list, each naming its ``parent_message_uuid``: the branch is walked back
    from ``current_leaf_message_uuid`` or, when the export has none, from the last message no
    other follows. Without a uuid and a parent on every message, or when the walk meets a
    parent the list lacks (a broken chain would lose the start), every message is read.
    """
    parent_of: dict[str, str | None] = {}
    for item in chat:
        if not isinstance(item, Mapping) or "parent_message_uuid" not in item:
            return None
        uuid, parent = item.get("uuid"), item["parent_message_uuid"]
        if not isinstance(uuid, str) or not (parent is None or isinstance(parent, str)):
            return None
        parent_of[uuid] = parent
    if not isinstance(leaf, str) or leaf not in parent_of:
        followed = set(parent_of.values())
        leaves = [uuid for uuid in parent_of if uuid not in followed]
        if not leaves:
            return None
        leaf = leaves[-1]
    branch: set[str] = set()
    node: str | None = leaf
    while node in parent_of and node not in branch:
        branch.add(node)
        node = parent_of[node]
    if node is not None and node != _ROOT_PARENT:
        return None  # a parent the list lacks, or a cycle: keep everything, lose nothing
    return branch


def _text(item: Mapping[str, Any]) -> str:
    """A chat message's text: its text blocks, else its flat ``text``, then the text of its
    attachments (see :func:`_attached`).

    When ``content`` blocks are present they are the message; ``text`` then also renders tool
    use and attachments as placeholders, which are not what was said.
    """
    blocks = item.get("content")
    if isinstance(blocks, list) and blocks:
        said = "\n".join(
            block["text"]
            for block in blocks
            if isinstance(block, Mapping)
            and block.get("type") == "text"
            and isinstance(block.get("text"), str)
        )
    else:
        text = item.get("text")
        said = text if isinstance(text, str) else ""
    return "\n\n".join(t for t in (said, *_attached(item.get("attachments"))) if t.strip())


def _attached(attachments: object) -> list[str]:
    """The text of a message's attachments, each under a line naming it. claude.ai turns a
    long paste into an attachment (its ``extracted_content``) and leaves the message's own
    text empty: without it, what the user pasted is lost. Files with no extracted text
    (``files``, images) are left out."""
    if not isinstance(attachments, list):
        return []
    texts = []
    for attachment in attachments:
        content = attachment.get("extracted_content") if isinstance(attachment, Mapping) else None
        if isinstance(content, str) and content.strip():
            name = attachment.get("file_name")
            label = f"[attached: {name}]" if isinstance(name, str) and name else "[attached]"
            texts.append(f"{label}\n{content}")
    return texts


def read_claude(
    obj: Mapping[str, Any],
    *,
    path: Path,
    default_owner: str | None,
    source_format: str,
    limits: Limits = DEFAULT_LIMITS,
) -> Transcript:
    """One Claude conversation: its ``chat_messages`` from human and assistant on the branch
    the user ended on, text only."""
    conversation_id = identifier(obj.get("uuid"), "uuid")
    if conversation_id is None:
        raise bad("conversation has no uuid")
    chat = obj.get("chat_messages")
    if not isinstance(chat, list):
        raise bad("chat_messages must be a list")
    check_message_count(len(chat), limits)  # before a Message is built
    messages: list[Message] = []
    branch = _current_branch(chat, obj.get("current_leaf_message_uuid"))
    for number, item in enumerate(chat, 1):
        if not isinstance(item, Mapping):
            raise bad(f"chat message {number} must be an object")
        if branch is not None and item["uuid"] not in branch:
            continue  # an edited-away message or a retried answer
        role = _SENDERS.get(str(item.get("sender")))
        if role is None:
            continue
        messages.append(
            Message(
                role=role,
                content=_text(item),
                at=parse_time(item.get("created_at"), f"chat message {number} created_at"),
            )
        )
    return build(
        conversation_id=conversation_id,
        # An export names no owner, but a conversation made to look like one may: it keeps
        # it (moving it to another owner takes --reassign-owner, as for a native one).
        owner=named_owner(obj, default_owner),
        title=optional_str(obj.get("name"), "name"),
        started_at=parse_time(obj.get("created_at"), "created_at"),
        ended_at=parse_time(obj.get("updated_at"), "updated_at"),
        messages=messages,
        source_format=source_format,
        path=path,
        limits=limits,
    )
