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

One ``httpx.Client`` per process (connections kept alive), made on first use, so a forked
worker child never shares its parent's sockets. A stop signal raised inside the call (a
soft time limit) goes through untouched: httpx wraps only its own errors.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from typing import Any

import httpx

from harvest.errors import (
    ContextWindowExceeded,
    ModelError,
    PermanentModelError,
    ResponseFormatRejected,
    TransientModelError,
)
from harvest.model import (
    FORMAT_WORDS,
    LLMAnswer,
    Messages,
    ModelOptions,
    format_payload,
    retry_after_from,
)

# What servers say when the prompt does not fit (OpenAI's code, llama.cpp, vLLM, Ollama).
_CONTEXT_WORDS = (
    "context_length_exceeded",
    "context length",
    "maximum context",
    "context window",
    "exceeds the available context",
    "too many tokens",
)
# The error text kept in a message (a server may echo the whole request back).
MAX_ERROR_CHARS = 500

_clients: dict[int, httpx.Client] = {}
_clients_lock = threading.Lock()


def _client() -> httpx.Client:
    """This process's client (a forked child makes its own: sockets are not shared)."""
    pid = os.getpid()
    with _clients_lock:
        client = _clients.get(pid)
        if client is None:
            # The timeout is set per request; redirects are not followed (an API does not
            # redirect a POST), and the environment's proxies are honoured as httpx does.
            client = _clients[pid] = httpx.Client(follow_redirects=False)
        return client


def served_model(model: str) -> str:
    """The model name the server knows: ``openai/<name>`` -> ``<name>``."""
    return model.split("/", 1)[1] if model.startswith("openai/") else model


def openai_call(messages: Messages, *, options: ModelOptions) -> LLMAnswer:
    """One chat completion from the OpenAI-compatible server at ``options.api_base``."""
    from harvest.model import known_format  # the format ``auto`` learned in this process

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
        response = _client().post(
            url, content=json.dumps(body), headers=headers, timeout=options.timeout_seconds
        )
    except httpx.TimeoutException:
        raise TransientModelError(
            f"Timeout: the model server did not answer within {options.timeout_seconds:g} s"
        ) from None
    except httpx.TransportError as exc:
        raise TransientModelError(f"connection error: {type(exc).__name__}: {exc}") from None
    if response.status_code >= 400:
        raise _error(response.status_code, _error_text(response), response.headers, mode)
    return _answer(response, options.model)


def _error_text(response: httpx.Response) -> str:
    """The server's error message: ``error.message`` of a JSON body, else the body."""
    try:
        data = response.json()
    except ValueError:
        return response.text[:MAX_ERROR_CHARS]
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        parts = [str(error.get(key)) for key in ("message", "type", "code") if error.get(key)]
        return " ".join(parts)[:MAX_ERROR_CHARS]
    if isinstance(error, str):
        return error[:MAX_ERROR_CHARS]
    return response.text[:MAX_ERROR_CHARS]


def _error(status: int, text: str, headers: Mapping[str, str], mode: str) -> ModelError:
    """The harvest error for an HTTP error answer (see the module docstring)."""
    message = f"HTTP {status}: {text}"
    lowered = text.lower()
    if status == 400 and any(words in lowered for words in _CONTEXT_WORDS):
        return ContextWindowExceeded(message)
    if (
        mode != "none"
        and (status in (400, 422) or status >= 500)
        and FORMAT_WORDS.search(text) is not None
    ):
        return ResponseFormatRejected(
            f"the server refused response_format {mode}: {message}", format=mode
        )
    if status in (408, 409, 429) or status >= 500:
        lowered_headers = {str(k).lower(): str(v) for k, v in headers.items()}
        return TransientModelError(message, retry_after=retry_after_from(lowered_headers))
    return PermanentModelError(message)


def _answer(response: httpx.Response, default_model: str) -> LLMAnswer:
    """The answer's text, usage and finish reason; an unreadable body is transient (a proxy's
    error page, a server restarting)."""
    try:
        data = response.json()
        choice = data["choices"][0]
        message = choice.get("message") or {}
        usage = data.get("usage") or {}
        return LLMAnswer(
            text=str(message.get("content") or ""),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            model=str(data.get("model") or default_model),
            finish_reason=str(choice.get("finish_reason") or ""),
        )
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise TransientModelError(
            f"the model server's answer is not a chat completion (HTTP {response.status_code}, "
            f"{len(response.content)} bytes)"
        ) from None
