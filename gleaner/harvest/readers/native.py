"""Readers for Gleaner's own JSON format and for OpenAI-style ``{"messages": [...]}`` files."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gleaner.harvest.readers._common import (
    ROLES,
    bad,
    build,
    described,
    identifier,
    optional_str,
    parse_time,
    text_of,
)
from gleaner.harvest.redact import messages_hash, redact_text
from gleaner.harvest.transcript import (
    DEFAULT_LIMITS,
    Limits,
    Message,
    Transcript,
    check_message_count,
    check_size,
)


def _owner(obj: Mapping[str, Any], default_owner: str | None) -> str | None:
    owner = obj.get("owner")
    scope = obj.get("scope")
    if isinstance(scope, Mapping):
        kind = scope.get("kind")
        if kind != "owner":
            # The transcript belongs to one principal; a global scope is not a conversation's.
            raise bad(f"scope kind must be 'owner' (got {described(kind)})")
        scope = scope.get("id")
    if scope is not None and not (isinstance(scope, str) and scope):
        raise bad(
            "scope must be an owner name or {'kind': 'owner', 'id': ...} "
            f"(got {described(scope)})"
        )
    if owner is not None and not (isinstance(owner, str) and owner):
        raise bad(f"owner must be a non-empty string (got {described(owner)})")
    if owner and scope and owner != scope:
        raise bad("owner and scope name different owners")
    return owner or scope or default_owner


def _messages(raw: object, *, strict_roles: bool, limits: Limits) -> list[Message]:
    if not isinstance(raw, list):
        raise bad("messages must be a list")
    check_message_count(len(raw), limits)  # before a Message is built
    messages: list[Message] = []
    for number, item in enumerate(raw, 1):
        if not isinstance(item, Mapping):
            raise bad(f"message {number} must be an object")
        role = ROLES.get(str(item.get("role")))
        if role is None:
            if strict_roles:
                raise bad(
                    f"message {number}: role must be one of user, assistant, system, tool "
                    f"(got {described(item.get('role'))})"
                )
            continue
        messages.append(
            Message(
                role=role,
                content=text_of(item.get("content"), f"message {number} content"),
                at=parse_time(item.get("at"), f"message {number} at"),
            )
        )
    return messages


def read_native(
    obj: Mapping[str, Any],
    *,
    path: Path,
    default_owner: str | None,
    source_format: str,
    limits: Limits = DEFAULT_LIMITS,
) -> Transcript:
    """One native conversation: ``{conversation_id, owner | scope, ended_at?, messages}``."""
    conversation_id = identifier(obj.get("conversation_id"), "conversation_id")
    if conversation_id is None:
        raise bad("conversation_id is missing")
    return build(
        conversation_id=conversation_id,
        owner=_owner(obj, default_owner),
        title=optional_str(obj.get("title"), "title"),
        started_at=parse_time(obj.get("started_at"), "started_at"),
        ended_at=parse_time(obj.get("ended_at"), "ended_at"),
        messages=_messages(obj.get("messages"), strict_roles=True, limits=limits),
        source_format=source_format,
        path=path,
        limits=limits,
    )


def openai_id(messages: list[Message], path: Path) -> str:
    """A stable id for a conversation that has none: a hash of its file and of what it says.

    Both redacted first: the id is stored and shown, and a hash of private text would let a
    short secret (a PIN) be found by trying every value.
    """
    said = messages_hash(messages)
    place = redact_text(str(path.resolve()))
    digest = hashlib.sha256(f"{place}\n{said}".encode("utf-8", "surrogatepass")).hexdigest()
    return f"openai-{digest[:24]}"


def read_openai(
    obj: Mapping[str, Any] | list[Any],
    *,
    path: Path,
    default_owner: str | None,
    source_format: str,
    limits: Limits = DEFAULT_LIMITS,
) -> Transcript:
    """One OpenAI-style conversation: ``{"messages": [...]}`` or a bare list of messages.

    Messages with roles this format has but a transcript does not are skipped.
    """
    raw = obj if isinstance(obj, list) else obj.get("messages")
    messages = _messages(raw, strict_roles=False, limits=limits)
    check_size(messages, limits)  # before the id hashes the whole conversation
    return build(
        conversation_id=openai_id(messages, path),
        owner=default_owner,
        messages=messages,
        source_format=source_format,
        path=path,
        limits=limits,
    )
