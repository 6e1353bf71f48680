"""Response formats: what each asks of the server, which one ``auto`` learned a server
accepts, and the fallback from one a server refuses to the next weaker one."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from gleaner.harvest.errors import ResponseFormatRejected
from gleaner.harvest.options import FORMATS, ModelOptions, ResponseFormat
from gleaner.harvest.prompt import response_schema
from gleaner.harvest.retry import call_with_retries

if TYPE_CHECKING:
    from gleaner.harvest.llm import HarvestLLM, LLMAnswer, Messages


log = logging.getLogger(__name__)


# A refusal names what it refuses: OpenAI ("'response_format' of type 'json_schema' is not
# supported"), LM Studio ("'response_format.type' must be 'json_schema' or 'text'"), llama.cpp
# ("JSON schema conversion failed") and llama-cpp-python, whose HTTP 500 carries the request's
# validation error ("response_format" ... "json_schema"). An error that names none of these
# (a bad message, an unknown model) is not about the format and is not fallen back from.
FORMAT_WORDS = re.compile(r"response.?format|json.?schema|json.?object|schema|grammar", re.I)


def refuses_format(status: int | None, message: str) -> bool:
    """Whether an error answer to a request that carried a response format says the format
    is what was wrong: a 400, 422 or 5xx whose message names the response format, the
    schema or the grammar. Any other status (401, 403, 404, 408, 409, 429) is about
    something else and keeps its own handling."""
    if status is None or not (status in (400, 422) or status >= 500):
        return False
    return FORMAT_WORDS.search(message) is not None


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
        # llama-cpp-python turns this schema into a grammar, which enforces maxItems: a small
        # model repeating one note (SmolLM2-135M did) must close the list after max_facts
        # instead of running to the token limit. Strict json_schema modes do not all take
        # length limits, so that form goes without.
        schema = response_schema(types=types, max_facts=max_facts)
        schema["properties"]["notes"]["maxItems"] = max_facts
        return {"type": "json_object", "schema": schema}
    if mode == "json_object":
        return {"type": "json_object"}
    return None


def weaker_format(mode: ResponseFormat) -> ResponseFormat | None:
    """The format after ``mode`` in FORMATS, or None after ``none``."""
    index = FORMATS.index(mode)
    return FORMATS[index + 1] if index + 1 < len(FORMATS) else None


# What ``auto`` learned in this process: (model, api_base) -> the format the server accepted
# after refusing a stronger one. Only an accepted format is remembered, so a request refused
# for another reason never weakens later calls.
_accepted: dict[tuple[str, str | None], ResponseFormat] = {}
_accepted_lock = threading.Lock()


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


def call_with_fallback(
    llm: HarvestLLM,
    messages: Messages,
    options: ModelOptions,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> LLMAnswer:
    """:func:`~harvest.retry.call_with_retries`, stepping down FORMATS while the server
    refuses the format.

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
