"""``gleaner serve``: the public Python API over HTTP (FastAPI, served by uvicorn).

Every route calls :class:`gleaner.Gleaner` and adds no rule of its own; the key in
``Authorization: Bearer`` decides which owners a request may act for. Errors are JSON,
``{"error": {"reason": ..., "message": ...}}``, and a refused request changes nothing:

    401 no key, or an unknown or revoked one      403 the key is not allowed that owner,
                                                  or is read-only and the route writes
    400 the body is no conversation we can read  413 over a size limit
    422 a bad owner, parameter or note type      404 no such note, job or conversation
    408 the body did not arrive in time           429 over the key's rate or submits
    503 the database or the broker is down, or the harvest pool is full

429 and 503 for a limit carry ``Retry-After`` (seconds).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import quote, unquote, unquote_to_bytes

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from gleaner import (
    ApiKey,
    Gleaner,
    GleanerError,
    InvalidRequest,
    JobStatus,
    NoteDetail,
    NotFound,
    SearchHit,
    Settings,
    TooLarge,
    Unavailable,
)
from gleaner.scrape import Scrape
from service.harvest_pool import HarvestPool
from service.keys import Key, Refused, Service, allowed_owner, may_write
from service.limits import KeyLimits, Throttled

# Refusals of the body itself: it is not one conversation that can be read.
UNREADABLE = frozenset({"bad_transcript", "too_deep", "not_one_conversation"})
OWNERS = b"/v1/owners/"
CONVERSATIONS = b"conversations/"
# uvicorn's own logger: its format and --log-level.
log = logging.getLogger("uvicorn.error")


class ClientGone(Exception):
    """Raised when the client went away before its request body was whole (logged once)."""


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


class Accepted(BaseModel):
    """A conversation taken in: its job, whose owner it is, and whether it was queued
    (``false``: harvested in the server's process before the answer)."""

    job_id: str
    owner: str
    conversation_id: str
    queued: bool


class Hits(BaseModel):
    hits: list[SearchHit]


class IndexText(BaseModel):
    owner: str
    text: str


class Forgotten(BaseModel):
    owner: str
    deleted: dict[str, int]


class ConversationForgotten(BaseModel):
    """What forgetting one conversation did: notes deleted and restored, history entries,
    links, vectors, ledger rows and jobs deleted, tombstones left (by name)."""

    owner: str
    conversation_id: str
    counts: dict[str, int]


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


def key_limits(request: Request) -> KeyLimits:
    found: KeyLimits = request.app.state.key_limits
    return found


async def counted_key(request: Request, key: Key) -> ApiKey:
    """The request's key, counted against its rate (Throttled, 429, past it). Async: the
    count is a dict lookup, no thread is taken for it."""
    key_limits(request).hit(key.id)
    return key


# Every route but /healthz: a key, checked and counted.
CountedKey = Annotated[ApiKey, Depends(counted_key)]


async def counted_write_key(key: CountedKey) -> ApiKey:
    """The key of a route that changes what is stored: a read-only key is refused (403)
    before the request's body is read."""
    return may_write(key)


CountedWriteKey = Annotated[ApiKey, Depends(counted_write_key)]


def create_app(gleaner: Gleaner) -> FastAPI:
    """The service for one ``Gleaner`` (its database, its broker or none)."""
    app = FastAPI(
        title="Gleaner",
        version="1",
        summary="Finished conversations in, durable notes out.",
        responses=ERRORS,
    )
    app.state.gleaner = gleaner
    app.state.metrics = None
    settings = gleaner.settings
    app.state.key_limits = KeyLimits(
        settings.http_requests_per_minute, settings.http_submits_per_key
    )
    app.state.harvest_pool = HarvestPool(settings.http_harvest_threads, settings.http_harvest_queue)
    app.add_middleware(OwnerSegment)
    _handle_errors(app)

    @app.get("/healthz", tags=["service"])
    async def healthz() -> dict[str, bool]:
        """Answers while the process serves (no key, no database; async: it never waits for
        a thread, however busy the request threads and the harvest pool are)."""
        return {"ok": True}

    @app.get("/metrics", tags=["service"], response_class=Response)
    def metrics(request: Request, key: CountedKey) -> Response:
        """Prometheus metrics (text format): jobs by state, queue depths, model calls,
        tokens and cost by model, job durations, search latency. The figures are every
        owner's: only a key allowed all owners may read them (403 otherwise)."""
        if key.owner is not None:
            raise Refused(
                403,
                "forbidden_metrics",
                "metrics count every owner's work: read them with a key for all owners",
            )
        scrape = request.app.state.metrics
        if scrape is None:  # made at the first scrape: it loads the workers' modules
            scrape = request.app.state.metrics = Scrape(request.app.state.gleaner)
        body, content_type = scrape.text()
        return Response(body, media_type=content_type)

    @app.post(
        "/v1/conversations",
        status_code=202,
        tags=["conversations"],
        openapi_extra={
            "requestBody": {
                "required": True,
                "description": "One conversation, in any format `gleaner enqueue` reads: "
                "native JSON, OpenAI-style messages, JSON Lines, a one-conversation export "
                "or its zip. At most GLEANER_HTTP_MAX_BODY_BYTES, a zip inflated.",
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "application/zip": {"schema": {"type": "string", "format": "binary"}},
                },
            }
        },
    )
    async def submit(
        request: Request,
        key: CountedWriteKey,
        service: Service,
        owner: str | None = None,
        reassign_owner: bool = False,
    ) -> Accepted:
        """Take one finished conversation: recorded (redacted) as a job and queued, or
        harvested at once when the server has no broker. ``owner`` fills in a conversation
        that names none (a one-owner key's owner when left out); ``reassign_owner`` puts it
        in ``owner``'s scope whatever it names. The key must be allowed the owner it ends in.
        The body is read, and harvested (no broker) or queued, on the server's harvest pool
        (503 when it is full); a key has at most GLEANER_HTTP_SUBMITS_PER_KEY submits in
        progress (429).
        """
        if owner is None and key.owner is not None:
            owner = key.owner
        if owner is not None:
            owner = allowed_owner(service, key, owner)  # before the body is read
        with key_limits(request).submitting(key.id):
            body = await _body(request, service.settings)

            def accept() -> Accepted:  # one trip to a thread: read, check, record, send
                read = service.read(body, owner=owner, reassign_owner=reassign_owner, upload=True)
                allowed_owner(service, key, read.owner)
                return Accepted(
                    job_id=service.submit(read),
                    owner=read.owner,
                    conversation_id=read.conversation_id,
                    queued=service.queued,
                )

            # Read, and harvested or queued, on the harvest pool: parsing a body costs
            # about 10x its size, so the pool's size bounds that memory too.
            pool: HarvestPool = request.app.state.harvest_pool
            return await pool.run(accept)

    @app.get("/v1/jobs/{job_id}", tags=["conversations"])
    def job(job_id: str, key: CountedKey, service: Service) -> JobStatus:
        """A job's state, outcome and cost; 404 for a job of an owner the key is not allowed."""
        return service.job(job_id, owner=key.owner)

    @app.get("/v1/owners/{owner}/search", tags=["notes"])
    def search(  # noqa: PLR0917 - FastAPI passes every parameter by name
        owner: Owner,
        q: Annotated[str, Query(max_length=1000)],
        key: CountedKey,
        service: Service,
        limit: Annotated[int, Query(ge=1, le=100)] = 10,
        since: Annotated[datetime | None, Query()] = None,
        until: Annotated[datetime | None, Query()] = None,
    ) -> Hits:
        """The owner's live notes matching any word of ``q``, best first; ``since`` and
        ``until`` (ISO times) keep facts said in that window. Each hit's note has
        ``said_at``, when its fact was said."""
        name = allowed_owner(service, key, owner_of(owner))
        return Hits(hits=service.search(name, q, limit=limit, since=since, until=until))

    @app.get("/v1/owners/{owner}/notes/{slug}", tags=["notes"])
    def note(owner: Owner, slug: str, key: CountedKey, service: Service) -> NoteDetail:
        """One note with its links, backlinks, superseder and earlier versions."""
        return service.note(allowed_owner(service, key, owner_of(owner)), slug)

    @app.get("/v1/owners/{owner}/index", tags=["notes"])
    def index_text(
        owner: Owner,
        key: CountedKey,
        service: Service,
        q: Annotated[str | None, Query(max_length=4000)] = None,
    ) -> IndexText:
        """The compact memory index that goes into the owner's system prompt: pinned notes,
        then (with ``q``, the conversation so far) the notes most relevant to it, then other
        titles."""
        name = allowed_owner(service, key, owner_of(owner))
        return IndexText(owner=name, text=service.index_text(name, q))

    @app.delete("/v1/owners/{owner}", tags=["owners"])
    def forget(
        owner: Owner, key: CountedWriteKey, service: Service, allow_reharvest: bool = False
    ) -> Forgotten:
        """Delete everything stored for the owner (``gleaner forget``): rows deleted by table."""
        name = allowed_owner(service, key, owner_of(owner))
        return Forgotten(owner=name, deleted=service.forget(name, allow_reharvest=allow_reharvest))

    @app.delete("/v1/owners/{owner}/conversations/{conversation_id}", tags=["owners"])
    def forget_conversation(
        owner: Owner, conversation_id: ConversationId, key: CountedWriteKey, service: Service
    ) -> ConversationForgotten:
        """Forget one conversation of the owner (``gleaner forget --conversation``): the
        notes only it supports are deleted, a note it changed gets back the text before it;
        404 when nothing of the owner names it."""
        name = allowed_owner(service, key, owner_of(owner))
        found = conversation_of(conversation_id)
        counts = service.forget_conversation(name, found)
        return ConversationForgotten(owner=name, conversation_id=found, counts=counts)

    return app


def body_limit(settings: Settings) -> tuple[int, str]:
    """The most bytes of a request body, and the setting that sets it (the smaller of the
    HTTP body limit and the file limit)."""
    if settings.max_file_bytes < settings.http_max_body_bytes:
        return settings.max_file_bytes, "GLEANER_MAX_FILE_BYTES"
    return settings.http_max_body_bytes, "GLEANER_HTTP_MAX_BODY_BYTES"


async def _body(request: Request, settings: Settings) -> bytes:
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


class BodyTimeout(Exception):
    """Raised when a request body is not whole within its deadline (408)."""


def _handle_errors(app: FastAPI) -> None:
    @app.exception_handler(GleanerError)
    async def gleaner_error(request: Request, exc: GleanerError) -> JSONResponse:
        response = error(status_of(exc), exc.reason, exc.message)
        if response.status_code == 413:
            response.headers["Connection"] = "close"  # the rest of the body is not read
        return response

    @app.exception_handler(Throttled)
    async def throttled(request: Request, exc: Throttled) -> JSONResponse:
        response = error(exc.status, exc.reason, exc.message)
        response.headers["Retry-After"] = str(exc.retry_after)
        return response

    @app.exception_handler(BodyTimeout)
    async def body_timeout(request: Request, exc: BodyTimeout) -> JSONResponse:
        response = error(408, "body_timeout", str(exc))
        response.headers["Connection"] = "close"  # the rest of the body is not waited for
        return response

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone) -> JSONResponse:
        # Nobody reads it: the exception is handled here so that nothing logs a traceback.
        return error(400, "client_gone", "the client went away mid-body")

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> JSONResponse:
        response = error(exc.status, exc.reason, exc.message)
        if exc.status == 401:
            response.headers["WWW-Authenticate"] = "Bearer"
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}"
            for e in exc.errors()
        )
        return error(422, "invalid_request", problems or "invalid request")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        reason = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error(exc.status_code, reason, str(exc.detail))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        # The message of an unexpected error may hold anything: only its type is shown.
        return error(500, "internal_error", f"unexpected {type(exc).__name__}")


def from_environment() -> FastAPI:
    """The app on the ``GLEANER_*`` environment (``uvicorn --factory service.http:...``)."""
    return create_app(Gleaner())
