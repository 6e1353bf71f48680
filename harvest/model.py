"""The harvest model: one litellm call, one retry layer, answer parsing, chunking and merging.

litellm is imported lazily (inside the functions that call it) because importing it takes
seconds, and most imports of ``harvest`` never talk to a model. litellm's own retries are
switched off: tenacity in :func:`call_with_retries` is the only retry layer.
"""

from __future__ import annotations

import email.utils
import functools
import hashlib
import importlib
import importlib.util
import itertools
import json
import logging
import math
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt
from tenacity.stop import stop_base
from tenacity.wait import wait_base, wait_random_exponential

from harvest.candidate import NOTE_TYPES, NoteCandidate
from harvest.errors import (
    ContextWindowExceeded,
    ModelError,
    PermanentModelError,
    ResponseFormatRejected,
    TransientModelError,
    TruncatedAnswer,
    UnparseableAnswer,
)
from harvest.prompt import (
    build_messages,
    is_placeholder,
    reask_messages,
    render_message,
    response_schema,
)
from harvest.transcript import (
    DEFAULT_MAX_TRANSCRIPT_BYTES,
    DEFAULT_MAX_TRANSCRIPT_MESSAGES,
    Limits,
    Transcript,
    check_size,
    too_large,
)

if TYPE_CHECKING:
    import tiktoken

    from store.settings import Settings

log = logging.getLogger(__name__)

Messages = list[dict[str, str]]

# Halving a chunk after a context-window error stops here: below this the model is too small
# for the prompt itself, and smaller pieces would only multiply failing calls.
MIN_CHUNK_TOKENS = 200
MAX_HALVINGS = 4

# Response formats, strongest first: ``auto`` falls back along this order when the server
# refuses one. ``json_object_schema`` is ``{"type": "json_object", "schema": ...}``, the form
# llama-cpp-python's server takes (it answers HTTP 500 to ``json_schema``).
ResponseFormat = Literal["json_schema", "json_object_schema", "json_object", "none"]
FORMATS: tuple[ResponseFormat, ...] = ("json_schema", "json_object_schema", "json_object", "none")


# --- options -----------------------------------------------------------------------------


class ModelOptions(BaseModel):
    """Everything one harvest call needs to know; built from the settings by :meth:`from_settings`.

    ``max_retry_seconds`` bounds the retry window: no new attempt starts once it would begin
    later than that after the first one, so a call returns within about
    ``max_retry_seconds + timeout_seconds``. ``context_tokens`` is the transcript budget of
    one call (cl100k tokens); longer transcripts are chunked, into at most ``max_calls``
    requests (a transcript needing more is refused, ``too_large``, before the first call).
    ``max_transcript_bytes`` and ``max_transcript_messages`` are checked before any of it is
    tokenized. ``response_format`` is ``auto`` (negotiated with the server, see
    :func:`call_with_fallback`) or one of FORMATS, sent as set and never fallen back from.
    """

    model_config = ConfigDict(frozen=True)

    model: str = Field(min_length=1, description="litellm model string")
    llm: str = Field(default="auto", description="'auto', 'litellm', 'openai' or 'module:function'")
    api_base: str | None = None
    api_key: SecretStr | None = None
    max_facts: int = Field(default=5, gt=0, le=50)
    types: tuple[str, ...] = Field(default=NOTE_TYPES, min_length=1)
    timeout_seconds: float = Field(default=300.0, gt=0)
    max_attempts: int = Field(default=4, ge=1, le=20)
    max_retry_seconds: float = Field(default=30.0, ge=0)
    backoff_seconds: float = Field(default=1.0, gt=0, description="first backoff window")
    backoff_max_seconds: float = Field(default=10.0, gt=0, description="largest backoff window")
    context_tokens: int = Field(default=6_000, ge=MIN_CHUNK_TOKENS)
    max_calls: int = Field(default=20, ge=1, description="most requests of one transcript")
    max_transcript_bytes: int = Field(default=DEFAULT_MAX_TRANSCRIPT_BYTES, gt=0)
    max_transcript_messages: int = Field(default=DEFAULT_MAX_TRANSCRIPT_MESSAGES, gt=0)
    max_answer_tokens: int = Field(default=2_048, gt=0)
    temperature: float = Field(default=0.0, ge=0, le=2)
    response_format: Literal["auto", ResponseFormat] = "auto"

    @classmethod
    def from_settings(cls, settings: Settings) -> ModelOptions:
        """Options from the Gleaner settings; keys the settings lack keep their defaults.

        Raises ConfigError (naming the ``GLEANER_*`` variable) when no model is configured
        or a value is out of range.
        """
        from store.errors import ConfigError  # lazy: store's package import is not free

        if not settings.harvest_model:
            raise ConfigError(
                "GLEANER_HARVEST_MODEL is not set: no harvest model to call", reason="bad_config"
            )
        values: dict[str, Any] = {
            "model": settings.harvest_model,
            "llm": settings.harvest_llm,
            "api_base": settings.harvest_api_base,
            "api_key": settings.harvest_api_key,
            "max_facts": settings.harvest_max_facts,
            "types": tuple(settings.observation_types),
        }
        # Read by name, so a Settings without these keys still works (defaults apply).
        for field, setting in _OPTIONAL_SETTINGS.items():
            value = getattr(settings, setting, None)
            if value is not None:
                values[field] = value
        try:
            return cls(**values)
        except ValidationError as exc:
            problems = []
            for error in exc.errors():
                field = str(error["loc"][0]) if error["loc"] else "?"
                name = _SETTING_NAMES.get(field, f"harvest_{field}").upper()
                problems.append(f"GLEANER_{name}: {error['msg']} (got {error.get('input')!r})")
            raise ConfigError("; ".join(problems), reason="bad_config") from None


_OPTIONAL_SETTINGS = {
    "timeout_seconds": "harvest_timeout_seconds",
    "max_attempts": "harvest_max_attempts",
    "max_retry_seconds": "harvest_max_retry_seconds",
    "context_tokens": "harvest_context_tokens",
    "response_format": "harvest_response_format",
    "max_answer_tokens": "harvest_max_answer_tokens",
    "temperature": "harvest_temperature",
    "max_calls": "harvest_max_calls",
    "max_transcript_bytes": "max_transcript_bytes",
    "max_transcript_messages": "max_transcript_messages",
}
_SETTING_NAMES = {
    "model": "harvest_model",
    "llm": "harvest_llm",
    "api_base": "harvest_api_base",
    "api_key": "harvest_api_key",
    "max_facts": "harvest_max_facts",
    "types": "observation_types",
    **_OPTIONAL_SETTINGS,
}


# --- the callable that talks to the model ------------------------------------------------


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

    It must not retry: it raises :class:`TransientModelError` (with ``retry_after`` when
    known), :class:`PermanentModelError` or :class:`ContextWindowExceeded`, and
    :func:`call_with_retries` decides. It should honour ``options.timeout_seconds``,
    ``max_answer_tokens`` and ``temperature``. ``options.response_format`` is ``auto`` or a
    format to send; a server that refuses a format sent raises
    :class:`ResponseFormatRejected` naming it, and :func:`call_with_fallback` decides.
    """

    def __call__(self, messages: Messages, *, options: ModelOptions) -> LLMAnswer: ...


def _litellm() -> Any:
    """Import litellm on first use, offline-safe and quiet."""
    # Without this, importing litellm fetches the model cost map from the network.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    # The "Give Feedback / Get Help" banner it prints on every exception is noise in a worker.
    litellm.suppress_debug_info = True
    # Under a worker at INFO, litellm logged two lines per call (to stderr, which Celery
    # turns into WARNING records): measurable per-call cost and log noise.
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return litellm


def warm_up(model: str) -> None:
    """Pay the one-off costs of talking to ``model`` now: importing litellm (seconds), its
    structured-output lookup and the tokenizer file.

    A worker calls this in its parent process before forking, so every pool child (and every
    child that replaces one after ``worker_max_tasks_per_child``) inherits them instead of
    spending its first seconds importing.
    """
    _litellm()
    _format_mode(model)
    _encoding()


def litellm_call(messages: Messages, *, options: ModelOptions) -> LLMAnswer:
    """One chat completion through litellm, with a timeout and without litellm's retries.

    Asks for the response format of ``options.response_format``; ``auto`` starts where
    :func:`auto_format` says. Maps litellm's exceptions onto harvest's; a refusal of the
    format sent is :class:`ResponseFormatRejected`.
    """
    litellm = _litellm()
    kwargs: dict[str, Any] = {
        "model": options.model,
        "messages": messages,
        "timeout": options.timeout_seconds,
        # Both off: the openai client's retries (max_retries) and litellm's wrapper retries
        # (num_retries); tenacity in call_with_retries is the one retry layer.
        "num_retries": 0,
        "max_retries": 0,
        "temperature": options.temperature,
        "max_tokens": options.max_answer_tokens,
        # Models that refuse a parameter (temperature on reasoning models) get it dropped
        # instead of failing the call.
        "drop_params": True,
    }
    if options.api_base:
        kwargs["api_base"] = options.api_base
    if options.api_key is not None:
        kwargs["api_key"] = options.api_key.get_secret_value()
    mode = options.response_format
    if mode == "auto":
        mode = auto_format(options.model, options.api_base)
    response_format = format_payload(mode, options.types, options.max_facts)
    if response_format is not None:
        kwargs["response_format"] = response_format
    try:
        response = litellm.completion(**kwargs)
    except Exception as exc:  # everything litellm raises is classified, nothing escapes raw
        stop = stop_signal(exc)
        if stop is not None:
            raise stop from None  # the task is told to stop: no retry, no model error
        error = map_litellm_error(exc)
        if mode != "none" and rejects_format(exc, error):
            raise ResponseFormatRejected(
                f"the server refused response_format {mode}: {error}", format=mode
            ) from exc
        raise error from exc
    return _answer_from(response, options.model)


# Exceptions that tell running code to stop (Celery's soft time limit, raised inside
# whatever call is running), by name: harvest never imports Celery.
STOP_SIGNALS = frozenset({"SoftTimeLimitExceeded"})


def stop_signal(exc: BaseException) -> BaseException | None:
    """The stop signal ``exc`` is or wraps, or None.

    litellm wraps whatever its HTTP call raised, a soft time limit included, in its own
    InternalServerError, which would be retried as transient until the hard kill.
    """
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if type(current).__name__ in STOP_SIGNALS:
            return current
        original = getattr(current, "original_exception", None)
        pending += [current.__cause__, current.__context__]
        if isinstance(original, BaseException):
            pending.append(original)
    return None


def _answer_from(response: Any, default_model: str) -> LLMAnswer:
    try:
        choice = response.choices[0]
    except (AttributeError, IndexError, TypeError):
        choice = None
    text = getattr(getattr(choice, "message", None), "content", None) or ""
    # An empty answer is unparseable and is re-asked like one.
    finish_reason = getattr(choice, "finish_reason", None) or ""
    usage = getattr(response, "usage", None)
    return LLMAnswer(
        text=str(text),
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        model=str(getattr(response, "model", None) or default_model),
        finish_reason=str(finish_reason),
    )


# --- response formats --------------------------------------------------------------------

FormatMode = Literal["json_schema", "json_object", "none"]

# A refusal names what it refuses: OpenAI ("'response_format' of type 'json_schema' is not
# supported"), LM Studio ("'response_format.type' must be 'json_schema' or 'text'"), llama.cpp
# ("JSON schema conversion failed") and llama-cpp-python, whose HTTP 500 carries the request's
# validation error ("response_format" ... "json_schema"). An error that names none of these
# (a bad message, an unknown model) is not about the format and is not fallen back from.
FORMAT_WORDS = re.compile(r"response.?format|json.?schema|json.?object|schema|grammar", re.I)

# What ``auto`` learned in this process: (model, api_base) -> the format the server accepted
# after refusing a stronger one. Only an accepted format is remembered, so a request refused
# for another reason never weakens later calls.
_accepted: dict[tuple[str, str | None], ResponseFormat] = {}
_accepted_lock = threading.Lock()


def auto_format(model: str, api_base: str | None) -> ResponseFormat:
    """Where ``auto`` starts for ``model`` at ``api_base``: what this process saw the server
    accept, else what litellm says the model supports.

    litellm knows hosted models, not what runs behind a custom ``api_base``: there it calls
    an unknown ``openai/...`` model JSON-mode capable because the protocol is, so ``auto``
    starts at ``json_schema`` and lets the server's answer decide (one refused request per
    process when it cannot).
    """
    with _accepted_lock:
        known = _accepted.get((model, api_base))
    if known is not None:
        return known
    mode = _format_mode(model)
    if api_base and mode == "json_object":
        return "json_schema"
    return mode


def known_format(model: str, api_base: str | None) -> ResponseFormat | None:
    """The format this process saw the server at ``api_base`` accept for ``model``, if any."""
    with _accepted_lock:
        return _accepted.get((model, api_base))


def remember_format(model: str, api_base: str | None, mode: ResponseFormat) -> None:
    """Record that the server at ``api_base`` accepted ``mode`` for ``model``."""
    with _accepted_lock:
        _accepted[(model, api_base)] = mode


def forget_formats() -> None:
    """Forget every format ``auto`` learned (tests; a server that was upgraded)."""
    with _accepted_lock:
        _accepted.clear()


def weaker_format(mode: ResponseFormat) -> ResponseFormat | None:
    """The format after ``mode`` in FORMATS, or None after ``none``."""
    index = FORMATS.index(mode)
    return FORMATS[index + 1] if index + 1 < len(FORMATS) else None


def rejects_format(exc: BaseException, error: ModelError) -> bool:
    """Whether a failed request with a response format says the format is what was wrong:
    a 400, 422 or 5xx whose message names the response format, the schema or the grammar.

    Context-window and content-policy errors never are, nor 401, 403, 404, 408, 409, 429:
    those are about something else, and keep their own handling.
    """
    if isinstance(error, ContextWindowExceeded):
        return False
    errors = _litellm().exceptions
    if isinstance(exc, errors.ContentPolicyViolationError):
        return False
    status = getattr(exc, "status_code", None)
    bad_request = isinstance(exc, errors.BadRequestError | errors.UnprocessableEntityError)
    server_side = isinstance(status, int) and status >= 500
    if not (bad_request or status in (400, 422) or server_side):
        return False
    return FORMAT_WORDS.search(str(exc)) is not None


@functools.lru_cache(maxsize=64)
def _format_mode(model: str) -> FormatMode:
    litellm = _litellm()
    try:
        if litellm.supports_response_schema(model=model):
            return "json_schema"
        supported = litellm.get_supported_openai_params(model=model) or []
    except Exception:  # noqa: BLE001 - an unknown model only loses structured output
        return "none"
    return "json_object" if "response_format" in supported else "none"


def _response_format(model: str, types: tuple[str, ...], max_facts: int) -> dict[str, Any] | None:
    """The response_format litellm's knowledge of ``model`` alone gives (no server asked)."""
    return format_payload(_format_mode(model), types, max_facts)


def format_payload(
    mode: ResponseFormat, types: tuple[str, ...], max_facts: int
) -> dict[str, Any] | None:
    """The ``response_format`` request field of a format; None for ``none`` (not sent)."""
    if mode == "json_schema":
        return {
            "type": "json_schema",
            "json_schema": {
                "name": "harvest_notes",
                "schema": response_schema(types=types, max_facts=max_facts),
                "strict": True,
            },
        }
    if mode == "json_object_schema":
        return {
            "type": "json_object",
            "schema": response_schema(types=types, max_facts=max_facts),
        }
    if mode == "json_object":
        return {"type": "json_object"}
    return None


def map_litellm_error(exc: BaseException) -> ModelError:
    """The harvest error for an exception litellm raised.

    Order matters: ContextWindowExceededError and ContentPolicyViolationError subclass
    BadRequestError, so they are told apart before it. Anything unrecognised is permanent
    unless its status code says otherwise: retrying the unknown is how a job loops.
    """
    litellm = _litellm()
    errors = litellm.exceptions
    message = str(exc) or type(exc).__name__
    if isinstance(exc, errors.ContextWindowExceededError):
        return ContextWindowExceeded(message)
    transient = (
        errors.RateLimitError,
        errors.Timeout,
        errors.APIConnectionError,
        errors.ServiceUnavailableError,
        errors.InternalServerError,
        errors.BadGatewayError,
    )
    if isinstance(exc, transient):
        return TransientModelError(message, retry_after=retry_after_seconds(exc))
    permanent = (
        errors.ContentPolicyViolationError,
        errors.AuthenticationError,
        errors.PermissionDeniedError,
        errors.NotFoundError,
        errors.BadRequestError,
        errors.UnprocessableEntityError,
    )
    if isinstance(exc, permanent):
        return PermanentModelError(message)
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and (status >= 500 or status in (408, 409, 429)):
        return TransientModelError(message, retry_after=retry_after_seconds(exc))
    return PermanentModelError(message)


def retry_after_seconds(exc: BaseException, *, now: float | None = None) -> float | None:
    """Seconds the server asked us to wait (``retry-after-ms`` or ``Retry-After``), or None.

    ``Retry-After`` may be seconds or an HTTP date; a negative or unreadable value is None.
    """
    return retry_after_from(_error_headers(exc), now=now)


def retry_after_from(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """``retry_after_seconds`` from response headers (their names lowercased)."""
    if "retry-after-ms" in headers:
        try:
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _error_headers(exc: BaseException) -> dict[str, str]:
    # litellm keeps the provider's headers on the error's response (and, for some providers,
    # in litellm_response_headers or headers); any of them may be absent.
    response = getattr(exc, "response", None)
    for source in (
        getattr(exc, "litellm_response_headers", None),
        getattr(response, "headers", None),
        getattr(exc, "headers", None),
    ):
        if isinstance(source, Mapping) and source:
            return {str(k).lower(): str(v) for k, v in source.items()}
    return {}


# --- the one retry layer -----------------------------------------------------------------


class _Backoff:
    """Plans each sleep once: jittered exponential backoff, at least the server's Retry-After.

    The stop and the wait must agree on the coming sleep (the stop refuses a sleep that
    would end past the retry window), so the plan is computed once per attempt and shared.
    """

    def __init__(self, options: ModelOptions) -> None:
        self._jitter = wait_random_exponential(
            multiplier=options.backoff_seconds, max=options.backoff_max_seconds
        )
        self.window = options.max_retry_seconds
        self._plans: dict[int, float] = {}

    def sleep_for(self, state: RetryCallState) -> float:
        if state.attempt_number not in self._plans:
            delay = self._jitter(state)
            outcome = state.outcome
            error = outcome.exception() if outcome is not None and outcome.failed else None
            retry_after = getattr(error, "retry_after", None)
            if isinstance(retry_after, int | float) and retry_after > 0:
                delay = max(delay, float(retry_after))
            self._plans[state.attempt_number] = min(delay, self.window)
        return self._plans[state.attempt_number]


class _Wait(wait_base):
    def __init__(self, backoff: _Backoff) -> None:
        self.backoff = backoff

    def __call__(self, retry_state: RetryCallState) -> float:
        return self.backoff.sleep_for(retry_state)


class _StopBeforeWindowEnds(stop_base):
    """Stops when the planned sleep would end past the retry window (never sleeps past it)."""

    def __init__(self, backoff: _Backoff) -> None:
        self.backoff = backoff

    def __call__(self, retry_state: RetryCallState) -> bool:
        elapsed = retry_state.seconds_since_start or 0.0
        return elapsed + self.backoff.sleep_for(retry_state) > self.backoff.window


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome is not None else None
    sleep = state.next_action.sleep if state.next_action is not None else 0.0
    log.warning(
        "harvest model call %d failed (%s); retrying in %.2fs", state.attempt_number, error, sleep
    )


def call_with_retries(
    llm: HarvestLLM,
    messages: Messages,
    options: ModelOptions,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> LLMAnswer:
    """Call ``llm`` once, retrying only TransientModelError; the last error is re-raised.

    Bounded by ``options.max_attempts`` attempts and the ``max_retry_seconds`` window;
    each sleep is jittered exponential backoff but never shorter than Retry-After.
    """
    backoff = _Backoff(options)
    retrying = Retrying(
        retry=retry_if_exception_type(TransientModelError),
        stop=stop_after_attempt(options.max_attempts) | _StopBeforeWindowEnds(backoff),
        wait=_Wait(backoff),
        sleep=sleep,
        before_sleep=_log_retry,
        reraise=True,
    )
    return retrying(llm, messages, options=options)


def call_with_fallback(
    llm: HarvestLLM,
    messages: Messages,
    options: ModelOptions,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> LLMAnswer:
    """:func:`call_with_retries`, stepping down FORMATS while the server refuses the format.

    Under ``response_format="auto"`` a :class:`ResponseFormatRejected` is not retried: the
    same messages go again with the next weaker format (json_schema -> json_object_schema ->
    json_object -> none), and the format finally accepted is remembered for ``(model,
    api_base)`` in this process, so later calls start there. At most ``len(FORMATS) - 1``
    refusals, each one request. Under an explicit format the refusal is final: a permanent
    error naming GLEANER_HARVEST_RESPONSE_FORMAT.
    """
    current, fell_back_to = options, None
    while True:
        try:
            answer = call_with_retries(llm, messages, current, sleep=sleep)
        except ResponseFormatRejected as exc:
            refused = cast(ResponseFormat, exc.format)
            weaker = weaker_format(refused) if refused in FORMATS else None
            if options.response_format != "auto" or weaker is None:
                raise ResponseFormatRejected(
                    f"{exc} (GLEANER_HARVEST_RESPONSE_FORMAT={options.response_format}); "
                    "set it to auto, or to a weaker format this server accepts "
                    f"({', '.join(FORMATS[FORMATS.index(refused) + 1 :] if weaker else ())})",
                    format=refused,
                ) from exc
            log.warning("the model server refused response_format %s; trying %s", refused, weaker)
            current, fell_back_to = options.model_copy(update={"response_format": weaker}), weaker
            continue
        if fell_back_to is not None:
            remember_format(options.model, options.api_base, fell_back_to)
        return answer


def resolve_llm(options: ModelOptions) -> HarvestLLM:
    """The callable ``harvest_llm`` names: ``auto`` (the lean OpenAI-compatible client of
    ``harvest.openai_http`` for an ``openai/...`` model with an ``api_base``, litellm for any
    other), ``litellm``, ``openai`` (the lean client), or an importable ``module:function``.

    Raises ConfigError naming GLEANER_HARVEST_LLM when it cannot be imported or called.
    """
    spec = options.llm.strip()
    lean = options.model.startswith("openai/") and bool(options.api_base)
    if spec == "openai" or (spec == "auto" and lean):
        from harvest.openai_http import openai_call

        return openai_call
    if spec in ("litellm", "auto"):
        return litellm_call
    from store.errors import ConfigError  # lazy: store's package import is not free

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(
            "GLEANER_HARVEST_LLM: expected 'auto', 'litellm', 'openai' or 'module:function' "
            f"(got {spec!r})",
            reason="bad_config",
        )
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"GLEANER_HARVEST_LLM: cannot import {spec!r}: {exc}", reason="bad_config"
        ) from exc
    if not callable(target):
        raise ConfigError(f"GLEANER_HARVEST_LLM: {spec!r} is not callable", reason="bad_config")
    return cast(HarvestLLM, target)


# --- parsing the answer ------------------------------------------------------------------


class ParsedNotes(BaseModel):
    """The valid notes of one answer and how many items were dropped as invalid."""

    model_config = ConfigDict(frozen=True)

    notes: list[NoteCandidate]
    dropped: int = 0


_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\r?\n?(.*?)```", re.DOTALL)
# Scanning prose for JSON tries each '{' or '[' in turn; an answer is small, but this
# keeps a pathological one from costing quadratic time.
_MAX_SCAN_STARTS = 200


def parse_answer(text: str, types: Sequence[str]) -> ParsedNotes:
    """The notes in a model answer: raw JSON, JSON in a ```json fence, or JSON inside prose.

    The top level must be ``{"notes": [...]}`` or a bare list; each item is validated as a
    :class:`NoteCandidate` whose type is one of ``types``, and invalid ones are dropped and
    counted, a note whose title or body is the prompt's placeholder text among them. Raises
    UnparseableAnswer when no JSON of that shape is found; its ``problem`` says why in one
    line that quotes nothing of the answer.
    """
    items = _find_items(text)
    if items is None:
        problem = _problem(text)
        raise UnparseableAnswer(
            f"the model's answer ({len(text)} characters) held no notes JSON: {problem}",
            problem=problem,
        )
    allowed = set(types)
    notes: list[NoteCandidate] = []
    dropped = 0
    for item in items:
        note = _validate_item(item, allowed)
        if note is None:
            dropped += 1
        else:
            notes.append(note)
    return ParsedNotes(notes=notes, dropped=dropped)


def _validate_item(item: object, allowed: set[str]) -> NoteCandidate | None:
    if not isinstance(item, dict):
        return None
    try:
        note = NoteCandidate.model_validate(item)
    except ValidationError:
        return None
    if note.type not in allowed or is_placeholder(note.title) or is_placeholder(note.body):
        return None
    return note


def _problem(text: str) -> str:
    """What is wrong with an answer :func:`_find_items` found nothing in, in one line."""
    stripped = text.strip()
    if not stripped:
        return "the answer was empty"
    try:
        whole = json.loads(stripped)
    except json.JSONDecodeError as exc:
        if stripped[0] not in "{[":
            return 'it is not JSON and holds no JSON object with a "notes" list'
        # The decoder's message names the position, never the text there.
        return f"it is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if isinstance(whole, dict):
        if "notes" in whole:
            return f'its "notes" is {_json_kind(whole["notes"])}, not a list'
        return 'it is a JSON object without a "notes" key'
    return f'it is {_json_kind(whole)}, not an object with a "notes" list'


def _json_kind(value: object) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return kinds.get(type(value), "a number")


def _find_items(text: str) -> list[Any] | None:
    stripped = text.strip()
    whole = _loads(stripped)
    if whole is not _NOT_JSON:
        # The whole answer is JSON: its shape decides, nothing else is looked for.
        return _items_of(whole, strict=False)
    for match in _FENCE.finditer(text):
        fenced = _loads(match.group(1).strip())
        if fenced is not _NOT_JSON:
            items = _items_of(fenced, strict=False)
            if items is not None:
                return items
    return _scan_prose(text)


def _scan_prose(text: str) -> list[Any] | None:
    # Outermost first: the first '{' or '[' from which a whole JSON value decodes and has the
    # right shape. A lone list found this way must hold objects, so a note's "topics" list
    # inside a truncated answer is not mistaken for the notes.
    decoder = json.JSONDecoder()
    starts = itertools.islice(re.finditer(r"[{\[]", text), _MAX_SCAN_STARTS)
    for start in (m.start() for m in starts):
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        items = _items_of(value, strict=True)
        if items is not None:
            return items
    return None


def _items_of(value: object, *, strict: bool) -> list[Any] | None:
    if isinstance(value, dict):
        notes = value.get("notes")
        return notes if isinstance(notes, list) else None
    if isinstance(value, list):
        if strict and (not value or not all(isinstance(v, dict) for v in value)):
            return None
        return value
    return None


_NOT_JSON = object()


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return _NOT_JSON


# --- token counting and chunking ---------------------------------------------------------

_CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


@functools.cache
def _encoding() -> tiktoken.Encoding | None:
    """cl100k_base if its file is on disk, else None (and counts fall back to an estimate).

    tiktoken downloads a missing file with no timeout, which could hang an offline worker,
    so it is only asked when the cached copy exists: the one litellm bundles, unless
    TIKTOKEN_CACHE_DIR points elsewhere.
    """
    try:
        import tiktoken
    except ImportError:
        return None
    key = hashlib.sha1(_CL100K_URL.encode(), usedforsecurity=False).hexdigest()
    cache_dir = os.environ.get("TIKTOKEN_CACHE_DIR")
    if cache_dir is None:
        bundled = _litellm_tokenizer_dir()
        if bundled is not None and (bundled / key).exists():
            # The same default litellm sets when it is imported.
            os.environ["TIKTOKEN_CACHE_DIR"] = cache_dir = str(bundled)
    if not cache_dir or not (Path(cache_dir) / key).exists():
        return None
    try:
        return tiktoken.get_encoding("cl100k_base")
    except (OSError, ValueError):
        return None


def _litellm_tokenizer_dir() -> Path | None:
    spec = importlib.util.find_spec("litellm")  # finds the package without importing it
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "litellm_core_utils" / "tokenizers"


# The tokenizer never sees more than this many characters at once: BPE over one unbroken run
# costs ~50 bytes of memory per character and more than linear time (a 64 MB "word" killed a
# worker), so text is cut into pieces first (see ``_pieces``).
PIECE_CHARS = 4_096


def _pieces(text: str) -> Iterator[str]:
    """``text`` in pieces of at most PIECE_CHARS characters, cut where it changes no token.

    A cut goes just before a space that follows a non-space character: every cl100k
    pre-token ends there (none crosses it), so the pieces' tokens are exactly the text's.
    Only a window with no such space (an unbroken run of PIECE_CHARS / 2 characters or more)
    is cut hard, which may shift a token or two at the cut.
    """
    start = 0
    while len(text) - start > PIECE_CHARS:
        window_end = start + PIECE_CHARS
        floor = start + PIECE_CHARS // 2
        cut = text.rfind(" ", floor, window_end)
        while cut > floor and text[cut - 1].isspace():
            cut = text.rfind(" ", floor, cut)
        if cut < floor or text[cut - 1].isspace():
            cut = window_end
        yield text[start:cut]
        start = cut
    yield text[start:]


def count_tokens(text: str) -> int:
    """cl100k_base tokens in ``text``, counted a bounded piece at a time (``_pieces``), so
    memory stays flat whatever the text; without the tokenizer, UTF-8 bytes / 3 (an overcount
    for English, about right for CJK — erring toward smaller chunks)."""
    encoding = _encoding()
    if encoding is None:
        return math.ceil(len(text.encode("utf-8", "surrogatepass")) / 3)
    return sum(len(encoding.encode(piece, disallowed_special=())) for piece in _pieces(text))


def _token_starts(encoding: tiktoken.Encoding, piece: str) -> list[int]:
    """Where in ``piece`` each of its tokens starts; a piece that does not round-trip (lone
    surrogates) counts each character as its UTF-8 bytes, an overcount that never overflows."""
    tokens = encoding.encode(piece, disallowed_special=())
    try:
        decoded, offsets = encoding.decode_with_offsets(tokens)
    except UnicodeDecodeError:
        decoded, offsets = "", []
    if decoded == piece:
        return list(offsets)
    starts: list[int] = []
    for index, char in enumerate(piece):
        starts += [index] * len(char.encode("utf-8", "surrogatepass"))
    return starts


def _slice_text(text: str, budget: int) -> list[tuple[str, int]]:
    """Cut one over-long block into pieces of at most ``budget`` tokens, at token bounds;
    each piece with its tokens.

    Tokenized a bounded piece at a time (``_pieces``), so a block of any length, an unbroken
    word included, is cut without holding more than one piece's tokens.
    """
    encoding = _encoding()
    cuts, sizes = [0], []
    used = 0
    if encoding is not None:
        base = 0
        for piece in _pieces(text):
            for start in _token_starts(encoding, piece):
                if used == budget:
                    cuts.append(base + start)
                    sizes.append(used)
                    used = 0
                used += 1
            base += len(piece)
    else:
        for index, char in enumerate(text):
            size = len(char.encode("utf-8", "surrogatepass"))
            if used + size > budget * 3 and index > cuts[-1]:
                cuts.append(index)
                sizes.append(math.ceil(used / 3))
                used = 0
            used += size
        used = math.ceil(used / 3)
    cuts.append(len(text))
    sizes.append(used)
    return [
        (text[a:b], size)
        for (a, b), size in zip(itertools.pairwise(cuts), sizes, strict=True)
        if a < b
    ]


def _packed(blocks: list[str], budget: int) -> Iterator[tuple[str, int]]:
    """The chunks of :func:`pack_chunks`, each with its tokens as packing counted them (each
    block once, plus one per joining newline)."""
    # A token is at least one UTF-8 byte, so text of at most ``budget`` bytes fits: the
    # usual short transcript is one chunk without being tokenized for packing.
    if sum(len(b.encode("utf-8", "surrogatepass")) + 1 for b in blocks) <= budget:
        if blocks:
            text = "\n".join(blocks)
            yield text, count_tokens(text)
        return
    current: list[str] = []
    used = 0
    for block in blocks:
        cost = count_tokens(block) + 1  # +1 for the joining newline
        if cost > budget:
            if current:
                yield "\n".join(current), used
                current, used = [], 0
            yield from _slice_text(block, budget)
            continue
        if current and used + cost > budget:
            yield "\n".join(current), used
            current, used = [], 0
        current.append(block)
        used += cost
    if current:
        yield "\n".join(current), used


def pack_chunks(blocks: Iterable[str], budget: int) -> list[str]:
    """Join blocks with newlines into chunks of at most ``budget`` tokens, in order.

    A block over the budget on its own (a long line, an unbroken word) is cut at token
    boundaries; nothing tokenizes more than PIECE_CHARS characters at once.
    """
    return [text for text, _ in _packed(list(blocks), budget)]


def chunk_sizes(blocks: Iterable[str], budget: int) -> list[int]:
    """The tokens of each chunk :func:`pack_chunks` makes of ``blocks`` (one model request
    each), tokenizing every block once: what estimates count."""
    return [tokens for _, tokens in _packed(list(blocks), budget)]


# --- extraction --------------------------------------------------------------------------


class ModelResult(BaseModel):
    """The merged notes of one transcript and what it cost.

    ``calls`` counts every attempt made (retried and unparseable ones included); the token
    counts sum the usage of every answer received.
    """

    model_config = ConfigDict(frozen=True)

    notes: list[NoteCandidate]
    dropped: int = 0
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str = ""
    chunks: int = 0


@dataclass
class Usage:
    """Model calls and tokens spent so far; filled in as calls are made, so a caller still
    knows the cost of a transcript whose harvest failed."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Meter:
    """Wraps the llm so every attempt and every answer's usage is counted (also into the
    caller's ``usage``, when given)."""

    def __init__(self, llm: HarvestLLM, options: ModelOptions, usage: Usage | None = None) -> None:
        self.llm = llm
        self.options = options
        self.calls = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.model = ""
        self.usage = usage if usage is not None else Usage()

    def _attempt(self, messages: Messages, *, options: ModelOptions) -> LLMAnswer:
        self.calls += 1
        self.usage.calls += 1  # counted before the call: a failed attempt costs too
        answer = self.llm(messages, options=options)
        self.prompt_tokens += answer.prompt_tokens
        self.completion_tokens += answer.completion_tokens
        self.usage.prompt_tokens += answer.prompt_tokens
        self.usage.completion_tokens += answer.completion_tokens
        self.model = answer.model or self.model
        return answer

    def ask(self, messages: Messages) -> LLMAnswer:
        return call_with_fallback(self._attempt, messages, self.options)


def extract(
    transcript: Transcript,
    options: ModelOptions,
    llm: HarvestLLM | None = None,
    known_keys: Sequence[tuple[str, str]] = (),
    usage: Usage | None = None,
) -> ModelResult:
    """Ask the harvest model for the notes of one (already redacted) transcript.

    ``usage``, when given, counts every call and token as it happens, failed ones included.

    The transcript is checked against ``options.max_transcript_bytes`` and
    ``max_transcript_messages`` before anything is tokenized, then rendered and cut into
    chunks of ``options.context_tokens``; each chunk is one request (retried on transient
    errors). A transcript whose chunks need more than ``options.max_calls`` requests is
    refused before the first call (TranscriptFormatError, reason ``too_large``), never cut
    short. An unparseable answer is asked again once (told what was wrong), then
    UnparseableAnswer is raised; an answer cut off at the token limit is asked again once,
    shorter, then TruncatedAnswer is raised (:func:`_ask_chunk`); a
    context-window error halves the chunks (a bounded number of times, and only while the
    requests stay within ``max_calls``). The notes of all chunks are merged: deduplicated by
    title, highest confidence first, at most ``options.max_facts``. ``known_keys`` (the
    owner's topic keys and their notes' titles) are shown with every chunk so a changed fact
    reuses its key.

    Model calls are bounded: at most ``max_calls`` requests, each asked at most twice (a
    cut-off or unparseable answer) with at most ``max_attempts`` attempts per ask. Under
    ``response_format="auto"`` a server refusing the format adds at most three quick refused
    requests per ask, and only until this process has learned what it accepts.
    """
    check_size(
        transcript.messages,
        Limits(
            transcript_bytes=options.max_transcript_bytes,
            transcript_messages=options.max_transcript_messages,
        ),
    )
    meter = _Meter(llm or resolve_llm(options), options, usage)
    blocks = [render_message(m) for m in transcript.messages if m.content.strip()]
    budget = options.context_tokens
    pending = deque(pack_chunks(blocks, budget))
    _check_calls(len(pending), budget, options.max_calls)
    collected: list[NoteCandidate] = []
    dropped = done = halvings = requests = 0
    while pending:
        chunk = pending.popleft()
        part = (done + 1, done + 1 + len(pending))
        requests += 1
        try:
            parsed = _ask_chunk(meter, chunk, part, options, known_keys)
        except ContextWindowExceeded:
            halvings += 1
            budget = min(budget, count_tokens(chunk)) // 2
            if halvings > MAX_HALVINGS or budget < MIN_CHUNK_TOKENS:
                raise
            log.warning("context window exceeded; re-chunking at %d tokens", budget)
            # The rest is re-cut too: chunks of the old size would overflow the same way.
            lines = [line for piece in (chunk, *pending) for line in piece.split("\n")]
            pending = deque(pack_chunks(lines, budget))
            _check_calls(requests + len(pending), budget, options.max_calls)
            continue
        done += 1
        collected.extend(parsed.notes)
        dropped += parsed.dropped
    return ModelResult(
        notes=merge_notes(collected, options.max_facts),
        dropped=dropped,
        calls=meter.calls,
        prompt_tokens=meter.prompt_tokens,
        completion_tokens=meter.completion_tokens,
        model=meter.model or options.model,
        chunks=done,
    )


def _check_calls(requests: int, budget: int, max_calls: int) -> None:
    """Refuse (``too_large``) a transcript whose chunks need more than ``max_calls`` requests."""
    if requests > max_calls:
        raise too_large(
            "transcript",
            f"it needs {requests:,} model requests in chunks of {budget:,} tokens",
            max_calls,
            "GLEANER_HARVEST_MAX_CALLS",
        )


def _ask_chunk(
    meter: _Meter,
    chunk: str,
    part: tuple[int, int],
    options: ModelOptions,
    known_keys: Sequence[tuple[str, str]],
) -> ParsedNotes:
    """The notes of one chunk, in at most two requests (the bound extract documents).

    A truncated answer (``finish_reason == "length"``) is never parsed: the chunk is asked
    again for half the notes with one-sentence bodies (same ``max_answer_tokens``: a cut
    answer is most often a model running on, which more room would only make slower), and a
    second cut answer fails it (TruncatedAnswer). An unparseable answer is asked again once,
    with the model's answer and what was wrong with it; that second answer is final.
    """
    messages = build_messages(
        chunk, max_facts=options.max_facts, types=options.types, part=part, known_keys=known_keys
    )
    answer = meter.ask(messages)
    if answer.truncated:
        fewer = max(1, options.max_facts // 2)
        log.warning(
            "harvest answer cut off at %d tokens; asking for at most %d shorter notes",
            options.max_answer_tokens,
            fewer,
        )
        shorter = build_messages(
            chunk,
            max_facts=fewer,
            types=options.types,
            part=part,
            known_keys=known_keys,
            cut_off=True,
        )
        return _final(meter.ask(shorter), options, fewer)
    try:
        return parse_answer(answer.text, options.types)
    except UnparseableAnswer as exc:
        log.warning("harvest answer unparseable (%s); asking once more", exc.problem)
        problem = exc.problem
    return _final(meter.ask(reask_messages(messages, answer.text, problem)), options)


def _final(answer: LLMAnswer, options: ModelOptions, max_facts: int | None = None) -> ParsedNotes:
    """The second (last) answer for a chunk: cut off is TruncatedAnswer, unparseable is
    UnparseableAnswer, else its notes."""
    if answer.truncated:
        raise TruncatedAnswer(
            f"the model's last answer for a chunk stopped at the token limit "
            f"({options.max_answer_tokens} tokens, at most {max_facts or options.max_facts} "
            "notes asked); raise GLEANER_HARVEST_MAX_ANSWER_TOKENS or lower "
            "GLEANER_HARVEST_MAX_FACTS"
        )
    return parse_answer(answer.text, options.types)


def _title_key(title: str) -> str:
    return " ".join(re.findall(r"\w+", title.casefold()))


def merge_notes(notes: Iterable[NoteCandidate], max_facts: int) -> list[NoteCandidate]:
    """Deduplicate by normalized title (keeping the most confident), sort by confidence
    (highest first, ties in order of appearance) and keep at most ``max_facts``."""
    best: dict[str, NoteCandidate] = {}
    for note in notes:
        key = _title_key(note.title) or note.title
        if key not in best or note.confidence > best[key].confidence:
            best[key] = note
    ranked = sorted(best.values(), key=lambda n: -n.confidence)
    return ranked[:max_facts]
