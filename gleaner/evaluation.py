"""``gleaner eval``: Gleaner measured end to end on LongMemEval's data format.

For each question of a LongMemEval file (a JSON list the user supplies; see
:func:`load_items`), in an owner scope of its own that is emptied first
(``eval-<question_id>``):

1. every haystack session is handed to :meth:`Gleaner.submit` as a platform would hand it
   over (the native format, ``ended_at`` = the session's date, so each note carries when it
   was said): harvested in process, or queued and waited for when a broker is set;
2. :meth:`Gleaner.search` retrieves the ``top_k`` notes for the question;
3. the answer model answers from them (title, body, when said) and the question's date;
4. the judge model says yes or no, with the criteria of the benchmark's judge for the
   question's type (:data:`JUDGE_PROMPTS`, or the user's own text: :func:`load_judge_prompts`);
5. the baseline, in the same run: BM25 (``rank_bm25``'s BM25Okapi) over the haystack's
   turns, its top ``top_k`` turns answered and judged the same way.

Every question gives one JSON-ready record (:func:`evaluate_item`); :func:`summarize` turns
records into the report (accuracy overall, by type and for abstention; harvest cost per
conversation; tokens per query; latency percentiles; cost from litellm's price table) and
:func:`format_report` into text. Model calls go through harvest's clients and its one retry
layer (``harvest.model.resolve_llm``, ``harvest.retry``).

This module runs the questions and re-exports the harness's public surface; the pieces live
beside it: ``eval_items`` (the file's data), ``eval_prompts``, ``eval_models``,
``eval_baseline`` (BM25 and the entries shown) and ``eval_report``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gleaner.eval_baseline import Entry, TurnIndex, context_text, note_entries, stop_words
from gleaner.eval_items import (
    ABSTENTION,
    QUESTION_TYPES,
    EvalFileError,
    Item,
    Session,
    Turn,
    load_items,
    parse_date,
    select_items,
)
from gleaner.eval_models import Endpoint, ModelCaller
from gleaner.eval_prompts import (
    ANSWER_PROMPT,
    JUDGE_PROMPTS,
    fill,
    judge_key,
    load_judge_prompts,
    verdict,
    without_thoughts,
)
from gleaner.eval_report import Models, format_report, percentile, summarize

if TYPE_CHECKING:
    from gleaner.client import Gleaner
    from gleaner.store.jobs.status import JobStatus

# The harness's public surface, whichever sibling module defines it (``gleaner eval`` and
# the tests import it from here).
__all__ = [
    "ABSTENTION",
    "JUDGE_PROMPTS",
    "QUESTION_TYPES",
    "Endpoint",
    "EvalFileError",
    "Item",
    "ModelCaller",
    "Models",
    "Run",
    "Session",
    "Turn",
    "evaluate",
    "evaluate_item",
    "fill",
    "format_report",
    "ingest",
    "load_items",
    "load_judge_prompts",
    "parse_date",
    "percentile",
    "select_items",
    "summarize",
    "verdict",
]

DEFAULT_TOP_K = 10
DEFAULT_OWNER_PREFIX = "eval-"
# Seconds between two looks at an item's queued jobs.
POLL_SECONDS = 0.5


class Listener(Protocol):
    """What a run tells the one who started it (the CLI prints it on stderr)."""

    def item_started(self, number: int, total: int, item: Item) -> None: ...

    def harvest(self, item: Item, done: int, total: int) -> None:
        """``done`` of the item's ``total`` sessions harvested (or finished in the queue)."""

    def item_done(self, number: int, total: int, record: dict[str, Any]) -> None: ...


class Silent:
    """A listener that says nothing."""

    def item_started(self, number: int, total: int, item: Item) -> None:
        pass

    def harvest(self, item: Item, done: int, total: int) -> None:
        pass

    def item_done(self, number: int, total: int, record: dict[str, Any]) -> None:
        pass


@dataclass
class Harvested:
    """What ingesting one item's haystack did and cost."""

    sessions: int = 0
    submitted: int = 0
    done: int = 0
    failed: int = 0
    unfinished: int = 0
    refused: list[dict[str, str]] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)
    notes_written: int = 0
    notes_updated: int = 0
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class Run:
    """What every question of a run shares: the models, how many to retrieve, the prompts."""

    answerer: ModelCaller
    judge: ModelCaller
    top_k: int = DEFAULT_TOP_K
    judge_prompts: Mapping[str, str] = field(default_factory=lambda: dict(JUDGE_PROMPTS))
    owner_prefix: str = DEFAULT_OWNER_PREFIX
    timeout_seconds: float = 3600.0
    poll_seconds: float = POLL_SECONDS
    stop_words: frozenset[str] = field(default_factory=stop_words)


def conversation(item: Item, session: Session, owner: str) -> dict[str, Any]:
    """A haystack session in Gleaner's native format, ended at the session's date."""
    return {
        "conversation_id": session.id,
        "owner": owner,
        "ended_at": session.when.isoformat(),
        "messages": [{"role": t.role, "content": t.content} for t in session.turns],
    }


def ingest(gleaner: Gleaner, item: Item, owner: str, run: Run, listener: Listener) -> Harvested:
    """Submit every session of the item (in haystack order) into ``owner``'s scope and, when
    they are queued, wait for their jobs (at most ``run.timeout_seconds``). A session
    Gleaner refuses (an empty one) is counted in ``refused``, not fatal."""
    from gleaner.errors import InvalidRequest as Refused

    started = time.perf_counter()
    harvested = Harvested(sessions=len(item.sessions))
    job_ids: list[str] = []
    for number, session in enumerate(item.sessions, 1):
        try:
            job_ids.append(gleaner.submit(conversation(item, session, owner)))
        except Refused as exc:
            harvested.refused.append(
                {"session_id": session.id, "error": f"{exc.reason}: {exc.message}"}
            )
        if not gleaner.queued:  # harvested in submit: say how far it is
            listener.harvest(item, number, len(item.sessions))
    harvested.submitted = len(job_ids)
    statuses = _wait(gleaner, item, job_ids, run, listener)
    for status in statuses:
        harvested.model_calls += status.model_calls
        harvested.prompt_tokens += status.prompt_tokens
        harvested.completion_tokens += status.completion_tokens
        if status.state == "done":
            harvested.done += 1
            harvested.notes_written += status.notes_written
            harvested.notes_updated += status.notes_updated
        elif status.state == "failed":
            harvested.failed += 1
            harvested.errors.append(
                {"conversation_id": status.conversation_id, "error": status.error or ""}
            )
        else:
            harvested.unfinished += 1
    harvested.seconds = time.perf_counter() - started
    return harvested


def _wait(
    gleaner: Gleaner, item: Item, job_ids: Sequence[str], run: Run, listener: Listener
) -> list[JobStatus]:
    """Each job's last status, once every one is done or failed or the time is up."""
    finished = {"done", "failed"}
    deadline = time.monotonic() + run.timeout_seconds
    last: dict[str, JobStatus] = {}
    while True:
        for job_id in job_ids:
            if job_id not in last or last[job_id].state not in finished:
                last[job_id] = gleaner.job(job_id)
        done = sum(status.state in finished for status in last.values())
        if gleaner.queued:
            listener.harvest(item, done, len(job_ids))
        if done == len(job_ids) or time.monotonic() >= deadline:
            return [last[job_id] for job_id in job_ids]
        time.sleep(run.poll_seconds)


def answer_and_judge(run: Run, item: Item, entries: Sequence[Entry]) -> dict[str, Any]:
    """Ask the answer model from ``entries``, then the judge; the record of one system.
    A model call that still fails after harvest's retries (a timeout, a server error, a
    prompt over the context) is recorded as ``error`` and judged wrong; any other model
    error (a refused key, an unknown model) ends the run."""
    from gleaner.harvest.errors import ContextWindowExceeded, TransientModelError

    result: dict[str, Any] = {
        "retrieved": [e.record() for e in entries],
        "response": None,
        "correct": False,
        "judge_text": None,
        "answer_seconds": None,
        "answer_prompt_tokens": 0,
        "answer_completion_tokens": 0,
        "judge_prompt_tokens": 0,
        "judge_completion_tokens": 0,
        "error": None,
    }
    prompt = fill(
        ANSWER_PROMPT,
        {
            "question_date": item.question_date,
            "context": context_text(entries),
            "question": item.question,
        },
    )
    try:
        reply = run.answerer.ask(prompt)
        result["answer_seconds"] = reply.seconds
        result["answer_prompt_tokens"] = reply.prompt_tokens
        result["answer_completion_tokens"] = reply.completion_tokens
        response = result["response"] = without_thoughts(reply.text)
        judged = run.judge.ask(
            fill(
                run.judge_prompts[judge_key(item)],
                {"question": item.question, "answer": item.answer, "response": response},
            )
        )
    except (TransientModelError, ContextWindowExceeded) as exc:
        result["error"] = f"{exc.reason}: {exc.message}"
        return result
    result["judge_text"] = judged.text
    result["judge_prompt_tokens"] = judged.prompt_tokens
    result["judge_completion_tokens"] = judged.completion_tokens
    result["correct"] = verdict(judged.text)
    return result


def evaluate_item(gleaner: Gleaner, item: Item, run: Run, listener: Listener) -> dict[str, Any]:
    """One question end to end: a fresh scope, the haystack harvested, Gleaner's notes and
    BM25's turns each answered and judged. The record is JSON-ready (a line of ``--out``)."""
    owner = gleaner.owner_name(run.owner_prefix + item.question_id)
    # A scope of its own, emptied first: notes of an earlier run would be counted as found,
    # and their ledger would make this run's harvest cost nothing.
    gleaner.forget(owner, allow_reharvest=True)
    harvested = ingest(gleaner, item, owner, run, listener)

    started = time.perf_counter()
    hits = gleaner.search(owner, item.question, limit=run.top_k)
    gleaner_seconds = time.perf_counter() - started
    index = TurnIndex(item, run.stop_words)  # its index build is the baseline's ingest
    started = time.perf_counter()
    turns = index.search(item.question, run.top_k)
    bm25_seconds = time.perf_counter() - started

    return {
        "question_id": item.question_id,
        "question_type": item.question_type,
        "abstention": item.abstention,
        "question": item.question,
        "answer": item.answer,
        "question_date": item.question_date,
        "owner": owner,
        "harvest": asdict(harvested),
        "gleaner": {
            "search_seconds": gleaner_seconds,
            **answer_and_judge(run, item, note_entries(hits)),
        },
        "bm25": {"search_seconds": bm25_seconds, **answer_and_judge(run, item, turns)},
    }


def evaluate(
    gleaner: Gleaner,
    items: Sequence[Item],
    run: Run,
    *,
    listener: Listener | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every item in turn (:func:`evaluate_item`); ``on_record`` gets each record as soon
    as it is made (``--out`` writes it then, so an interrupted run keeps what it did)."""
    told = listener or Silent()
    records = []
    for number, item in enumerate(items, 1):
        told.item_started(number, len(items), item)
        record = evaluate_item(gleaner, item, run, told)
        if on_record is not None:
            on_record(record)
        told.item_done(number, len(items), record)
        records.append(record)
    return records
