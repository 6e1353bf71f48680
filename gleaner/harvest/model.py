"""The harvest model: the notes of one transcript, asked of the model chunk by chunk.

:func:`extract` is the call path: size checks, chunking (``harvest.chunks``), one request per
chunk through the response-format fallback (``harvest.formats``) and the retry layer
(``harvest.retry``), the answer parsed (``harvest.answer``), re-asked once when it is cut off
or unparseable, and every call and token counted (:class:`Usage`). The client making each
request is the one ``harvest_llm`` names (:func:`resolve_llm`).

Importing this module does not import litellm (``harvest.litellm_client`` does, on first use).
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from pydantic import BaseModel, ConfigDict

from gleaner.harvest.answer import ParsedNotes, parse_answer
from gleaner.harvest.candidate import NoteCandidate
from gleaner.harvest.chunks import Encoding, count_tokens, pack_chunks
from gleaner.harvest.errors import ContextWindowExceeded, TruncatedAnswer, UnparseableAnswer
from gleaner.harvest.formats import call_with_fallback
from gleaner.harvest.litellm_client import litellm_call, litellm_format, load_litellm
from gleaner.harvest.llm import HarvestLLM, LLMAnswer, Messages
from gleaner.harvest.merge import merge_notes, spelled_as_known
from gleaner.harvest.options import MIN_CONTEXT_TOKENS, ModelOptions
from gleaner.harvest.outcome import Counts
from gleaner.harvest.prompt import KnownNote, build_messages, reask_messages, render_message
from gleaner.harvest.transcript import Limits, Transcript, check_size, too_large

# The call contract, the options and token counting live in the modules named for them.
__all__ = [
    "MAX_HALVINGS",
    "ModelResult",
    "Usage",
    "extract",
    "merge_notes",
    "resolve_llm",
    "warm_up",
]

log = logging.getLogger(__name__)

# A context-window error halves the chunks at most this often, and never below
# MIN_CONTEXT_TOKENS (the smallest budget the settings allow): a model that refuses those is
# too small for the prompt itself, and smaller pieces would only multiply failing calls.
MAX_HALVINGS = 4


def resolve_llm(options: ModelOptions) -> HarvestLLM:
    """The callable ``harvest_llm`` names: ``auto`` (the lean OpenAI-compatible client of
    ``harvest.openai_http`` for an ``openai/...`` model with an ``api_base``, litellm for any
    other), ``litellm``, ``openai`` (the lean client), or an importable ``module:function``.

    Raises ConfigError naming GLEANER_HARVEST_LLM when it cannot be imported or called.
    """
    spec = options.llm.strip()
    lean = options.model.startswith("openai/") and bool(options.api_base)
    if spec == "openai" or (spec == "auto" and lean):
        from gleaner.harvest.openai_http import openai_call

        return openai_call
    if spec in ("litellm", "auto"):
        return litellm_call
    from gleaner.store import ConfigError

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


def warm_up(model: str) -> None:
    """Pay the one-off costs of talking to ``model`` now: importing litellm (seconds), its
    structured-output lookup and the tokenizer file.

    A worker calls this in its parent process before forking, so every pool child (and every
    child that replaces one after ``worker_max_tasks_per_child``) inherits them instead of
    spending its first seconds importing.
    """
    load_litellm()
    litellm_format(model)
    count_tokens("warm up")  # loads the tokenizer


class ModelResult(BaseModel):
    """The merged notes of one transcript and what finding them cost.

    ``cost``: the invalid items dropped, every attempt made (retried and unparseable ones
    included) as ``model_calls``, and the tokens of every answer received.
    """

    model_config = ConfigDict(frozen=True)

    notes: list[NoteCandidate]
    cost: Counts = Counts()
    model: str = ""
    chunks: int = 0


@dataclass
class Usage:
    """Model calls and tokens spent so far (``counts``); filled in as calls are made, so a
    caller still knows the cost of a transcript whose harvest failed."""

    counts: Counts = field(default_factory=Counts)
    model: str = ""  # the model the server said answered, once one has
    # Checked before each call and told of each call after (the daily budgets).
    guard: CallGuard | None = None

    def add(self, cost: Counts) -> None:
        self.counts = self.counts + cost


def _measure(model: str, tokens: Counts) -> None:
    """One call in the Prometheus counters (``harvest.metrics``); its price only where
    litellm is loaded already (its cost map; the lean client never loads it for this)."""
    from gleaner.harvest import metrics

    metrics.MODEL_CALLS.labels(model).inc()
    metrics.MODEL_TOKENS.labels(model, "prompt").inc(tokens.prompt_tokens)
    metrics.MODEL_TOKENS.labels(model, "completion").inc(tokens.completion_tokens)
    if "litellm" in sys.modules:
        from gleaner.harvest.budget import price

        dollars = price(model, tokens.prompt_tokens, tokens.completion_tokens)
        if dollars:
            metrics.MODEL_COST.labels(model).inc(dollars)


class CallGuard(Protocol):
    """What may stop a model call before it is made (``harvest.budget.Budget``)."""

    def before_call(self) -> None: ...

    def after_call(self, cost: Counts) -> None: ...


_ONE_CALL = Counts(model_calls=1)


class _Meter:
    """Wraps the llm so every attempt and every answer's usage is counted, into this
    extraction's ``spent`` and the caller's ``usage`` (when given)."""

    def __init__(self, llm: HarvestLLM, options: ModelOptions, usage: Usage | None) -> None:
        self.llm = llm
        self.options = options
        self.spent = Usage()
        self.counters = [self.spent] if usage is None else [self.spent, usage]
        self.guard = None if usage is None else usage.guard
        self.model = ""

    def _count(self, cost: Counts) -> None:
        for counter in self.counters:
            counter.add(cost)

    def _attempt(self, messages: Messages, *, options: ModelOptions) -> LLMAnswer:
        if self.guard is not None:
            self.guard.before_call()  # over a budget: no call is made
        self._count(_ONE_CALL)  # counted before the call: a failed attempt costs too
        tokens = Counts()
        try:
            answer = self.llm(messages, options=options)
            tokens = Counts(
                prompt_tokens=answer.prompt_tokens, completion_tokens=answer.completion_tokens
            )
        finally:
            if self.guard is not None:
                self.guard.after_call(_ONE_CALL + tokens)
            _measure(options.model, tokens)
        self._count(tokens)
        self.model = answer.model or self.model
        for counter in self.counters:
            counter.model = self.model
        return answer

    def ask(self, messages: Messages, *, max_facts: int | None = None) -> LLMAnswer:
        """One answer (with retries and format fallback); ``max_facts`` lowers the notes the
        request's schema allows (the shorter re-ask), where the format carries a bound."""
        options = self.options
        if max_facts is not None and max_facts != options.max_facts:
            options = options.model_copy(update={"max_facts": max_facts})
        return call_with_fallback(self._attempt, messages, options)


def extract(
    transcript: Transcript,
    options: ModelOptions,
    llm: HarvestLLM | None = None,
    known_keys: Sequence[tuple[str, str]] = (),
    usage: Usage | None = None,
    *,
    encoding: Encoding | None = None,
    known_notes: Sequence[KnownNote] = (),
) -> ModelResult:
    """Ask the harvest model for the notes of one (already redacted) transcript.

    ``usage``, when given, counts every call and token as it happens, failed ones included.
    ``encoding`` counts the tokens chunks are cut by (default cl100k, see ``harvest.chunks``).

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
    reuses its key; ``known_notes`` (the owner's notes the transcript bears on, under refs)
    replace them when given, and the model marks each note new, the same as one of them or
    an update of one.

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
    pending = deque(pack_chunks(blocks, budget, encoding))
    _check_calls(len(pending), budget, options.max_calls)
    collected: list[NoteCandidate] = []
    dropped = done = halvings = requests = 0
    while pending:
        chunk = pending.popleft()
        part = (done + 1, done + 1 + len(pending))
        requests += 1
        try:
            parsed = _ask_chunk(meter, chunk, part, options, known_keys, known_notes=known_notes)
        except ContextWindowExceeded:
            halvings += 1
            budget = min(budget, count_tokens(chunk, encoding)) // 2
            if halvings > MAX_HALVINGS or budget < MIN_CONTEXT_TOKENS:
                raise
            log.warning("context window exceeded; re-chunking at %d tokens", budget)
            # The rest is re-cut too: chunks of the old size would overflow the same way.
            lines = [line for piece in (chunk, *pending) for line in piece.split("\n")]
            pending = deque(pack_chunks(lines, budget, encoding))
            _check_calls(requests + len(pending), budget, options.max_calls)
            continue
        done += 1
        collected.extend(parsed.notes)
        dropped += parsed.dropped
    return ModelResult(
        notes=merge_notes(
            spelled_as_known(
                collected,
                [*known_keys, *((n.topic_key, n.title) for n in known_notes if n.topic_key)],
            ),
            options.max_facts,
        ),
        cost=meter.spent.counts + Counts(items_dropped=dropped),
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
    *,
    known_notes: Sequence[KnownNote] = (),
) -> ParsedNotes:
    """The notes of one chunk, in at most two requests (the bound extract documents).

    A truncated answer (``finish_reason == "length"``) is never parsed: the chunk is asked
    again for half the notes with one-sentence bodies (same ``max_answer_tokens``: a cut
    answer is most often a model running on, which more room would only make slower), and a
    second cut answer fails it (TruncatedAnswer). An unparseable answer is asked again once,
    with the model's answer and what was wrong with it; that second answer is final.
    """
    messages = build_messages(
        chunk,
        max_facts=options.max_facts,
        types=options.types,
        part=part,
        known_keys=known_keys,
        known_notes=known_notes,
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
            known_notes=known_notes,
            cut_off=True,
        )
        return _final(meter.ask(shorter, max_facts=fewer), options, fewer)
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
