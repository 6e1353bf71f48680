"""What one model call takes and gives back: the contract every client keeps (litellm's in
``harvest.litellm_client``, the lean one in ``harvest.openai_http``, a custom ``harvest_llm``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from harvest.options import ModelOptions

Messages = list[dict[str, str]]


class LLMAnswer(BaseModel):
    """What one model call returned: the text, its usage and why the model stopped.

    ``finish_reason`` is the server's (``stop``, ``length``, ...), or "" when it sent none.
    """

    model_config = ConfigDict(frozen=True)

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str = ""
    finish_reason: str = ""

    @property
    def truncated(self) -> bool:
        """The answer stopped at ``max_tokens``: whatever JSON it holds is cut off."""
        return self.finish_reason == "length"


class HarvestLLM(Protocol):
    """A callable that makes ONE model call (``harvest_llm``).

    It must not retry: it raises :class:`~harvest.errors.TransientModelError` (with
    ``retry_after`` when known), :class:`~harvest.errors.PermanentModelError` or
    :class:`~harvest.errors.ContextWindowExceeded`, and ``harvest.retry`` decides. It should
    honour ``options.timeout_seconds``, ``max_answer_tokens`` and ``temperature``.
    ``options.response_format`` is ``auto`` or a format to send; a server that refuses a
    format sent raises :class:`~harvest.errors.ResponseFormatRejected` naming it, and
    ``harvest.formats`` decides.
    """

    def __call__(self, messages: Messages, *, options: ModelOptions) -> LLMAnswer: ...
