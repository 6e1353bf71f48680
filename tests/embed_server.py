"""A scripted, OpenAI-compatible ``/v1/embeddings`` server on 127.0.0.1 for the embedding
clients' tests (the chat-completions twin is tests/llm_server.py).

Each request takes the next :class:`Reply` from the script (or, once the script is empty, the
server's ``default``: a good answer). A good answer holds one vector per input, made from
the text itself (:func:`vector_of`), so the same text always gets the same vector and a test
can tell which text a vector belongs to. The vectors are sent as JSON numbers, or as base64
float32 when the request asks ``encoding_format: base64`` (as the openai client under litellm
does). Everything is bounded as in tests/llm_server.py: a delay at most ``MAX_DELAY``
seconds, a hang at most ``MAX_HANG``, and :meth:`EmbedServer.close` wakes every handler.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

MAX_DELAY = 10.0
MAX_HANG = 60.0
EMBEDDING_PATHS = ("/v1/embeddings", "/embeddings")
DIMENSIONS = 8


def vector_of(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    """The (not normalised) vector the server gives ``text``: numbers from its sha256, in
    1..256, so no vector is zero."""
    digest = hashlib.sha256(text.encode()).digest()
    return [float(digest[i % len(digest)] + 1) for i in range(dimensions)]


@dataclass(frozen=True)
class Reply:
    """How the server answers one request.

    ``status`` 200 sends one vector per input of ``dimensions`` numbers; ``count`` sends
    that many instead (a wrong answer), ``nan`` puts a NaN in the first vector,
    ``reverse_index`` sends the items in reverse order with their ``index`` (still a right
    answer), ``usage`` False leaves the usage out. Any other status sends ``error`` as an
    OpenAI error body. ``raw_body`` overrides both; ``hang`` > 0 never answers (the
    connection is dropped after at most ``MAX_HANG`` s).
    """

    status: int = 200
    dimensions: int = DIMENSIONS
    count: int | None = None
    nan: bool = False
    reverse_index: bool = False
    usage: bool = True
    prompt_tokens: int | None = None
    error: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    hang: float = 0.0
    raw_body: bytes | None = None


Responder = Callable[[dict[str, Any]], Reply]


def error_body(message: str, type_: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def rate_limited(retry_after: float = 1.0) -> Reply:
    """429 with a Retry-After header, in seconds."""
    value = str(int(retry_after)) if float(retry_after).is_integer() else str(retry_after)
    return Reply(
        status=429,
        error=error_body("Rate limit reached", "requests", "rate_limit_exceeded"),
        headers={"Retry-After": value},
    )


def server_error(status: int = 500) -> Reply:
    return Reply(status=status, error=error_body("The server had an error", "server_error"))


def bad_request(message: str = "Invalid value for 'input'.") -> Reply:
    return Reply(status=400, error=error_body(message, "invalid_request_error"))


def too_long() -> Reply:
    """400 as llama.cpp's server says an input is over its batch."""
    return bad_request(
        "input (600 tokens) is too large to process. increase the physical batch size; "
        "the maximum context length is 512 tokens"
    )


def hang(seconds: float = MAX_HANG) -> Reply:
    return Reply(hang=seconds)


@dataclass(frozen=True)
class SeenRequest:
    """One request the server saw: when (time.monotonic()), its JSON body and headers."""

    at: float
    body: dict[str, Any]
    headers: dict[str, str]

    @property
    def inputs(self) -> list[str]:
        raw = self.body.get("input")
        return [raw] if isinstance(raw, str) else list(raw or [])


class EmbedServer:
    """A scripted OpenAI-compatible embeddings server; use as a context manager.

    ``script(*replies)`` queues what the next requests get (a reply may be a callable taking
    the request body); when the script runs out, ``default`` answers (a good answer).
    """

    def __init__(self, default: Reply | Responder | None = None) -> None:
        self.default: Reply | Responder = default or Reply()
        self.requests: list[SeenRequest] = []
        self._script: deque[Reply | Responder] = deque()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> EmbedServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving; wake any handler still waiting on a delay or a hang."""
        self._closing.set()
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join(timeout=5)
        self._httpd.server_close()

    @property
    def api_base(self) -> str:
        """The base URL a client is given (``.../v1``)."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def script(self, *replies: Reply | Responder) -> EmbedServer:
        with self._lock:
            self._script.extend(replies)
        return self

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self.requests)

    def _next(self, body: dict[str, Any], headers: dict[str, str]) -> Reply:
        with self._lock:
            self.requests.append(SeenRequest(time.monotonic(), body, headers))
            item = self._script.popleft() if self._script else self.default
        return item if isinstance(item, Reply) else item(body)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 15  # a stuck client holds a handler thread no longer than this
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                """Keep test output quiet."""

            def do_POST(self) -> None:
                path = self.path.split("?", 1)[0]
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if path not in EMBEDDING_PATHS:
                    self._send(404, json.dumps(error_body(f"no route {path}", "nf")).encode(), {})
                    return
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"_unparseable": raw.decode("utf-8", "replace")}
                reply = server._next(body, {k.lower(): v for k, v in self.headers.items()})
                if reply.hang:
                    server._closing.wait(min(reply.hang, MAX_HANG))
                    self.close_connection = True
                    return
                if reply.delay:
                    server._closing.wait(min(reply.delay, MAX_DELAY))
                if reply.raw_body is not None:
                    data = reply.raw_body
                elif reply.status == 200:
                    data = json.dumps(answer(body, reply)).encode()  # NaN goes out as NaN
                else:
                    data = json.dumps(reply.error or error_body("error", "server_error")).encode()
                self._send(reply.status, data, reply.headers)

            def _send(self, status: int, data: bytes, headers: dict[str, str]) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client gave up (its timeout fired)

        return Handler


def answer(request: dict[str, Any], reply: Reply) -> dict[str, Any]:
    """The OpenAI embeddings answer to ``request`` that ``reply`` asks for."""
    raw = request.get("input")
    texts = [raw] if isinstance(raw, str) else [str(t) for t in raw or []]
    count = len(texts) if reply.count is None else reply.count
    vectors = [
        vector_of(texts[i % len(texts)] if texts else "", reply.dimensions) for i in range(count)
    ]
    if reply.nan and vectors:
        vectors[0][0] = float("nan")
    as_base64 = request.get("encoding_format") == "base64"
    items = [
        {
            "object": "embedding",
            "index": i,
            "embedding": _base64(vector) if as_base64 else vector,
        }
        for i, vector in enumerate(vectors)
    ]
    if reply.reverse_index:
        items.reverse()
    body: dict[str, Any] = {
        "object": "list",
        "data": items,
        "model": str(request.get("model", "test-embed")),
    }
    if reply.usage:
        tokens = (
            reply.prompt_tokens
            if reply.prompt_tokens is not None
            else sum(len(t.split()) for t in texts)
        )
        body["usage"] = {"prompt_tokens": tokens, "total_tokens": tokens}
    return body


def _base64(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


@contextmanager
def embed_server(default: Reply | Responder | None = None) -> Iterator[EmbedServer]:
    """Run an :class:`EmbedServer` for the ``with`` block (the body of a pytest fixture)."""
    with EmbedServer(default) as server:
        yield server
