"""The owner and conversation id in a request's path: routed on the segment as sent
(``OwnerSegment``), decoded by the route (``owner_of``, ``conversation_of``)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote, unquote, unquote_to_bytes

from fastapi import Path
from starlette.types import ASGIApp, Receive, Scope, Send

from gleaner import InvalidRequest

OWNERS = b"/v1/owners/"
CONVERSATIONS = b"conversations/"


class OwnerSegment:
    """Routes ``/v1/owners/{owner}/...`` on the owner segment as sent, still percent-encoded:
    an owner may hold ``/`` (``team/alice``, sent as ``team%2Falice``), which the decoded path
    splits into two segments that no route matches. The routes decode it (``Owner``). So
    does a conversation id after ``/conversations/`` (``ConversationId``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw and raw.startswith(OWNERS):
            segment, slash, rest = raw[len(OWNERS) :].partition(b"/")
            kept = b""
            if rest.startswith(CONVERSATIONS):
                conversation, after, rest = rest[len(CONVERSATIONS) :].partition(b"/")
                kept = CONVERSATIONS + _one_spelling(conversation).encode() + after
            tail = kept.decode() + unquote(rest.decode("latin-1"))
            path = OWNERS.decode() + _one_spelling(segment) + slash.decode() + tail
            scope = {**scope, "path": path}
        await self.app(scope, receive, send)


def _one_spelling(segment: bytes) -> str:
    """A path segment percent-encoded one way, whichever way it was sent."""
    return quote(unquote_to_bytes(segment), safe="")


Owner = Annotated[
    str,
    Path(
        description="The owner, percent-encoded (an owner holding `/` sends it as `%2F`).",
    ),
]


ConversationId = Annotated[
    str,
    Path(
        description="The conversation's id as stored, percent-encoded (`/` sent as `%2F`).",
    ),
]


def owner_of(segment: str) -> str:
    """The owner a path's segment names (``OwnerSegment`` left it percent-encoded); bytes
    that are no UTF-8 are refused, not made U+FFFD (two spellings, one owner)."""
    return _decoded(segment, "owner", "bad_owner")


def conversation_of(segment: str) -> str:
    """The conversation id a path's segment names, as ``owner_of`` decodes an owner."""
    return _decoded(segment, "conversation id", "bad_conversation_id")


def _decoded(segment: str, what: str, reason: str) -> str:
    try:
        return unquote(segment, errors="strict")
    except UnicodeDecodeError:
        raise InvalidRequest(
            f"{what} in the path is not UTF-8 once percent-decoded", reason=reason
        ) from None
