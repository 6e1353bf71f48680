"""The HTTP service's gate: which API key a request carries, and whether it may act for an
owner. Keys are made with ``gleaner keys create`` and checked through the public API."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gleaner import ApiKey, Gleaner

# auto_error off: a missing or unknown key gets this service's JSON 401, not FastAPI's own.
bearer = HTTPBearer(
    auto_error=False,
    description="An API key from `gleaner keys create`, as `Authorization: Bearer glk_...`.",
)


class Refused(Exception):
    """Raised when a request may not go on: ``status`` 401 (no such key) or 403 (not its
    owner, or a read-only key asked to write); rendered as the service's JSON error."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def gleaner_of(request: Request) -> Gleaner:
    found: Gleaner = request.app.state.gleaner
    return found


def api_key(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> ApiKey:
    """The live key the request carries; Refused(401) when it carries none or an unknown one.
    Checked on every request, so a revoked key stops working at once."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        return live_key(gleaner_of(request), None)
    return live_key(gleaner_of(request), credentials.credentials)


def live_key(gleaner: Gleaner, token: str | None) -> ApiKey:
    """The live key ``token`` is (a bearer token; None when the request sent none);
    Refused(401) when there is none or it is unknown or revoked. The HTTP service and the
    MCP server's streamable HTTP check keys with it."""
    if not token:
        raise Refused(401, "no_api_key", "send an API key: Authorization: Bearer glk_...")
    found = gleaner.verify_api_key(token)
    if found is None:
        raise Refused(401, "unknown_api_key", "the API key is unknown or was revoked")
    return found


def allowed_owner(gleaner: Gleaner, key: ApiKey, owner: str) -> str:
    """The owner as stored, once the key is allowed it; Refused(403) otherwise (an owner
    that breaks the owner rule is InvalidRequest, 422, whatever the key)."""
    name = gleaner.owner_name(owner)
    if not key.allows(name):
        raise Refused(403, "forbidden_owner", f"this API key is not allowed owner {name!r}")
    return name


def may_write(key: ApiKey) -> ApiKey:
    """``key``, when it may change what is stored; Refused(403, ``read_only_key``) when it
    is a read-only key. The MCP server's write tools check it too."""
    if key.read_only:
        raise Refused(
            403,
            "read_only_key",
            f"API key {key.id} is read-only: it can search, read and follow jobs, but not "
            "submit, pin, delete or forget",
        )
    return key


def write_key(key: Annotated[ApiKey, Depends(api_key)]) -> ApiKey:
    """The live key of a request that changes what is stored (submit, forget)."""
    return may_write(key)


Key = Annotated[ApiKey, Depends(api_key)]
# For routes that write: a read-only key is refused (403) before the request's body is read.
WriteKey = Annotated[ApiKey, Depends(write_key)]
Service = Annotated[Gleaner, Depends(gleaner_of)]
