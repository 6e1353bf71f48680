"""A lean client for OpenAI-compatible ``/v1/embeddings`` servers: one POST per request.

Chosen for an ``openai/<name>`` model with ``GLEANER_EMBED_API_BASE`` (Ollama, vLLM,
llama.cpp, LM Studio, any compatible provider), as ``harvest.openai_http`` is for chat: the
same kept-alive connection per thread (:func:`~harvest.openai_http.post`), a timeout on every
wait of the socket, and the same error classes — 429, 408, 409, 5xx, timeouts and connection
errors transient (``Retry-After`` and ``retry-after-ms`` honoured), a 400 saying the input is
too long :class:`~harvest.errors.ContextWindowExceeded`, every other 4xx permanent.

It asks for ``encoding_format: float`` and also reads base64 vectors (a server that answers
so anyway). A 200 whose body is no embeddings answer at all (a proxy's page, a server
restarting) is transient; an answer with the wrong vectors is checked by
:class:`~harvest.embed_batch.BatchEmbedder` (``EmbeddingRejected``). The cost is None: what a
model behind a custom base URL costs is not in litellm's table.
"""

from __future__ import annotations

import http.client
import json
from typing import Any

from gleaner.harvest.embed_batch import BatchEmbedder, RawEmbeddings, ordered, token_count
from gleaner.harvest.errors import PermanentModelError, TransientModelError
from gleaner.harvest.openai_http import error_for, error_text, post, served_model


class OpenAIEmbedder(BatchEmbedder):
    """Embeddings from the OpenAI-compatible server at ``options.api_base``."""

    def request(self, texts: list[str]) -> RawEmbeddings:
        """One POST to ``{api_base}/embeddings``."""
        options = self.options
        if not options.api_base:
            raise PermanentModelError("the lean embeddings client needs GLEANER_EMBED_API_BASE")
        body = {"model": served_model(options.model), "input": texts, "encoding_format": "float"}
        headers = {"Content-Type": "application/json"}
        if options.secret is not None:
            headers["Authorization"] = f"Bearer {options.secret}"
        url = options.api_base.rstrip("/") + "/embeddings"
        try:
            status, response_headers, data = post(
                url, json.dumps(body).encode(), headers, options.timeout_seconds
            )
        except TimeoutError:
            raise TransientModelError(
                "Timeout: the embeddings server did not answer within "
                f"{options.timeout_seconds:g} s"
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            raise TransientModelError(f"connection error: {type(exc).__name__}: {exc}") from None
        if status >= 400:
            raise error_for(status, error_text(data, options.secret), response_headers)
        return _read(status, data, options.model)


def _read(status: int, data: bytes, model: str) -> RawEmbeddings:
    try:
        parsed: Any = json.loads(data)
        items = parsed["data"]
    # RecursionError: a body nested deeper than Python's parser recurses.
    except (ValueError, KeyError, TypeError, IndexError, RecursionError):
        items = None
    if not isinstance(items, list):
        raise TransientModelError(
            f"the server's answer is not an embeddings list (HTTP {status}, {len(data)} bytes)"
        )
    usage = parsed.get("usage")
    tokens = token_count(usage.get("prompt_tokens")) if isinstance(usage, dict) else None
    return RawEmbeddings(vectors=ordered(items, model), prompt_tokens=tokens, cost_usd=None)
