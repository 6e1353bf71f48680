"""A request's body, read within its limits: its size (413) and its deadline (408)."""

from __future__ import annotations

import asyncio
import logging

from fastapi import Request
from starlette.requests import ClientDisconnect

from gleaner import Settings, TooLarge

# uvicorn's own logger: its format and --log-level.
log = logging.getLogger("uvicorn.error")


class ClientGone(Exception):
    """Raised when the client went away before its request body was whole (logged once)."""


class BodyTimeout(Exception):
    """Raised when a request body is not whole within its deadline (408)."""


def body_limit(settings: Settings) -> tuple[int, str]:
    """The most bytes of a request body, and the setting that sets it (the smaller of the
    HTTP body limit and the file limit)."""
    if settings.max_file_bytes < settings.http_max_body_bytes:
        return settings.max_file_bytes, "GLEANER_MAX_FILE_BYTES"
    return settings.http_max_body_bytes, "GLEANER_HTTP_MAX_BODY_BYTES"


async def read_body(request: Request, settings: Settings) -> bytes:
    """The request body, refused (413) past the body limit before more of it is read, and
    (408) when it has not all arrived within GLEANER_HTTP_BODY_TIMEOUT_SECONDS. A client
    that goes away meanwhile is one log line (ClientGone)."""
    limit, setting = body_limit(settings)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(
            f"request body too large: {int(declared):,} bytes, over the limit of {limit:,} "
            f"({setting})",
            reason="too_large",
        )
    chunks: list[bytes] = []
    size = 0
    timeout = settings.http_body_timeout_seconds
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise TooLarge(
                        f"request body too large: more than {limit:,} bytes, over the limit "
                        f"({setting})",
                        reason="too_large",
                    )
                chunks.append(chunk)
    except TimeoutError:
        raise BodyTimeout(
            f"the request body did not arrive within {timeout:g} s "
            f"(GLEANER_HTTP_BODY_TIMEOUT_SECONDS): {size:,} bytes came"
        ) from None
    except ClientDisconnect:
        client = request.client
        who = f"{client.host}:{client.port}" if client else "a client"
        log.info("%s went away after sending %s bytes of its request body", who, f"{size:,}")
        raise ClientGone from None
    return b"".join(chunks)
