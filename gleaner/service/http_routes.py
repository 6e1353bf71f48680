"""The HTTP service's routes: each checks the key, calls :class:`gleaner.Gleaner` (through
``service.keys.Service``) and adds no rule of its own."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel

from gleaner import ApiKey, JobStatus, NoteDetail, SearchHit
from gleaner.scrape import Scrape
from gleaner.service.harvest_pool import HarvestPool
from gleaner.service.http_body import read_body
from gleaner.service.http_paths import ConversationId, Owner, conversation_of, owner_of
from gleaner.service.keys import Key, Refused, Service, allowed_owner, may_write
from gleaner.service.limits import KeyLimits

router = APIRouter()


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


@router.get("/healthz", tags=["service"])
async def healthz() -> dict[str, bool]:
    """Answers while the process serves (no key, no database; async: it never waits for
    a thread, however busy the request threads and the harvest pool are)."""
    return {"ok": True}


@router.get("/metrics", tags=["service"], response_class=Response)
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


@router.post(
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
        body = await read_body(request, service.settings)

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


@router.get("/v1/jobs/{job_id}", tags=["conversations"])
def job(job_id: str, key: CountedKey, service: Service) -> JobStatus:
    """A job's state, outcome and cost; 404 for a job of an owner the key is not allowed."""
    return service.job(job_id, owner=key.owner)


@router.get("/v1/owners/{owner}/search", tags=["notes"])
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


@router.get("/v1/owners/{owner}/notes/{slug}", tags=["notes"])
def note(owner: Owner, slug: str, key: CountedKey, service: Service) -> NoteDetail:
    """One note with its links, backlinks, superseder and earlier versions."""
    return service.note(allowed_owner(service, key, owner_of(owner)), slug)


@router.get("/v1/owners/{owner}/index", tags=["notes"])
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


@router.delete("/v1/owners/{owner}", tags=["owners"])
def forget(
    owner: Owner, key: CountedWriteKey, service: Service, allow_reharvest: bool = False
) -> Forgotten:
    """Delete everything stored for the owner (``gleaner forget``): rows deleted by table."""
    name = allowed_owner(service, key, owner_of(owner))
    return Forgotten(owner=name, deleted=service.forget(name, allow_reharvest=allow_reharvest))


@router.delete("/v1/owners/{owner}/conversations/{conversation_id}", tags=["owners"])
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
