"""The litellm client: one chat completion through litellm, its errors mapped onto harvest's.

litellm is imported on first use (:func:`load_litellm`), not with this module: importing it
takes seconds, and most imports of ``harvest`` never talk to a model. Its own retries are
off: ``harvest.retry`` is the only retry layer.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gleaner.harvest.deadline import DeadlinePassed, call_within, timeout_message
from gleaner.harvest.errors import (
    ContextWindowExceeded,
    ModelError,
    PermanentModelError,
    ResponseFormatRejected,
    TransientModelError,
    server_text,
)
from gleaner.harvest.formats import format_payload, known_format, refuses_format
from gleaner.harvest.llm import LLMAnswer, content_text
from gleaner.harvest.options import ResponseFormat
from gleaner.harvest.retry import retry_after_from

if TYPE_CHECKING:
    from gleaner.harvest.llm import Messages
    from gleaner.harvest.options import ModelOptions

# Exceptions that tell running code to stop (Celery's soft time limit, raised inside
# whatever call is running), by name: harvest never imports Celery.
STOP_SIGNALS = frozenset({"SoftTimeLimitExceeded"})


def load_litellm() -> Any:
    """litellm, imported on first use, offline-safe and quiet."""
    # Without this, importing litellm fetches the model cost map from the network.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    # The "Give Feedback / Get Help" banner it prints on every exception is noise in a worker.
    litellm.suppress_debug_info = True
    # Under a worker at INFO, litellm logged two lines per call (to stderr, which Celery
    # turns into WARNING records): per-call cost and log noise.
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Its embedding path reads `max_retries or DEFAULT_MAX_RETRIES`, so the 0 a call passes
    # became 2 hidden retries of every attempt: harvest.retry is the one retry layer.
    litellm.DEFAULT_MAX_RETRIES = 0  # type: ignore[attr-defined]  # read, not re-exported
    return litellm


def price_usd(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """What the tokens cost in USD by litellm's bundled price table (never fetched: see
    :func:`load_litellm`); None when the model is not in it."""
    litellm = load_litellm()
    try:
        prompt_cost, completion_cost = litellm.cost_per_token(
            model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
        )
    except Exception:  # noqa: BLE001 - unknown models raise assorted errors: no price known
        return None
    return float(prompt_cost) + float(completion_cost)


def litellm_call(messages: Messages, *, options: ModelOptions) -> LLMAnswer:
    """One chat completion through litellm, without litellm's retries, within one deadline
    (``options.timeout_seconds``, over the whole call: ``harvest.deadline.call_within``).

    Asks for the response format of ``options.response_format``; ``auto`` starts where
    :func:`auto_format` says. Maps litellm's exceptions onto harvest's; a refusal of the
    format sent is :class:`ResponseFormatRejected`.
    """
    litellm = load_litellm()
    kwargs: dict[str, Any] = {
        "model": options.model,
        "messages": messages,
        "timeout": options.timeout_seconds,
        # Both off: the openai client's retries (max_retries) and litellm's wrapper retries
        # (num_retries); harvest.retry is the one retry layer.
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
        # litellm's timeout bounds each read; this, the whole call (a trickled answer too).
        response = call_within(lambda: litellm.completion(**kwargs), options.timeout_seconds)
    except DeadlinePassed:
        raise TransientModelError(timeout_message(options.timeout_seconds)) from None
    except Exception as exc:  # everything litellm raises is classified, nothing escapes raw
        stop = stop_signal(exc)
        if stop is not None:
            raise stop from None  # the task is told to stop: no retry, no model error
        error = map_litellm_error(exc, secret=kwargs.get("api_key"))
        if mode != "none" and rejects_format(exc, error):
            raise ResponseFormatRejected(
                f"the server refused response_format {mode}: {error}", format=mode
            ) from exc
        raise error from exc
    return _answer_from(response, options.model)


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
    # An empty answer is unparseable and is re-asked like one.
    text = getattr(getattr(choice, "message", None), "content", None) or ""
    finish_reason = getattr(choice, "finish_reason", None) or ""
    usage = getattr(response, "usage", None)
    return LLMAnswer(
        text=content_text(text),
        prompt_tokens=getattr(usage, "prompt_tokens", None),
        completion_tokens=getattr(usage, "completion_tokens", None),
        model=str(getattr(response, "model", None) or default_model),
        finish_reason=str(finish_reason),
    )


def auto_format(model: str, api_base: str | None) -> ResponseFormat:
    """Where ``auto`` starts for ``model`` at ``api_base``: what this process saw the server
    accept, else what litellm says the model supports.

    litellm knows hosted models, not what runs behind a custom ``api_base``: there it calls
    an unknown ``openai/...`` model JSON-mode capable because the protocol is, so ``auto``
    starts at ``json_schema`` and lets the server's answer decide (one refused request per
    process when it cannot).
    """
    known = known_format(model, api_base)
    if known is not None:
        return known
    mode = litellm_format(model)
    if api_base and mode == "json_object":
        return "json_schema"
    return mode


@functools.lru_cache(maxsize=64)
def litellm_format(model: str) -> ResponseFormat:
    """The strongest format litellm's model map says ``model`` takes (``none`` for a model it
    does not know); cached, the lookup is not free."""
    litellm = load_litellm()
    try:
        if litellm.supports_response_schema(model=model):
            return "json_schema"
        supported = litellm.get_supported_openai_params(model=model) or []
    except Exception:  # noqa: BLE001 - an unknown model only loses structured output
        return "none"
    return "json_object" if "response_format" in supported else "none"


def rejects_format(exc: BaseException, error: ModelError) -> bool:
    """Whether litellm's ``exc`` for a request with a response format says the format is
    what was wrong (:func:`~harvest.formats.refuses_format`); a context-window or a
    content-policy error never is."""
    if isinstance(error, ContextWindowExceeded):
        return False
    errors = load_litellm().exceptions
    if isinstance(exc, errors.ContentPolicyViolationError):
        return False
    status = getattr(exc, "status_code", None)
    if isinstance(exc, errors.BadRequestError | errors.UnprocessableEntityError):
        status = 400  # whatever status_code litellm filled in
    return refuses_format(status if isinstance(status, int) else None, str(exc))


def map_litellm_error(exc: BaseException, *, secret: str | None = None) -> ModelError:
    """The harvest error for an exception litellm raised.

    ``secret`` (the API key sent) is left out of the message. Order matters:
    ContextWindowExceededError and ContentPolicyViolationError subclass
    BadRequestError, so they are told apart before it. Anything unrecognised is permanent
    unless its status code says otherwise: retrying the unknown is how a job loops.
    """
    errors = load_litellm().exceptions
    message = server_text(str(exc), secret) or type(exc).__name__
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
    """Seconds the server asked us to wait, read from the headers litellm kept on ``exc``
    (see :func:`~harvest.retry.retry_after_from`), or None."""
    return retry_after_from(_error_headers(exc), now=now)


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
