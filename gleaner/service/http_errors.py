"""Errors as the HTTP service answers them: each error tree mapped, once, to a status and
the JSON body ``{"error": {"reason": ..., "message": ...}}``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from gleaner import GleanerError, InvalidRequest, NotFound, TooLarge, Unavailable
from gleaner.service.http_body import BodyTimeout, ClientGone
from gleaner.service.keys import Refused
from gleaner.service.limits import Throttled

# Refusals of the body itself: it is not one conversation that can be read.
UNREADABLE = frozenset({"bad_transcript", "too_deep", "not_one_conversation"})

ExceptionHandler = Callable[[Request, Any], Awaitable[JSONResponse]]


class ErrorBody(BaseModel):
    reason: str
    message: str


class Error(BaseModel):
    error: ErrorBody


def error(status: int, reason: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"reason": reason, "message": message}}, status_code=status)


def status_of(exc: GleanerError) -> int:
    if isinstance(exc, TooLarge):
        return 413
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, Unavailable):
        return 503
    if isinstance(exc, InvalidRequest) and exc.reason in UNREADABLE:
        return 400
    return 422


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Error} for code in (400, 401, 403, 404, 408, 413, 422, 429, 503)
}


async def gleaner_error(request: Request, exc: GleanerError) -> JSONResponse:
    response = error(status_of(exc), exc.reason, exc.message)
    if response.status_code == 413:
        response.headers["Connection"] = "close"  # the rest of the body is not read
    return response


async def throttled(request: Request, exc: Throttled) -> JSONResponse:
    response = error(exc.status, exc.reason, exc.message)
    response.headers["Retry-After"] = str(exc.retry_after)
    return response


async def body_timeout(request: Request, exc: BodyTimeout) -> JSONResponse:
    response = error(408, "body_timeout", str(exc))
    response.headers["Connection"] = "close"  # the rest of the body is not waited for
    return response


async def client_gone(request: Request, exc: ClientGone) -> JSONResponse:
    # Nobody reads it: the exception is handled here so that nothing logs a traceback.
    return error(400, "client_gone", "the client went away mid-body")


async def refused(request: Request, exc: Refused) -> JSONResponse:
    response = error(exc.status, exc.reason, exc.message)
    if exc.status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}"
        for e in exc.errors()
    )
    return error(422, "invalid_request", problems or "invalid request")


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    reason = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error(exc.status_code, reason, str(exc.detail))


async def internal(request: Request, exc: Exception) -> JSONResponse:
    # The message of an unexpected error may hold anything: only its type is shown.
    return error(500, "internal_error", f"unexpected {type(exc).__name__}")


# Which handler answers which error; Starlette picks the most specific class.
HANDLERS: tuple[tuple[type[Exception], ExceptionHandler], ...] = (
    (GleanerError, gleaner_error),
    (Throttled, throttled),
    (BodyTimeout, body_timeout),
    (ClientGone, client_gone),
    (Refused, refused),
    (RequestValidationError, invalid),
    (HTTPException, http_error),
    (Exception, internal),
)


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error as ``{"error": {"reason", "message"}}`` with its status."""
    for exc_type, handler in HANDLERS:
        app.add_exception_handler(exc_type, handler)
