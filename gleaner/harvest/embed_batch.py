"""The shared part of every embedding client (``harvest.embedding`` picks one): the
options it is told, one request's raw answer, and :class:`BatchEmbedder`, which batches,
retries, checks and sums. Below the clients, which subclass it, and the factory, which
imports them.

Importing this module imports neither litellm nor onnxruntime.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from gleaner.config.embed import EmbedSettings
from gleaner.harvest.errors import EmbeddingRejected
from gleaner.harvest.retry import transient_retries
from gleaner.store import ConfigError
from gleaner.store.settings import options_error, setting_field


@dataclass(frozen=True)
class Embedded:
    """What one :meth:`Embedder.embed` call returned.

    ``vectors`` holds one vector per input text, in order, each L2-normalised and of
    ``dimensions`` numbers (0 when no text was given and the model's size is not yet
    known). ``model`` is the model as configured, to be stored with each vector.
    ``prompt_tokens`` is the servers' count, or ``estimate_tokens`` of the texts when a server
    sent none (or 0 for some text, as some servers do, and litellm for a server that sent
    none); ``cost_usd`` is litellm's price where its table knows the model, 0.0 for the
    local embedder, None when unknown.
    """

    vectors: list[list[float]]
    model: str
    dimensions: int
    prompt_tokens: int
    cost_usd: float | None


# Settings each option mirrors (its GLEANER_* variable is the upper-cased name).
SETTING_OF = {
    "model": "embed_model",
    "api_base": "embed_api_base",
    "api_key": "embed_api_key",
    "timeout_seconds": "embed_timeout_seconds",
    "batch_size": "embed_batch_size",
    "max_attempts": "embed_max_attempts",
}


class EmbedOptions(BaseModel):
    """What an embedding client is told; built from the settings by :meth:`from_settings`.

    An option that is a setting takes the setting's default and bounds. The backoff and the
    retry window are tuning knobs tests shrink: no retry starts later than
    ``max_retry_seconds`` after a request's first attempt, so a Retry-After past it gives up
    at once (the error's ``retry_after`` says when to come back).
    """

    model_config = ConfigDict(frozen=True)

    model: str = Field(min_length=1)
    api_base: str | None = setting_field("embed_api_base")
    api_key: SecretStr | None = setting_field("embed_api_key")
    timeout_seconds: float = setting_field("embed_timeout_seconds")
    batch_size: int = setting_field("embed_batch_size")
    max_attempts: int = setting_field("embed_max_attempts")
    backoff_seconds: float = Field(default=0.5, gt=0, description="first backoff window")
    backoff_max_seconds: float = Field(default=8.0, gt=0, description="largest backoff window")
    max_retry_seconds: float = Field(default=30.0, ge=0, description="no retry starts later")

    @classmethod
    def from_settings(cls, settings: EmbedSettings) -> EmbedOptions:
        """Options from the settings; ConfigError naming the variable when no model is set
        or a value is out of range (settings built without validation)."""
        if not settings.embed_model:
            raise ConfigError(
                "GLEANER_EMBED_MODEL is not set: no embedding model", reason="bad_config"
            )
        values = {option: getattr(settings, name) for option, name in SETTING_OF.items()}
        try:
            return cls(**values)
        except ValidationError as exc:
            raise options_error(exc, SETTING_OF) from None

    @property
    def secret(self) -> str | None:
        """The API key in clear (to send, and to keep out of error messages)."""
        return None if self.api_key is None else self.api_key.get_secret_value()


@dataclass(frozen=True)
class RawEmbeddings:
    """One request's answer as a client read it, before any check: the vectors in input
    order (each a list of numbers, or base64 float32 as some servers send), the prompt
    tokens the server counted (None: it sent none) and the cost (None: unknown)."""

    vectors: Sequence[object]
    prompt_tokens: int | None
    cost_usd: float | None


def estimate_tokens(texts: Sequence[str]) -> int:
    """Tokens of ``texts`` when no server counted them: UTF-8 bytes / 4, rounded up."""
    return (sum(len(text.encode("utf-8", "surrogatepass")) for text in texts) + 3) // 4


class BatchEmbedder:
    """The shared part of every client: batches, retries, checks and sums.

    A subclass makes ONE request in :meth:`request` (no retry there) and raises the model
    errors of the module docstring. The first good answer fixes ``dimensions`` for the
    embedder's life; an answer of any other size is :class:`EmbeddingRejected`, as a model
    swapped behind the same name gives (its vectors cannot be compared with stored ones).
    """

    def __init__(
        self,
        options: EmbedOptions,
        *,
        dimensions: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.options = options
        self.model = options.model
        self.dimensions = dimensions
        self._sleep = sleep
        self._lock = threading.Lock()

    def request(self, texts: list[str]) -> RawEmbeddings:
        """One request for ``texts`` (at most ``batch_size`` of them)."""
        raise NotImplementedError

    def embed(self, texts: Sequence[str]) -> Embedded:
        """One vector per text, L2-normalised; requests of at most ``batch_size`` texts."""
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not one str")
        batch = self.options.batch_size
        pending = list(texts)
        vectors: list[list[float]] = []
        tokens = 0
        cost: float | None = 0.0
        retrying = transient_retries(  # each request alone: a retry resends one batch
            max_attempts=self.options.max_attempts,
            max_retry_seconds=self.options.max_retry_seconds,
            backoff_seconds=self.options.backoff_seconds,
            backoff_max_seconds=self.options.backoff_max_seconds,
            sleep=self._sleep,
            what=f"embedding request ({self.model})",
        )
        for start in range(0, len(pending), batch):
            chunk = pending[start : start + batch]
            raw = retrying(self.request, chunk)
            vectors.extend(self._checked(raw.vectors, len(chunk)))
            counted = raw.prompt_tokens
            if counted is None or (counted == 0 and any(chunk)):
                counted = estimate_tokens(chunk)  # not counted (a 0 for text is no count)
            tokens += counted
            cost = None if cost is None or raw.cost_usd is None else cost + raw.cost_usd
        return Embedded(
            vectors=vectors,
            model=self.model,
            dimensions=self.dimensions or 0,
            prompt_tokens=tokens,
            cost_usd=cost,
        )

    def _checked(self, raw: Sequence[object], expected: int) -> list[list[float]]:
        """``raw`` as vectors to keep: as many as texts, finite, not zero, all of one size
        (this embedder's), each normalised to length 1."""
        if len(raw) != expected:
            raise EmbeddingRejected(
                f"{self.model}: the server sent {len(raw)} vectors for {expected} texts"
            )
        vectors = [_normalised(_numbers(item, self.model), self.model) for item in raw]
        sizes = sorted({len(vector) for vector in vectors})
        if len(sizes) > 1:
            raise EmbeddingRejected(
                f"{self.model}: vectors of differing dimensions in one answer "
                f"({', '.join(map(str, sizes))})"
            )
        with self._lock:  # two threads sharing an embedder agree on its size
            known = self.dimensions
            size = sizes[0] if sizes else known
            if known is not None and size != known:
                raise EmbeddingRejected(
                    f"{self.model}: the answer has {size} dimensions, earlier ones {known}: "
                    "another model answers under this name, and its vectors cannot be "
                    "compared with those stored"
                )
            self.dimensions = size
        return vectors


def _numbers(item: object, model: str) -> list[float]:
    """One vector as floats: a list of numbers, or base64 of little-endian float32."""
    if isinstance(item, str):
        try:
            data = base64.b64decode(item, validate=True)
        except (binascii.Error, ValueError):
            raise EmbeddingRejected(f"{model}: a vector is neither numbers nor base64") from None
        if len(data) % 4:
            raise EmbeddingRejected(f"{model}: a base64 vector is not whole float32 numbers")
        return list(struct.unpack(f"<{len(data) // 4}f", data))
    if not isinstance(item, Sequence) or isinstance(item, bytes):
        raise EmbeddingRejected(f"{model}: a vector is {type(item).__name__}, not numbers")
    numbers = []
    for value in item:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise EmbeddingRejected(f"{model}: a vector holds {value!r}, not a number")
        numbers.append(float(value))
    return numbers


def _normalised(vector: list[float], model: str) -> list[float]:
    if not vector:
        raise EmbeddingRejected(f"{model}: the server sent an empty vector")
    if not all(math.isfinite(value) for value in vector):
        raise EmbeddingRejected(f"{model}: a vector holds NaN or infinity")
    norm = math.sqrt(math.fsum(value * value for value in vector))
    if norm == 0 or not math.isfinite(norm):
        raise EmbeddingRejected(f"{model}: a vector is all zeros or too large to normalise")
    return [value / norm for value in vector]


def ordered(items: Sequence[object], model: str) -> list[object]:
    """The ``embedding`` of each item of an OpenAI-style ``data`` list, in input order: by
    ``index`` when every item has one (a server may answer out of order), else as sent."""
    embeddings: list[object] = []
    indices: list[object] = []
    for item in items:
        if isinstance(item, dict):
            embeddings.append(item.get("embedding"))
            indices.append(item.get("index"))
        else:  # a client library's object (litellm's)
            embeddings.append(getattr(item, "embedding", None))
            indices.append(getattr(item, "index", None))
    if all(index is None for index in indices):
        return embeddings
    whole = all(isinstance(i, int) and not isinstance(i, bool) for i in indices)
    if not whole or sorted(indices) != list(range(len(items))):  # type: ignore[type-var]
        raise EmbeddingRejected(f"{model}: the answer's indices are not 0..{len(items) - 1}")
    by_index = dict(zip(indices, embeddings, strict=True))
    return [by_index[i] for i in range(len(items))]


def token_count(value: object) -> int | None:
    """A server's token count as kept: a whole number from 0 up, else None (unknown)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not value.is_integer():  # NaN and infinity too
        return None
    return int(value) if value >= 0 else None
