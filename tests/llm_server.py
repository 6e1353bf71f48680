"""A scripted, OpenAI-compatible chat-completions server on 127.0.0.1 for harvest tests.

Each request takes the next :class:`Behaviour` from the script (or, once the script is empty,
the server's ``default``); every request body is logged with the time it arrived. Everything is
bounded: replies sleep at most ``MAX_DELAY`` seconds, a hanging reply is held at most
``MAX_HANG`` seconds, sockets time out, and :meth:`close` wakes sleeping handlers, so a test
can never hang on the server.

:class:`ModelModes` is a responder for long runs (the reliability suite): it answers each
request with a note holding the transcript's marker (``My marker is M0123.`` -> a note
"Marker M0123"), counts requests per marker, and can be switched at any time between
``normal``, ``slow``, ``429``, ``500``, ``hang`` and ``garbage`` (for every request, or for
some markers only).
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

MAX_DELAY = 10.0
MAX_HANG = 120.0
CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")

CONTEXT_LENGTH_MESSAGE = (
    "This model's maximum context length is 8192 tokens. However, your messages resulted in "
    "9000 tokens. Please reduce the length of the messages."
)


@dataclass(frozen=True)
class Behaviour:
    """How the server answers one request.

    ``status`` 200 sends an OpenAI chat completion whose message content is ``content``;
    any other status sends ``error`` as an OpenAI error body. ``raw_body`` overrides both.
    ``hang`` > 0 sends nothing at all: the request is held that long (at most ``MAX_HANG``)
    and the connection then closed without an answer, as a model that never answers.
    ``trickle`` > 0 sends the answer a byte at a time, as a server that never quite stops.
    """

    status: int = 200
    content: str = '{"notes": []}'
    error: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    raw_body: bytes | None = None
    prompt_tokens: int = 100
    completion_tokens: int = 20
    finish_reason: str = "stop"
    hang: float = 0.0
    # > 0: the headers at once, then the body one byte every ``trickle`` seconds (for at
    # most MAX_HANG seconds, then the connection is dropped), as a hostile or stuck server.
    trickle: float = 0.0


# A responder decides from the request body; used where the answer depends on what is sent.
Responder = Callable[[dict[str, Any]], Behaviour]


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server saw: when (time.monotonic()), where, and its JSON body."""

    at: float
    path: str
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)  # names lowercased

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The chat messages of the request."""
        return list(self.body.get("messages", []))

    @property
    def user_text(self) -> str:
        """The content of the last user message (where the transcript goes)."""
        users = [m for m in self.messages if m.get("role") == "user"]
        return str(users[-1]["content"]) if users else ""


# --- behaviours --------------------------------------------------------------------------


def note(
    title: str,
    *,
    type: str = "preference",
    body: str | None = None,
    confidence: float = 0.8,
    topics: Sequence[str] = ("testing",),
    topic_key: str | None = None,
    keywords: Sequence[str] | None = None,
    evidence: Sequence[dict[str, str]] | None = None,
    mark: str | None = None,
    ref: str | None = None,
) -> dict[str, Any]:
    """One note item as the model would send it (``keywords``, ``mark`` and ``ref`` only
    when given: a model that never heard of them sends none). Without ``evidence`` the
    server quotes the transcript's first user line (``with_evidence``)."""
    item = {
        "type": type,
        "title": title,
        "body": body if body is not None else f"The user said: {title}.",
        "topics": list(topics),
        "confidence": confidence,
        "topic_key": topic_key,
    }
    if keywords is not None:
        item["keywords"] = list(keywords)
    if evidence is not None:
        item["evidence"] = [dict(quote) for quote in evidence]
    if mark is not None:
        item["mark"], item["ref"] = mark, ref
    return item


def answer(notes: Sequence[dict[str, Any]] = (), **kwargs: Any) -> Behaviour:
    """A normal answer: ``{"notes": [...]}`` as the message content."""
    return Behaviour(content=json.dumps({"notes": list(notes)}), **kwargs)


def text_answer(content: str, **kwargs: Any) -> Behaviour:
    """An answer whose message content is exactly ``content`` (prose, fences, garbage)."""
    return Behaviour(content=content, **kwargs)


def prose_wrapped(notes: Sequence[dict[str, Any]]) -> Behaviour:
    """Valid notes JSON with chatty prose around it."""
    payload = json.dumps({"notes": list(notes)}, indent=2)
    return text_answer(f"Sure! Here are the notes:\n\n{payload}\n\nAsk me for {{more}}.")


def truncated(notes: Sequence[dict[str, Any]] = (), cut: int = 40) -> Behaviour:
    """A notes JSON cut off mid-way, as when the model hits its token limit."""
    payload = json.dumps({"notes": list(notes) or [note("Truncated answer")]})
    return text_answer(payload[: min(cut, len(payload) - 1)], finish_reason="length")


def wrong_shape() -> Behaviour:
    """Valid JSON whose top level is not a notes object or list."""
    return text_answer(json.dumps({"facts": ["the user likes tea"], "count": 1}))


def slow(seconds: float, notes: Sequence[dict[str, Any]] = ()) -> Behaviour:
    """A normal answer sent after ``seconds`` (capped at MAX_DELAY)."""
    return answer(notes, delay=seconds)


def _error(message: str, type_: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def rate_limited(retry_after: float | None = 1.0) -> Behaviour:
    """429 with a Retry-After header (in seconds) unless ``retry_after`` is None."""
    headers = {"Retry-After": _format_seconds(retry_after)} if retry_after is not None else {}
    return Behaviour(
        status=429,
        error=_error("Rate limit reached for requests", "requests", "rate_limit_exceeded"),
        headers=headers,
    )


def server_error(status: int = 500) -> Behaviour:
    """A 5xx error (500 by default; 502, 503 also make sense)."""
    return Behaviour(status=status, error=_error("The server had an error", "server_error"))


def unavailable() -> Behaviour:
    """503 Service Unavailable."""
    return server_error(503)


def bad_request(message: str = "Invalid value for 'messages'.") -> Behaviour:
    """400 Bad Request (not a context-length error)."""
    return Behaviour(status=400, error=_error(message, "invalid_request_error"))


def unauthorized() -> Behaviour:
    """401 with OpenAI's invalid-key error."""
    return Behaviour(
        status=401,
        error=_error(
            "Incorrect API key provided: test.", "invalid_request_error", "invalid_api_key"
        ),
    )


def context_exceeded() -> Behaviour:
    """400 with OpenAI's ``context_length_exceeded`` code, which litellm maps to its own class."""
    return Behaviour(
        status=400,
        error=_error(CONTEXT_LENGTH_MESSAGE, "invalid_request_error", "context_length_exceeded"),
    )


def hang(seconds: float = MAX_HANG) -> Behaviour:
    """No answer at all: the request is held ``seconds`` (capped at MAX_HANG), then dropped."""
    return Behaviour(hang=seconds)


def _format_seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


# --- server ------------------------------------------------------------------------------


class LLMServer:
    """A scripted OpenAI-compatible server; use as a context manager.

    ``script(*behaviours)`` queues what the next requests get; a behaviour may also be a
    callable taking the request body. When the script runs out the server answers with
    ``default`` — by default a 400 ``unscripted request``, so an unexpected extra call fails
    fast instead of looking like success.
    """

    def __init__(self, default: Behaviour | Responder | None = None) -> None:
        self.default: Behaviour | Responder = default or bad_request("unscripted request")
        self.requests: list[RecordedRequest] = []
        self._script: deque[Behaviour | Responder] = deque()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._started = False

    # lifecycle

    def start(self) -> LLMServer:
        """Start serving in a background thread."""
        if not self._started:
            self._thread.start()
            self._started = True
        return self

    def close(self) -> None:
        """Stop serving; wake any handler still sleeping on a slow behaviour."""
        self._closing.set()
        if self._started:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
        self._httpd.server_close()

    def __enter__(self) -> LLMServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # scripting and inspection

    @property
    def port(self) -> int:
        """The ephemeral port the server listens on."""
        return int(self._httpd.server_address[1])

    @property
    def api_base(self) -> str:
        """The base URL to give litellm (``.../v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *behaviours: Behaviour | Responder) -> LLMServer:
        """Queue behaviours for the next requests, in order."""
        with self._lock:
            self._script.extend(behaviours)
        return self

    @property
    def calls(self) -> int:
        """How many chat-completion requests arrived."""
        with self._lock:
            return len(self.requests)

    @property
    def request_times(self) -> list[float]:
        """Arrival times (time.monotonic()) of the requests, in order."""
        with self._lock:
            return [r.at for r in self.requests]

    # request handling

    def _next(self, body: dict[str, Any]) -> Behaviour:
        with self._lock:
            item = self._script.popleft() if self._script else self.default
        return item if isinstance(item, Behaviour) else item(body)

    def _record(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        with self._lock:
            self.requests.append(
                RecordedRequest(at=time.monotonic(), path=path, body=body, headers=headers or {})
            )

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            # A stuck client cannot hold a handler thread for longer than this.
            timeout = 15
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                """Keep test output quiet."""

            def do_POST(self) -> None:
                path = self.path.split("?", 1)[0]
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if path not in CHAT_PATHS:
                    self._send(404, _error(f"no route {path}", "not_found"), {})
                    return
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"_unparseable": raw.decode("utf-8", "replace")}
                server._record(path, body, {k.lower(): v for k, v in self.headers.items()})
                behaviour = server._next(body)
                if behaviour.hang:
                    # Never answer: hold the request until the client gives up (its timeout),
                    # then drop the connection. close() cuts the wait short.
                    server._closing.wait(min(behaviour.hang, MAX_HANG))
                    self.close_connection = True
                    return
                if behaviour.delay:
                    # Event.wait, not sleep: close() must be able to cut a slow reply short.
                    server._closing.wait(min(behaviour.delay, MAX_DELAY))
                if behaviour.trickle:
                    data = behaviour.raw_body or json.dumps(_completion(body, behaviour)).encode()
                    self._trickle(data, behaviour.trickle)
                elif behaviour.raw_body is not None:
                    self._send_bytes(behaviour.status, behaviour.raw_body, behaviour.headers)
                elif behaviour.status == 200:
                    self._send(200, _completion(body, behaviour), behaviour.headers)
                else:
                    error = behaviour.error or _error("error", "server_error")
                    self._send(behaviour.status, error, behaviour.headers)

            def _trickle(self, data: bytes, seconds: float) -> None:
                self.close_connection = True
                ends = time.monotonic() + MAX_HANG
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    for index in range(len(data)):
                        self.wfile.write(data[index : index + 1])
                        if server._closing.wait(seconds) or time.monotonic() > ends:
                            return
                except OSError:
                    return  # the client gave up on it

            def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
                self._send_bytes(status, json.dumps(payload).encode(), headers)

            def _send_bytes(self, status: int, data: bytes, headers: dict[str, str]) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    # The client gave up (its timeout fired); nothing left to tell it.
                    self.close_connection = True

        return Handler


def _completion(request: dict[str, Any], behaviour: Behaviour) -> dict[str, Any]:
    with _counter_lock:
        _counter[0] += 1
        number = _counter[0]
    return {
        "id": f"chatcmpl-test{number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(request.get("model", "test-model")),
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": with_evidence(request, behaviour.content),
                },
                "finish_reason": behaviour.finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": behaviour.prompt_tokens,
            "completion_tokens": behaviour.completion_tokens,
            "total_tokens": behaviour.prompt_tokens + behaviour.completion_tokens,
        },
    }


_counter = [0]
_counter_lock = threading.Lock()


def with_evidence(request: dict[str, Any], content: str) -> str:
    """``content``, each note of a JSON answer that has no ``evidence`` given the one a
    model following the prompt would give: the first line the user said in the request's
    transcript, quoted. A script that wants other evidence (or none: ``[]``) says so."""
    try:
        answer_ = json.loads(content)
    except (ValueError, RecursionError):  # not JSON, or JSON no model should send
        return content
    notes = answer_.get("notes") if isinstance(answer_, dict) else None
    if not isinstance(notes, list) or all(
        not isinstance(n, dict) or "evidence" in n for n in notes
    ):
        return content
    quote = first_user_line(request)
    if quote is None:
        return content
    for item in notes:
        if isinstance(item, dict) and "evidence" not in item:
            item["evidence"] = [{"speaker": "user", "quote": quote}]
    return json.dumps(answer_)


def first_user_line(request: dict[str, Any]) -> str | None:
    """The first ``User: ...`` line of the transcript in a harvest request, or None."""
    for message in request.get("messages") or []:
        text_ = message.get("content") if isinstance(message, dict) else None
        if not isinstance(text_, str) or "<transcript>" not in text_:
            continue
        inside = text_.split("<transcript>", 1)[1].split("</transcript>", 1)[0]
        for line in inside.splitlines():
            if line.startswith("User: ") and line[6:].strip():
                return line[6:].strip()
    return None


@contextmanager
def llm_server(default: Behaviour | Responder | None = None) -> Iterator[LLMServer]:
    """Run an :class:`LLMServer` for the ``with`` block (the body of a pytest fixture)."""
    server = LLMServer(default)
    with server:
        yield server


@contextmanager
def refused_port() -> Iterator[int]:
    """A localhost port where a connection is refused.

    The socket stays bound but never listens, so nothing else can take the port while the
    block runs and every connect() gets ECONNREFUSED at once.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


# --- a switchable model for long runs -------------------------------------------------------

MARKER = re.compile(r"My marker is ([A-Za-z0-9]+)\.")
MODES = ("normal", "slow", "429", "500", "hang", "garbage")
GARBAGE = "<<<~~ not JSON: the model rambled {notes: [ {title: 'half"


def marker_in(body: dict[str, Any]) -> str | None:
    """The marker (``My marker is M0123.``) of the transcript a request carries, or None."""
    for message in body.get("messages", []):
        if message.get("role") == "user":
            found = MARKER.search(str(message.get("content", "")))
            if found:
                return found.group(1)
    return None


def marker_note(marker: str, answer_number: int) -> dict[str, Any]:
    """The note the model answers for a marker. ``answer_number`` makes each answer's body
    differ, so a transcript harvested twice would leave two notes (the same-fact rule sees
    the differing number and keeps both) instead of being merged out of sight."""
    return note(
        f"Marker {marker}",
        type="profile",
        body=f"The user's marker is {marker} (answer {answer_number}).",
        topics=("marker",),
        confidence=0.9,
    )


class ModelModes:
    """A responder switchable at run time between MODES; counts requests per marker.

    ``normal`` answers at once with :func:`marker_note` (plus ``extra[marker]`` notes),
    ``slow`` the same after ``slow_seconds``, ``429`` a rate limit with Retry-After
    ``retry_after`` s, ``500`` a server error, ``hang`` never answers (held ``hang_seconds``),
    ``garbage`` an answer that is not JSON. ``overrides[marker]`` gives one marker a mode of
    its own whatever the current one. ``switches`` logs ``(time.monotonic(), mode)``.
    """

    def __init__(
        self,
        *,
        slow_seconds: float = 2.0,
        retry_after: float = 1.0,
        hang_seconds: float = 60.0,
    ) -> None:
        self.slow_seconds = slow_seconds
        self.retry_after = retry_after
        self.hang_seconds = hang_seconds
        self.mode = "normal"
        self.overrides: dict[str, str] = {}
        self.extra: dict[str, list[dict[str, Any]]] = {}
        self.switches: list[tuple[float, str]] = [(time.monotonic(), "normal")]
        self.calls: Counter[str] = Counter()
        self.by_mode: Counter[str] = Counter()
        self._answers = 0
        self._lock = threading.Lock()

    def switch(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
        with self._lock:
            self.mode = mode
            self.switches.append((time.monotonic(), mode))

    def __call__(self, body: dict[str, Any]) -> Behaviour:
        marker = marker_in(body)
        with self._lock:
            self.calls[marker or ""] += 1
            mode = self.overrides.get(marker or "", self.mode)
            self.by_mode[mode] += 1
            self._answers += 1
            number = self._answers
        if mode == "429":
            return rate_limited(self.retry_after)
        if mode == "500":
            return server_error(500)
        if mode == "hang":
            return hang(self.hang_seconds)
        if mode == "garbage":
            return text_answer(GARBAGE)
        notes = [] if marker is None else [marker_note(marker, number), *self.extra.get(marker, [])]
        return answer(notes, delay=self.slow_seconds if mode == "slow" else 0.0)


# --- model servers as found in the wild ------------------------------------------------------
#
# Responders that behave like the servers privacy-minded users run (issue 15): a request is
# judged by its response_format and its messages, as those servers judge it.

# What llama-cpp-python's server answers to response_format json_schema: FastAPI's request
# validation error, wrapped by its error handler as an HTTP 500 "internal_server_error". This
# is the message of llama-cpp-python 0.3.36 under FastAPI 0.165, as seen by hand (README,
# "Model servers"); older FastAPI versions sent the bare list of errors.
LLAMA_CPP_SCHEMA_ERROR = (
    "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', "
    "'type'), 'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema', "
    "'ctx': {'expected': \"'text' or 'json_object'\"}}\n\n  File "
    '"/venv/lib/python3.11/site-packages/llama_cpp/server/app.py", line 376, in '
    "create_chat_completion\n    POST /v1/chat/completions"
)
PROSE = "Sure! The user seems to like tabs, and they decided to use PostgreSQL."


def format_of(body: dict[str, Any]) -> str:
    """The response format a request asked for: ``json_schema``, ``json_object_schema``
    (json_object with an inline schema), ``json_object``, ``none``, or the type as sent."""
    requested = body.get("response_format")
    if not requested:
        return "none"
    kind = requested.get("type") if isinstance(requested, dict) else None
    if kind == "json_object" and "schema" in requested:
        return "json_object_schema"
    return str(kind)


def _reply(then: Behaviour | Responder, body: dict[str, Any]) -> Behaviour:
    return then if isinstance(then, Behaviour) else then(body)


def llama_cpp_schema_error() -> Behaviour:
    """HTTP 500 with llama-cpp-python's message for a json_schema response_format."""
    return Behaviour(status=500, error=_error(LLAMA_CPP_SCHEMA_ERROR, "internal_server_error"))


def rejects_json_schema(then: Behaviour | Responder | None = None) -> Responder:
    """llama-cpp-python's server: json_schema -> HTTP 500; any other request -> ``then``."""

    def respond(body: dict[str, Any]) -> Behaviour:
        if format_of(body) == "json_schema":
            return llama_cpp_schema_error()
        return _reply(then or answer(), body)

    return respond


def only_json_object(then: Behaviour | Responder | None = None) -> Responder:
    """A server that takes only ``{"type": "json_object"}``: json_schema -> HTTP 500 (as
    llama-cpp), an inline schema -> 400, and with no response_format its model answers
    prose instead of JSON. ``then`` answers a json_object request."""

    def respond(body: dict[str, Any]) -> Behaviour:
        kind = format_of(body)
        if kind == "json_object":
            return _reply(then or answer(), body)
        if kind == "json_schema":
            return llama_cpp_schema_error()
        if kind == "none":
            return text_answer(PROSE)
        return bad_request(f"response_format {kind} is not supported: use json_object")

    return respond


EXAMPLE_JSON = re.compile(r'\{"notes": \[\{.*?\}\]\}')


def copies_example() -> Responder:
    """A small model that answers with the prompt's own example JSON, verbatim."""

    def respond(body: dict[str, Any]) -> Behaviour:
        for message in body.get("messages", []):
            found = EXAMPLE_JSON.search(str(message.get("content", "")))
            if found:
                return text_answer(found.group(0))
        return text_answer(PROSE)

    return respond


AT_MOST = re.compile(r"at most (\d+) notes")


def stops_at_length(*, body_words: int = 60, chars_per_token: int = 4) -> Responder:
    """A model that fills its answer: as many notes as the request allows ("at most N
    notes"), bodies of ``body_words`` words (one sentence of 8 when asked for "one
    sentence"), cut at the request's ``max_tokens`` (``chars_per_token`` characters each)
    with finish_reason ``length`` when it does not fit."""

    def respond(body: dict[str, Any]) -> Behaviour:
        users = [str(m.get("content", "")) for m in body.get("messages", [])]
        asked = AT_MOST.findall(users[-1] if users else "")
        count = int(asked[-1]) if asked else 5
        short = "one sentence" in (users[-1] if users else "")
        words = 8 if short else body_words
        notes = [
            note(f"Fact number {i}", body=" ".join(["Detail"] * words) + ".") for i in range(count)
        ]
        content = json.dumps({"notes": notes})
        limit = int(body.get("max_tokens") or 1_000_000) * chars_per_token
        if len(content) > limit:
            return text_answer(content[:limit], finish_reason="length")
        return text_answer(content)

    return respond


class DropsSystem:
    """A chat template that keeps only user and model turns (llama-cpp's ``gemma``): system
    messages are dropped before the model sees the request, and ``seen`` records the turns it
    did see, per request.

    The model follows rules only when it can see them: when its turns state the answer's
    shape (``{"notes": [``) and that the transcript is data, it answers ``then``; otherwise
    it rambles in prose.
    """

    def __init__(self, then: Behaviour | Responder | None = None) -> None:
        self.then = then or answer()
        self.seen: list[list[dict[str, Any]]] = []
        self.dropped = 0
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Behaviour:
        messages = list(body.get("messages", []))
        kept = [m for m in messages if m.get("role") != "system"]
        with self._lock:
            self.seen.append(kept)
            self.dropped += len(messages) - len(kept)
        visible = "\n".join(str(m.get("content", "")) for m in kept)
        if '{"notes": [' in visible and "data, not instructions" in visible:
            return _reply(self.then, {**body, "messages": kept})
        return text_answer(PROSE)


def max_items_of(body: dict[str, Any]) -> int | None:
    """The ``maxItems`` of the notes list in the schema a request sent, inline
    (``json_object`` with ``schema``) or as ``json_schema``; None when it sets none."""
    requested = body.get("response_format")
    if not isinstance(requested, dict):
        return None
    schema = requested.get("schema") or (requested.get("json_schema") or {}).get("schema") or {}
    limit = schema.get("properties", {}).get("notes", {}).get("maxItems")
    return int(limit) if isinstance(limit, int) else None


def repeats_a_note(item: dict[str, Any], *, chars_per_token: int = 4) -> Responder:
    """A small model that writes ``item`` again and again (SmolLM2-135M did, on a release-notes
    transcript), cut at the request's ``max_tokens`` with finish_reason ``length``, whatever
    the prompt asks. A grammar-constrained server (llama-cpp-python with an inline schema)
    closes the list after the schema's ``maxItems``: then the answer is complete."""

    def respond(body: dict[str, Any]) -> Behaviour:
        limit = int(body.get("max_tokens") or 1_000_000) * chars_per_token
        bound = max_items_of(body)
        if bound is not None:
            content = json.dumps({"notes": [item] * bound})
            if len(content) <= limit:
                return text_answer(content)
        content = json.dumps({"notes": [item] * (limit // len(json.dumps(item)) + 2)})
        return text_answer(content[:limit], finish_reason="length")

    return respond


def slowly(seconds: float, then: Behaviour | Responder | None = None) -> Responder:
    """A CPU-bound server: ``then``'s answer sent after ``seconds`` (capped at MAX_DELAY)."""

    def respond(body: dict[str, Any]) -> Behaviour:
        return replace(_reply(then or answer(), body), delay=seconds)

    return respond


def trickling(
    seconds_per_byte: float = 1.0, then: Behaviour | Responder | None = None
) -> Responder:
    """A server that sends ``then``'s answer a byte every ``seconds_per_byte``: every single
    read of it is quick, the whole answer takes minutes."""

    def respond(body: dict[str, Any]) -> Behaviour:
        return replace(_reply(then or answer(), body), trickle=seconds_per_byte)

    return respond
