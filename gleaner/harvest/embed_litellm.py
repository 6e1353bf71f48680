"""Embeddings through ``litellm.embedding``: every model the lean client does not take
(hosted ones: ``text-embedding-3-small``, ``cohere/...``, ``gemini/...``, or any provider with
an ``api_base``).

litellm is imported on first use and offline (``LITELLM_LOCAL_MODEL_COST_MAP``: its price
table is the bundled one, nothing is fetched); its own retries are off, ``harvest.retry`` is
the one retry layer, and its exceptions map onto harvest's as for chat
(:func:`~harvest.litellm_client.map_litellm_error`). The cost is litellm's price for the
tokens the provider counted, None for a model its table does not know.
"""

from __future__ import annotations

from typing import Any

from gleaner.harvest.embed_batch import BatchEmbedder, RawEmbeddings, ordered, token_count
from gleaner.harvest.errors import ContextWindowExceeded, ModelError, PermanentModelError
from gleaner.harvest.litellm_client import load_litellm, map_litellm_error, stop_signal
from gleaner.harvest.openai_http import CONTEXT_WORDS


class LiteLLMEmbedder(BatchEmbedder):
    """Embeddings of ``options.model`` through litellm."""

    def request(self, texts: list[str]) -> RawEmbeddings:
        """One ``litellm.embedding`` call, with a timeout and no retry of its own."""
        litellm = load_litellm()
        options = self.options
        kwargs: dict[str, Any] = {
            "model": options.model,
            "input": texts,
            "timeout": options.timeout_seconds,
            # Both off: litellm's wrapper retries and the openai client's; harvest.retry is
            # the one retry layer.
            "num_retries": 0,
            "max_retries": 0,
        }
        if options.api_base:
            kwargs["api_base"] = options.api_base
        if options.secret is not None:
            kwargs["api_key"] = options.secret
        try:
            response = litellm.embedding(**kwargs)
        except Exception as exc:  # everything litellm raises is classified, nothing escapes raw
            stop = stop_signal(exc)
            if stop is not None:
                raise stop from None  # the task is told to stop: no retry, no model error
            raise _embedding_error(exc, options.secret) from exc
        usage = getattr(response, "usage", None)
        return RawEmbeddings(
            vectors=ordered(list(getattr(response, "data", None) or []), options.model),
            prompt_tokens=token_count(getattr(usage, "prompt_tokens", None)),
            cost_usd=_cost(litellm, response),
        )


def _embedding_error(exc: Exception, secret: str | None) -> ModelError:
    """litellm's ``exc`` as a harvest error; a refusal of an input too long is
    ContextWindowExceeded, as the lean client says it (litellm knows only OpenAI's words
    for it, not llama.cpp's or Ollama's)."""
    error = map_litellm_error(exc, secret=secret)
    lowered = str(error).lower()
    if type(error) is PermanentModelError and any(w in lowered for w in CONTEXT_WORDS):
        return ContextWindowExceeded(str(error))
    return error


def _cost(litellm: Any, response: Any) -> float | None:
    """USD from litellm's bundled price table; None when the model is not in it."""
    try:
        return float(litellm.completion_cost(completion_response=response))
    except Exception:  # noqa: BLE001 - an unknown model raises assorted errors: no price known
        return None
