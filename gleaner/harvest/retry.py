"""The one retry layer of a model call (a chat completion, an embedding request), on
tenacity: only transient errors are retried, after jittered exponential backoff but never
sooner than the server's Retry-After, within a number of attempts and a window no retry
starts after.

Clients never retry (litellm's and the openai client's own retries are off), so an attempt
here is one request.
"""

from __future__ import annotations

import email.utils
import logging
import math
import time
from collections.abc import Callable, Mapping
from datetime import UTC
from typing import TYPE_CHECKING

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_before_delay,
    wait_random_exponential,
)

from gleaner.harvest.errors import TransientModelError

if TYPE_CHECKING:
    from gleaner.harvest.llm import HarvestLLM, LLMAnswer, Messages
    from gleaner.harvest.options import ModelOptions

log = logging.getLogger(__name__)


def call_with_retries(
    llm: HarvestLLM,
    messages: Messages,
    options: ModelOptions,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> LLMAnswer:
    """Call ``llm``, retrying only TransientModelError; the last error is re-raised.

    At most ``options.max_attempts`` attempts; a retry whose wait would end
    ``max_retry_seconds`` or more after the first attempt started is not made (tenacity
    plans the wait before it decides to stop), so a Retry-After past the window gives up at
    once and the caller may reschedule by the error's ``retry_after``. Each retry is logged
    with ``attempt``, ``retry_in`` and ``since_first`` (seconds) as record attributes.
    """
    retrying = transient_retries(
        max_attempts=options.max_attempts,
        max_retry_seconds=options.max_retry_seconds,
        backoff_seconds=options.backoff_seconds,
        backoff_max_seconds=options.backoff_max_seconds,
        sleep=sleep,
    )
    return retrying(llm, messages, options=options)


def transient_retries(
    *,
    max_attempts: int,
    max_retry_seconds: float,
    backoff_seconds: float,
    backoff_max_seconds: float,
    sleep: Callable[[float], None] = time.sleep,
    what: str = "harvest model call",
) -> Retrying:
    """The retry layer :func:`call_with_retries` runs, for any one-request call (the
    embedding clients' too): only TransientModelError retried, jittered exponential backoff
    never shorter than the error's ``retry_after``, within ``max_attempts`` and a window of
    ``max_retry_seconds``; the last error re-raised. ``what`` names the call in the log."""
    backoff = wait_random_exponential(multiplier=backoff_seconds, max=backoff_max_seconds)

    def wait(state: RetryCallState) -> float:
        return max(backoff(state), _retry_after(state))

    def log_retry(state: RetryCallState) -> None:
        _log_retry(state, what)

    return Retrying(
        retry=retry_if_exception_type(TransientModelError),
        stop=stop_after_attempt(max_attempts) | stop_before_delay(max_retry_seconds),
        wait=wait,
        sleep=sleep,
        before_sleep=log_retry,
        reraise=True,
    )


def _retry_after(state: RetryCallState) -> float:
    """The Retry-After the failed attempt's error carries, 0 when none."""
    outcome = state.outcome
    error = outcome.exception() if outcome is not None and outcome.failed else None
    retry_after = getattr(error, "retry_after", None)
    return float(retry_after) if isinstance(retry_after, int | float) else 0.0


def _log_retry(state: RetryCallState, what: str) -> None:
    error = state.outcome.exception() if state.outcome is not None else None
    sleep = state.upcoming_sleep
    since = state.seconds_since_start or 0.0
    log.warning(
        "%s %d failed (%s); retrying in %.2fs",
        what,
        state.attempt_number,
        error,
        sleep,
        extra={"attempt": state.attempt_number, "retry_in": sleep, "since_first": since},
    )


def retry_after_from(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds the server asked us to wait (``retry-after-ms`` or ``Retry-After`` in
    ``headers``, their names lowercased), or None.

    ``Retry-After`` may be seconds or an HTTP date; a past date counts as 0, an unreadable
    value as None.
    """
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
