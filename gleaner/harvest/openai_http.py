"""A lean client for OpenAI-compatible chat servers: one POST per call, nothing else.

``GLEANER_HARVEST_LLM=auto`` (the default) sends ``openai/<model>`` calls to a
``GLEANER_HARVEST_API_BASE`` (llama.cpp, Ollama, vLLM, LM Studio, any compatible provider)
through here, and every other model through litellm. litellm's per-call machinery (logging,
callbacks, cost and model-info lookups) costs several times the HTTP round trip itself on a
local server; here a call is the request, the response and the same error classes:

- 429, 408, 409, 5xx, timeouts and connection errors are transient (``Retry-After`` and
  ``retry-after-ms`` honoured), every other 4xx permanent;
- a 400 saying the prompt exceeds the context is ``ContextWindowExceeded``;
- a 400/422/5xx naming the response format is ``ResponseFormatRejected`` (``auto`` then
  falls back, as on the litellm path);
- usage and ``finish_reason`` are read from the answer.

The transport is the standard library's ``http.client``: one kept-alive connection per
thread and server, made on first use (so a forked worker child never shares its parent's
sockets); the timeout bounds the whole call, however slowly the server sends its answer
(``harvest.deadline``). A connection the server closed while
idle is opened again once, at no attempt's cost. A stop signal raised inside the call (a
soft time limit) goes through untouched. Proxies from the environment are not used: a model
server is reached directly.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from gleaner.harvest.deadline import DeadlinePassed, SocketDeadline, timeout_message
from gleaner.harvest.errors import (
    ContextWindowExceeded,
    ModelError,
    PermanentModelError,
    ResponseFormatRejected,
    TransientModelError,
    server_text,
)
from gleaner.harvest.formats import format_payload, known_format, refuses_format
from gleaner.harvest.llm import LLMAnswer, Messages, content_text
from gleaner.harvest.options import ModelOptions
from gleaner.harvest.retry import retry_after_from

# What servers say when the prompt does not fit (OpenAI's code, llama.cpp, vLLM, Ollama).
CONTEXT_WORDS = (
    "context_length_exceeded",
    "context length",
    "maximum context",
    "context window",
    "exceeds the available context",
    "too many tokens",
)

# Connections of this thread, by (process, scheme, host, port): a forked child or another
# thread opens its own (http.client connections are neither fork- nor thread-safe).
_local = threading.local()


def _connection(scheme: str, host: str, port: int, timeout: float) -> http.client.HTTPConnection:
    """This thread's kept-alive connection to the server (opened on first use)."""
    pool: dict[tuple[int, str, str, int], http.client.HTTPConnection] = _local.__dict__.setdefault(
        "pool", {}
    )
    key = (os.getpid(), scheme, host, port)
    conn = pool.get(key)
    if conn is None:
        kind = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        conn = pool[key] = kind(host, port, timeout=timeout)
    conn.timeout = timeout
    if conn.sock is not None:
        conn.sock.settimeout(timeout)
    return conn


def _drop(scheme: str, host: str, port: int) -> None:
    pool = _local.__dict__.get("pool", {})
    conn = pool.pop((os.getpid(), scheme, host, port), None)
    if conn is not None:
        conn.close()


def post(
    url: str, body: bytes, headers: dict[str, str], timeout: float
) -> tuple[int, dict[str, str], bytes]:
    """POST ``body`` on this thread's kept-alive connection to the server of ``url`` (the
    embeddings client's transport too): ``(status, headers lowercased, body)``.

    ``timeout`` bounds the whole call, connecting, waiting and reading the whole answer
    (``harvest.deadline``): a server trickling its answer is cut off at it, with
    ``DeadlinePassed`` (a TimeoutError). Raises TimeoutError, OSError or
    http.client.HTTPException as the socket does."""
    parts = urlsplit(url)
    scheme = parts.scheme or "http"
    host = parts.hostname or "localhost"
    port = parts.port or (443 if scheme == "https" else 80)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    ends = time.monotonic() + timeout
    while True:
        left = ends - time.monotonic()
        if left <= 0:
            raise DeadlinePassed(timeout)
        conn = _connection(scheme, host, port, left)
        reused = conn.sock is not None  # kept alive from an earlier call
        deadline = SocketDeadline(conn, left)
        try:
            with deadline:
                conn.request("POST", path, body, headers)
                response = conn.getresponse()
                data = response.read()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            _drop(scheme, host, port)
            if deadline.fired:
                raise DeadlinePassed(timeout) from None
            if not reused:
                raise
            continue  # the server closed the idle kept-alive connection: once more, fresh
        except BaseException:
            _drop(scheme, host, port)  # half-used: never reuse it
            if deadline.fired:
                raise DeadlinePassed(timeout) from None
            raise
        if response.will_close or deadline.fired:  # fired: its socket is shut down
            _drop(scheme, host, port)
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data


def served_model(model: str) -> str:
    """The model name the server knows: ``openai/<name>`` -> ``<name>``."""
    return model.split("/", 1)[1] if model.startswith("openai/") else model


def openai_call(messages: Messages, *, options: ModelOptions) -> LLMAnswer:
    """One chat completion from the OpenAI-compatible server at ``options.api_base``."""
    if not options.api_base:
        raise PermanentModelError("the lean OpenAI client needs GLEANER_HARVEST_API_BASE")
    mode = options.response_format
    if mode == "auto":
        # A server behind an api_base is not one litellm knows: start at the strongest format
        # and let the server's answer decide (one refused request per process at most).
        mode = known_format(options.model, options.api_base) or "json_schema"
    body: dict[str, Any] = {
        "model": served_model(options.model),
        "messages": messages,
        "temperature": options.temperature,
        "max_tokens": options.max_answer_tokens,
    }
    payload = format_payload(mode, options.types, options.max_facts)
    if payload is not None:
        body["response_format"] = payload
    headers = {"Content-Type": "application/json"}
    if options.api_key is not None:
        headers["Authorization"] = f"Bearer {options.api_key.get_secret_value()}"
    url = options.api_base.rstrip("/") + "/chat/completions"
    try:
        status, response_headers, data = post(
            url, json.dumps(body).encode(), headers, options.timeout_seconds
        )
    except TimeoutError:
        raise TransientModelError(timeout_message(options.timeout_seconds)) from None
    except (OSError, http.client.HTTPException) as exc:
        raise TransientModelError(f"connection error: {type(exc).__name__}: {exc}") from None
    if status >= 400:
        secret = None if options.api_key is None else options.api_key.get_secret_value()
        raise error_for(status, error_text(data, secret), response_headers, mode)
    return _answer(status, data, options.model)


def error_text(data: bytes, secret: str | None = None) -> str:
    """The server's error message on one line: ``error.message`` of a JSON body, else the
    body (llama-cpp-python's spans lines: a validation error, then its own source line),
    without ``secret`` (the API key sent)."""
    text = data.decode("utf-8", "replace")
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than Python parses
        return server_text(text, secret)
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict):
        parts = [str(error.get(key)) for key in ("message", "type", "code") if error.get(key)]
        return server_text(" ".join(parts), secret)
    if isinstance(error, str):
        return server_text(error, secret)
    return server_text(text, secret)


def error_for(status: int, text: str, headers: Mapping[str, str], mode: str = "none") -> ModelError:
    """The harvest error for an HTTP error answer (see the module docstring); ``mode`` is the
    response format sent (``none``: none, as to an embeddings server)."""
    message = f"HTTP {status}: {text}"
    lowered = text.lower()
    if status == 400 and any(words in lowered for words in CONTEXT_WORDS):
        return ContextWindowExceeded(message)
    if mode != "none" and refuses_format(status, text):
        return ResponseFormatRejected(
            f"the server refused response_format {mode}: {message}", format=mode
        )
    if status in (408, 409, 429) or status >= 500:
        lowered_headers = {str(k).lower(): str(v) for k, v in headers.items()}
        return TransientModelError(message, retry_after=retry_after_from(lowered_headers))
    return PermanentModelError(message)


def _answer(status: int, body: bytes, default_model: str) -> LLMAnswer:
    """The answer's text, usage and finish reason; an unreadable body is transient (a proxy's
    error page, a server restarting)."""
    try:
        data = json.loads(body)
        choice = data["choices"][0]
        message = choice.get("message") or {}
        usage = data.get("usage")
        usage = usage if isinstance(usage, dict) else {}  # read as LLMAnswer reads counts
        return LLMAnswer(
            text=content_text(message.get("content")),
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            model=str(data.get("model") or default_model),
            finish_reason=str(choice.get("finish_reason") or ""),
        )
    # RecursionError: a body nested deeper than Python's parser recurses.
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError):
        raise TransientModelError(
            f"the model server's answer is not a chat completion (HTTP {status}, {len(body)} bytes)"
        ) from None
