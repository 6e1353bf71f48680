"""uvicorn's HTTP/1.1 protocol with a deadline on request headers.

uvicorn (h11) arms its keep-alive timer only after an answer and cancels it at the first byte
that arrives: a client that opens a connection and sends nothing, or trickles a request line
and headers a byte at a time, keeps it open for ever (and counts against
``--limit-concurrency``, so enough of them shut everyone else out). Here a connection whose
request line and headers are not whole ``GLEANER_HTTP_HEADER_TIMEOUT_SECONDS`` after it
opened, or after its request's first byte, is closed. A body's own deadline is the service's
(``service.http``).
"""

from __future__ import annotations

import asyncio
import logging
from functools import cache
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

# uvicorn's own logger: its format and --log-level.
log = logging.getLogger("uvicorn.error")


@cache
def header_timeout() -> float:
    """The deadline from the environment (read once per server process)."""
    from gleaner import load_settings

    return float(load_settings().http_header_timeout_seconds)


class HeaderDeadlineProtocol(H11Protocol):
    """H11Protocol that drops a connection waiting too long for a request's headers.
    ``gleaner serve`` names it as uvicorn's ``http`` (an import string, so that every
    worker process builds its own). An idle connection between requests is left to
    uvicorn's keep-alive timer; the deadline runs from the connection's opening, or from
    the first byte of its next request, until the request's head is whole."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout()
        self._header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # a request's head begun, not yet whole
            if self._header_deadline is None:
                self._arm_header_deadline()
        else:
            self._cancel_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_deadline()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        self._cancel_header_deadline()
        self._header_deadline = self.loop.call_later(self.header_timeout, self._header_overdue)

    def _cancel_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _header_overdue(self) -> None:
        self._header_deadline = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        client = "%s:%d" % self.client if self.client else "a client"  # noqa: UP031
        log.info(
            "closed the connection of %s: no whole request within %g s "
            "(GLEANER_HTTP_HEADER_TIMEOUT_SECONDS)",
            client,
            self.header_timeout,
        )
        self.transport.close()
