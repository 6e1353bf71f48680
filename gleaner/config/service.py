"""The HTTP service's settings: body bounds and deadlines, connections, its harvest pool and
the per-key limits; and the command line's progress lines."""

from __future__ import annotations

from pydantic import Field

from gleaner.config.base import Part


class ServiceSettings(Part):
    """The HTTP service's knobs (``gleaner.service``; ``gleaner.read(upload=True)`` bounds a
    body by ``http_max_body_bytes``)."""

    http_max_body_bytes: int = Field(
        default=4_000_000,
        gt=0,
        description="Most bytes of one HTTP request body (a zip inflated), counted while it "
        "streams in and before any parsing; more is 413 too_large.",
    )
    http_body_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Seconds an HTTP client has to send a whole request body; slower is 408.",
    )
    http_header_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Seconds an HTTP connection may wait for a request's line and headers "
        "(after it opens or after its last answer); then it is closed.",
    )
    http_max_connections: int = Field(
        default=1_000,
        gt=0,
        description="Open HTTP connections (and requests in progress) one server process "
        "serves; a request over it is answered 503.",
    )
    http_harvest_threads: int = Field(
        default=4,
        gt=0,
        le=256,
        description="Threads of the HTTP service's harvest pool: submits are read there, and "
        "harvested (no broker) or queued, apart from the threads that answer requests.",
    )
    http_harvest_queue: int = Field(
        default=32,
        ge=0,
        description="Submits that may wait for a harvest thread; one more is 503 with Retry-After.",
    )
    http_submits_per_key: int = Field(
        default=4,
        gt=0,
        description="Submits one API key may have in progress at once; one more is 429.",
    )
    http_requests_per_minute: int = Field(
        default=600,
        ge=0,
        description="Requests one API key may make in a moving minute, per server process; "
        "more are 429 with Retry-After; 0 turns the limit off.",
    )


class CommandSettings(Part):
    """The command line's knobs (``gleaner.cli``)."""

    progress_seconds: float = Field(
        default=5.0,
        ge=0,
        description="Seconds between two plain progress lines of harvest, import and status "
        "--watch when stderr is no terminal (logs, CI); the first and last are always shown.",
    )
