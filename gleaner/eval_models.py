"""``gleaner eval``'s models: one model at one endpoint, asked through harvest's clients
and its one retry layer."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gleaner.harvest.llm import HarvestLLM
    from gleaner.harvest.options import ModelOptions
    from gleaner.store import Settings


@dataclass(frozen=True)
class Endpoint:
    """A model and where it is served: a litellm model string, an API base and key."""

    model: str
    api_base: str | None = None
    api_key: str | None = None


@dataclass(frozen=True)
class Reply:
    text: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float


class ModelCaller:
    """One model at one endpoint, asked one user message at a time, at temperature 0.

    The call goes through the client ``GLEANER_HARVEST_LLM`` names (the lean
    OpenAI-compatible client for ``openai/...`` at an API base, litellm for any other) and
    harvest's one retry layer, with the harvest settings' timeout and attempts.
    """

    def __init__(self, endpoint: Endpoint, settings: Settings, *, max_tokens: int) -> None:
        from pydantic import SecretStr

        from gleaner.harvest.model import resolve_llm
        from gleaner.harvest.options import ModelOptions

        self.endpoint = endpoint
        self.options: ModelOptions = ModelOptions(
            model=endpoint.model,
            llm=settings.harvest_llm,
            api_base=endpoint.api_base,
            api_key=None if endpoint.api_key is None else SecretStr(endpoint.api_key),
            timeout_seconds=settings.harvest_timeout_seconds,
            max_attempts=settings.harvest_max_attempts,
            max_retry_seconds=settings.harvest_max_retry_seconds,
            max_answer_tokens=max_tokens,
            temperature=0.0,
            response_format="none",
        )
        self.llm: HarvestLLM = resolve_llm(self.options)

    def ask(self, prompt: str) -> Reply:
        from gleaner.harvest.retry import call_with_retries

        started = time.perf_counter()
        answer = call_with_retries(self.llm, [{"role": "user", "content": prompt}], self.options)
        return Reply(
            answer.text,
            answer.prompt_tokens,
            answer.completion_tokens,
            time.perf_counter() - started,
        )
