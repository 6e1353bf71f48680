"""Embeddings for semantic recall: texts in, one L2-normalised vector per text out.

``GLEANER_EMBED_MODEL`` picks the client (:func:`embedder_for`); unset, there is none and
recall stays lexical:

- ``local/all-minilm-l6-v2``: a CPU embedder in this process (``harvest.embed_local``), from
  the optional ``local-embed`` extra; no server, no key, no download;
- ``openai/<name>`` with ``GLEANER_EMBED_API_BASE``: the lean client for any OpenAI-compatible
  ``/v1/embeddings`` server (``harvest.embed_http``: Ollama, vLLM, llama.cpp, LM Studio);
- any other model: ``litellm.embedding`` (``harvest.embed_litellm``).

Every client keeps the contract of :class:`BatchEmbedder`: the texts go out in requests of at
most ``GLEANER_EMBED_BATCH_SIZE``; each request alone is retried on transient errors, in
``harvest.retry`` (the one retry layer); each answer is checked before any of it is used.
What :meth:`~Embedder.embed` raises, and what the caller does about it::

    TransientModelError    429, 5xx, timeout, connection, attempts used up: try again later
    PermanentModelError    auth, bad request, a missing or damaged local model: fix the setup
    ContextWindowExceeded  a text is longer than the server takes: send it shorter
    EmbeddingRejected      the answer is malformed (vector count, dimensions, NaN): no retry

Importing this module imports neither litellm nor onnxruntime.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gleaner.config.embed import EmbedSettings
from gleaner.harvest.embed_batch import (
    BatchEmbedder,
    Embedded,
    EmbedOptions,
    RawEmbeddings,
    estimate_tokens,
    ordered,
    token_count,
)
from gleaner.store.settings import LOCAL_EMBED_PREFIX

__all__ = [
    "BatchEmbedder",
    "EmbedOptions",
    "Embedded",
    "Embedder",
    "RawEmbeddings",
    "embedder_for",
    "estimate_tokens",
    "ordered",
    "token_count",
]


class Embedder(Protocol):
    """Something that embeds texts (what :func:`embedder_for` returns)."""

    model: str

    def embed(self, texts: Sequence[str]) -> Embedded:
        """One vector per text; raises the model errors of the module docstring."""
        ...


# A search waits for its query's vector at most this long, and makes one attempt: a slow or
# failing embedding server costs a search its semantic half, never its answer.
QUERY_TIMEOUT_SECONDS = 5.0


def embedder_for(settings: EmbedSettings, *, queries: bool = False) -> Embedder | None:
    """The embedder ``GLEANER_EMBED_MODEL`` names; None when it is unset (recall stays
    lexical). Nothing is loaded or called here: the local model loads on its first batch.
    ``queries``: the one a search embeds its query with (one attempt, at most
    ``QUERY_TIMEOUT_SECONDS``).

    Raises ConfigError naming the variable for a bad setting, and for a local model whose
    extra is not installed.
    """
    if not settings.embed_model:
        return None
    options = EmbedOptions.from_settings(settings)
    if queries:
        options = options.model_copy(
            update={
                "max_attempts": 1,
                "timeout_seconds": min(options.timeout_seconds, QUERY_TIMEOUT_SECONDS),
            }
        )
    if options.model.lower().startswith(LOCAL_EMBED_PREFIX):
        from gleaner.harvest.embed_local import LocalEmbedder

        return LocalEmbedder(options)
    if options.model.startswith("openai/") and options.api_base:
        from gleaner.harvest.embed_http import OpenAIEmbedder

        return OpenAIEmbedder(options)
    from gleaner.harvest.embed_litellm import LiteLLMEmbedder

    return LiteLLMEmbedder(options)
