"""What one model call takes and gives back: the contract every client keeps (litellm's in
``harvest.litellm_client``, the lean one in ``harvest.openai_http``, a custom ``harvest_llm``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, ConfigDict, field_validator

from gleaner.store.text import MODEL_MAX_CHARS, storable

if TYPE_CHECKING:
    from gleaner.harvest.options import ModelOptions

Messages = list[dict[str, str]]
# The most tokens one call is counted at: more than any model's context holds, and small
# enough that the sums of a transcript's calls and a job's runs fit their integer columns.
MAX_TOKENS = 10_000_000


class LLMAnswer(BaseModel):
    """What one model call returned: the text, its usage and why the model stopped.

    ``finish_reason`` is the server's (``stop``, ``length``, ...), or "" when it sent none.
    The usage and the model name are the server's word, taken as far as they can be kept: a
    token count that is no whole number from 0 to ``MAX_TOKENS`` (a string, a negative or an
    absurd number) is 0, unknown, rather than a failure of an answer that is otherwise good
    (or a value the database refuses); the model name is ``storable``, cut at 255 characters.
    """

    model_config = ConfigDict(frozen=True)

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str = ""
    finish_reason: str = ""

    @field_validator("prompt_tokens", "completion_tokens", mode="before")
    @classmethod
    def _token_count(cls, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return 0
        if isinstance(value, float) and not value.is_integer():  # NaN and infinity too
            return 0
        count = int(value)
        return count if 0 <= count <= MAX_TOKENS else 0

    @field_validator("model", mode="before")
    @classmethod
    def _storable_model(cls, value: object) -> str:
        return storable(str(value or ""), MODEL_MAX_CHARS)

    @property
    def truncated(self) -> bool:
        """The answer stopped at ``max_tokens``: whatever JSON it holds is cut off."""
        return self.finish_reason == "length"


def content_text(content: object) -> str:
    """A message's text as a client reads it from the server's answer: the string, or the
    text parts of a list of content parts joined (``[{"type": "text", "text": ...}]``, as
    some servers answer)."""
    if isinstance(content, list):
        return "".join(str(text) for part in content if (text := _part_text(part)) is not None)
    return str(content or "")


def _part_text(part: object) -> object:
    # A part as JSON (a dict) or as a client library's object (litellm's).
    return part.get("text") if isinstance(part, dict) else getattr(part, "text", None)


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
