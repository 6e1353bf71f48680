"""Harvest's errors::

HarvestError
├── TranscriptFormatError   a file matches no supported transcript format
├── ModelError              the harvest model could not give an answer
│   ├── TransientModelError     rate limit, timeout, connection, 5xx: worth retrying
│   ├── PermanentModelError     auth, bad request, content policy: retrying cannot help
│   │   └── ResponseFormatRejected  the server refused the response format asked for
│   ├── ContextWindowExceeded   the prompt is too long: chunk smaller
│   ├── UnparseableAnswer       the answer held no usable JSON, even on the second try
│   ├── TruncatedAnswer         the answer was cut off at max_tokens, even on the second try
│   └── EmbeddingRejected       an embedding answer is malformed (count, dimensions, NaN)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gleaner.store.errors import ReasonedError, StorageFailure
from gleaner.store.text import storable

if TYPE_CHECKING:
    from gleaner.harvest.outcome import Counts


class HarvestError(ReasonedError):
    """Raised for any failure harvest reports on purpose; ``reason`` is machine-readable."""

    reason = "harvest_error"


class TranscriptFormatError(HarvestError):
    """Raised when a file (or one conversation in it) is not a transcript Gleaner can read."""

    reason = "bad_transcript"


class ModelError(HarvestError):
    """Raised when the harvest model fails to answer usefully. The message often quotes the
    model server (its error body): what no stored or printed text may hold (a NUL, a lone
    surrogate) is replaced, so the failed job keeps it and a terminal can show it."""

    reason = "model_error"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(storable(message, MAX_MESSAGE_CHARS), reason=reason)


# The longest message a model error keeps (a server's error body is cut shorter before).
MAX_MESSAGE_CHARS = 4000
# The most of a server's error text a model error quotes.
MAX_SERVER_TEXT = 500


def server_text(text: str, secret: str | None = None) -> str:
    """A model server's error text as a model error quotes it: on one line (a server's
    message may span lines: llama-cpp-python's validation error, litellm's with the whole
    response it could not read), cut at ``MAX_SERVER_TEXT`` characters, and without
    ``secret``, the API key sent (a server may quote the key it refused, whole)."""
    if secret:
        text = text.replace(secret, "[API key]")
    return " ".join(text.split())[:MAX_SERVER_TEXT]


class TransientModelError(ModelError):
    """Raised for failures a later attempt may not see (429, timeout, 5xx, connection)."""

    reason = "model_transient"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentModelError(ModelError):
    """Raised for failures no retry can fix (auth, bad request, content policy)."""

    reason = "model_permanent"


class ResponseFormatRejected(PermanentModelError):
    """Raised when the server refuses the ``response_format`` sent (a 4xx, or a 5xx naming the
    format); ``format`` is the one refused. Under ``auto`` the caller falls back to a weaker
    format; under an explicit setting the rejection is final."""

    reason = "response_format_rejected"

    def __init__(self, message: str, *, format: str) -> None:
        super().__init__(message)
        self.format = format


class ContextWindowExceeded(ModelError):
    """Raised when the prompt does not fit the model's context: the caller chunks smaller."""

    reason = "context_window"


class UnparseableAnswer(ModelError):
    """Raised when the model's answer held no parseable notes JSON, twice.

    ``problem`` says what was wrong in one line, without quoting the answer: it is what the
    re-ask tells the model.
    """

    reason = "unparseable_answer"

    def __init__(self, message: str, *, problem: str = "") -> None:
        super().__init__(message)
        self.problem = problem or message


class TruncatedAnswer(ModelError):
    """Raised when the answer stopped at the token limit (``finish_reason == "length"``) on
    the first request and on the smaller second one; a cut answer is never used."""

    reason = "truncated_answer"


class EmbeddingRejected(ModelError):
    """Raised when an embedding server answered, but not with what was asked: another number
    of vectors than texts, vectors of differing or changed dimensions, a value that is not a
    finite number, a zero vector. The server did not fail, so no retry is made; the caller
    records it (a model swapped behind the same name changes dimensions: re-embed)."""

    reason = "embedding_rejected"


class UnrecordedHarvest(StorageFailure):
    """Raised instead of a StorageFailure that came after the model had answered: nothing was
    written and the caller may retry, but the calls were paid for. ``spent`` is what they
    cost (no outcome carries it); ``answer``, when the model's answer was in hand, is it as
    JSON (``harvest.kept.KeptAnswer``), for the retry to write instead of calling the model
    again. The reason and message are the database failure's."""

    def __init__(
        self, failure: StorageFailure, spent: Counts, answer: dict[str, Any] | None = None
    ) -> None:
        super().__init__(failure.message, reason=failure.reason)
        self.spent = spent
        self.answer = answer
