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
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gleaner.errors import InvalidRequest

if TYPE_CHECKING:
    from gleaner.client import Gleaner
    from harvest.llm import HarvestLLM
    from harvest.options import ModelOptions
    from store import SearchHit, Settings
    from store.job_status import JobStatus

QUESTION_TYPES = (
    "single-session-user",
    "single-session-assistant",
    "single-session-preference",
    "multi-session",
    "temporal-reasoning",
    "knowledge-update",
)
# Not a question_type of the file: a question whose id ends so has no answer in the history.
ABSTENTION = "abstention"
ABSTENTION_SUFFIX = "_abs"
SYSTEMS = ("gleaner", "bm25")
DEFAULT_TOP_K = 10
DEFAULT_OWNER_PREFIX = "eval-"
# Seconds between two looks at an item's queued jobs.
POLL_SECONDS = 0.5
# Characters of each retrieved text kept in a record (the answer model sees all of it).
RECORD_TEXT_CHARS = 300

# How haystack_dates and question_date are written ("2023/05/20 (Sat) 02:21"); an ISO 8601
# time is taken too. Times carry no zone: they are read, stored and shown as UTC.
DATE_PATTERN = re.compile(
    r"^\s*(\d{4})/(\d{1,2})/(\d{1,2})(?:\s*\(\w+\))?(?:\s+(\d{1,2}):(\d{2}))?\s*$"
)


class EvalFileError(InvalidRequest):
    """Raised when the LongMemEval file (or a judge prompt file) is not one the harness
    reads; the message names the file and what is wrong in it."""

    reason = "bad_eval_file"


class _Malformed(Exception):
    """Raised inside :func:`load_items` for a bad field; made an EvalFileError there, with
    the file and the item named."""


# --- the data --------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    role: str
    content: str


@dataclass(frozen=True)
class Session:
    """One haystack session: its id, its date as the file writes it, and its turns."""

    id: str
    date: str
    when: datetime
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Item:
    """One question of the file with its haystack."""

    question_id: str
    question_type: str
    question: str
    answer: str
    question_date: str
    sessions: tuple[Session, ...]
    answer_session_ids: tuple[str, ...] = ()

    @property
    def abstention(self) -> bool:
        """The question has no answer in the history (its id ends with ``_abs``)."""
        return self.question_id.endswith(ABSTENTION_SUFFIX)


def parse_date(text: str) -> datetime:
    """A LongMemEval date (``2023/05/20 (Sat) 02:21``) or an ISO 8601 time, as UTC;
    ValueError when it is neither."""
    found = DATE_PATTERN.match(text)
    if found:
        year, month, day, hour, minute = (int(part or 0) for part in found.groups())
        return datetime(year, month, day, hour, minute, tzinfo=UTC)
    parsed = datetime.fromisoformat(text.strip())
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def said(when: datetime | None) -> str:
    """A time as the file writes its dates (in UTC), or ``unknown``."""
    if when is None:
        return "unknown"
    return when.astimezone(UTC).strftime("%Y/%m/%d (%a) %H:%M")


def load_items(path: Path) -> list[Item]:
    """Every question of a LongMemEval file: a JSON list of objects with ``question_id``,
    ``question_type``, ``question``, ``answer``, ``question_date``, ``haystack_dates`` and
    ``haystack_sessions`` (lists of ``{"role", "content"}`` turns), and optionally
    ``haystack_session_ids`` and ``answer_session_ids``. Other fields (``has_answer``) are
    ignored. EvalFileError names the file, the item and the field at the first problem."""
    try:
        data = json.loads(path.read_bytes())
    except OSError as exc:
        raise EvalFileError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except (ValueError, RecursionError) as exc:
        raise EvalFileError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, list):
        raise EvalFileError(
            f"{path}: a LongMemEval file is a JSON list of questions, got {_kind(data)}"
        )
    items: list[Item] = []
    seen: set[str] = set()
    for number, raw in enumerate(data, 1):
        where = f"{path}: item {number}"
        if isinstance(raw, Mapping) and isinstance(raw.get("question_id"), str):
            where += f" (question_id {raw['question_id']!r})"
        try:
            item = _item(raw)
        except _Malformed as exc:
            raise EvalFileError(f"{where}: {exc}") from None
        if item.question_id in seen:
            raise EvalFileError(f"{where}: question_id is used twice")
        seen.add(item.question_id)
        items.append(item)
    return items


def _kind(value: object) -> str:
    names = {dict: "an object", list: "a list", str: "a string", type(None): "null"}
    return names.get(type(value), f"a {type(value).__name__}")


def _text(raw: Mapping[str, Any], name: str, *, numbers: bool = False) -> str:
    value = raw.get(name)
    if numbers and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)  # some answers are counts
    if not isinstance(value, str):
        missing = name not in raw
        raise _Malformed(f"{name} is missing" if missing else f"{name} is {_kind(value)}")
    return value


def _strings(raw: Mapping[str, Any], name: str, count: int | None) -> list[str] | None:
    value = raw.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Malformed(f"{name} must be a list of strings")
    if count is not None and len(value) != count:
        raise _Malformed(f"{name} has {len(value)} entries for {count} haystack_sessions")
    return value


def _item(raw: object) -> Item:
    if not isinstance(raw, Mapping):
        raise _Malformed(f"a question is an object, got {_kind(raw)}")
    question_id = _text(raw, "question_id")
    if not question_id.strip():
        raise _Malformed("question_id is empty")
    question_type = _text(raw, "question_type")
    if question_type not in QUESTION_TYPES:
        raise _Malformed(f"question_type {question_type!r} is none of {', '.join(QUESTION_TYPES)}")
    sessions_raw = raw.get("haystack_sessions")
    if not isinstance(sessions_raw, list):
        raise _Malformed(
            "haystack_sessions is missing"
            if sessions_raw is None
            else "haystack_sessions must be a list of sessions"
        )
    dates = _strings(raw, "haystack_dates", len(sessions_raw))
    if dates is None:
        raise _Malformed("haystack_dates is missing")
    ids = _strings(raw, "haystack_session_ids", len(sessions_raw))
    sessions = []
    for index, (turns_raw, date) in enumerate(zip(sessions_raw, dates, strict=True)):
        try:
            when = parse_date(date)
        except ValueError:
            raise _Malformed(
                f"haystack_dates[{index}] {date!r} is not a date such as '2023/05/20 (Sat) 02:21'"
            ) from None
        session_id = ids[index] if ids is not None else f"session-{index + 1}"
        sessions.append(Session(session_id, date, when, _turns(turns_raw, index)))
    return Item(
        question_id=question_id,
        question_type=question_type,
        question=_text(raw, "question"),
        answer=_text(raw, "answer", numbers=True),
        question_date=_text(raw, "question_date"),
        sessions=tuple(sessions),
        answer_session_ids=tuple(_strings(raw, "answer_session_ids", None) or ()),
    )


def _turns(raw: object, index: int) -> tuple[Turn, ...]:
    if not isinstance(raw, list):
        raise _Malformed(f"haystack_sessions[{index}] must be a list of turns")
    turns = []
    for number, turn in enumerate(raw):
        where = f"haystack_sessions[{index}][{number}]"
        if not isinstance(turn, Mapping):
            raise _Malformed(f"{where} must be an object with role and content")
        role, content = turn.get("role"), turn.get("content")
        if role not in ("user", "assistant"):
            raise _Malformed(f"{where}: role must be 'user' or 'assistant', got {role!r}")
        if not isinstance(content, str):
            raise _Malformed(f"{where}: content must be a string")
        turns.append(Turn(role, content))
    return tuple(turns)


def select_items(
    items: Sequence[Item], *, types: Iterable[str] = (), limit: int | None = None
) -> list[Item]:
    """The items of the given types (``abstention`` names the abstention questions; none:
    every type), then the first ``limit`` of them."""
    wanted = set(types)
    chosen = [
        item
        for item in items
        if not wanted or item.question_type in wanted or (ABSTENTION in wanted and item.abstention)
    ]
    return chosen if limit is None else chosen[:limit]


# --- prompts ---------------------------------------------------------------------------

ANSWER_PROMPT = """\
You answer a user's question about their past conversations with an AI assistant. Below are \
memory entries from those conversations, oldest first, each with the date it was said. Use \
only these entries and the current date. When entries disagree, the later one holds. For \
questions about time, count from the entries' dates and the current date. If the entries do \
not hold the answer, say that you do not know; do not guess. Answer briefly.

Current date: {question_date}

Memory entries:
{context}

Question: {question}
Answer:"""
NO_ENTRIES = "(none)"

# The judge's criteria per question type, in our own words, after the benchmark's judge
# (LongMemEval, src/evaluation/evaluate_qa.py): one yes/no question to the judge model.


def _judge_prompt(
    rule: str, label: str = "Correct answer", ask: str = "Is the response correct?"
) -> str:
    return (
        "You grade a response from an assistant that answers questions from its memory of "
        f"earlier conversations. {rule}\n\nQuestion: {{question}}\n\n{label}: {{answer}}\n\n"
        f"Response: {{response}}\n\n{ask} Answer yes or no only."
    )


_GIVES_THE_ANSWER = (
    "Say yes if the response gives the correct answer: the same answer in other words, or "
    "every step that leads to it, counts. Say no if it gives another answer, or only part of "
    "what the correct answer needs."
)
JUDGE_PROMPTS: dict[str, str] = {
    "single-session-user": _judge_prompt(_GIVES_THE_ANSWER),
    "single-session-assistant": _judge_prompt(_GIVES_THE_ANSWER),
    "multi-session": _judge_prompt(_GIVES_THE_ANSWER),
    "temporal-reasoning": _judge_prompt(
        _GIVES_THE_ANSWER + " A count of days, weeks or months that is off by one (9 days "
        "where the correct answer says 8) still counts as correct."
    ),
    "knowledge-update": _judge_prompt(
        _GIVES_THE_ANSWER + " The response may also mention what was true before; it is "
        "correct as long as the answer it gives as current is the correct answer."
    ),
    "single-session-preference": _judge_prompt(
        "Instead of one correct answer you get a rubric of what a response personalised for "
        "this user would do. Say yes if the response recalls what it knows about the user "
        "and uses it correctly, as the rubric describes; it need not cover every point of "
        "the rubric. Otherwise say no.",
        label="Rubric",
        ask="Does the response satisfy it?",
    ),
    ABSTENTION: _judge_prompt(
        "This question cannot be answered from the conversation history; the explanation "
        "says why. Say yes if the response recognises that: it says it does not know, that "
        "the information is missing or incomplete, or that only other, related information "
        "is known. Say no if it answers as if it knew.",
        label="Explanation",
        ask="Does the response recognise that the question cannot be answered?",
    ),
}
PLACEHOLDERS = ("{question}", "{answer}", "{response}")
# A reasoning model's thoughts ahead of its answer (Qwen3 and DeepSeek-R1 through llama.cpp
# or Ollama write them into the content); an unclosed block is all thought.
_THOUGHTS = re.compile(
    r"\A\s*<(think|thinking|reasoning)>.*?(?:</\1>|\Z)", re.IGNORECASE | re.DOTALL
)
_VERDICT = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def judge_key(item: Item) -> str:
    """The judge prompt an item takes: ``abstention`` or its question type."""
    return ABSTENTION if item.abstention else item.question_type


def load_judge_prompts(path: Path) -> dict[str, str]:
    """Judge prompts from a file: plain text (one template for every question), or a JSON
    object from question type (or ``abstention``, or ``default`` for the types it leaves
    out) to template. A template holds ``{question}``, ``{answer}`` (the correct answer,
    rubric or explanation) and ``{response}``; any other text is sent as written. Types the
    file leaves out keep :data:`JUDGE_PROMPTS`."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EvalFileError(f"{path}: cannot read the judge prompt ({exc})") from None
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        known = (*QUESTION_TYPES, ABSTENTION, "default")
        unknown = sorted(set(parsed) - set(known))
        if unknown:
            raise EvalFileError(
                f"{path}: judge prompt keys {unknown} are none of {', '.join(known)}"
            )
        templates = dict(parsed)
    else:
        templates = {"default": text}
    for key, template in templates.items():
        if not isinstance(template, str):
            raise EvalFileError(f"{path}: the judge prompt for {key!r} is not a string")
        missing = [p for p in PLACEHOLDERS if p not in template]
        if missing:
            raise EvalFileError(
                f"{path}: the judge prompt for {key!r} lacks {', '.join(missing)} "
                f"(a template holds {', '.join(PLACEHOLDERS)})"
            )
    default = templates.pop("default", None)
    return {key: templates.get(key, default or built_in) for key, built_in in JUDGE_PROMPTS.items()}


def fill(template: str, values: Mapping[str, str]) -> str:
    """The template with each ``{name}`` of ``values`` replaced, in one pass: a value that
    holds a placeholder (a response quoting ``{answer}``) is left as it is, and so is any
    other text in braces."""
    names = "|".join(re.escape(name) for name in values)
    return re.sub(r"\{(" + names + r")\}", lambda found: values[found.group(1)], template)


def without_thoughts(text: str) -> str:
    """The answer without a reasoning model's leading thoughts."""
    return _THOUGHTS.sub("", text, count=1).strip()


def verdict(text: str) -> bool:
    """The judge's answer as yes (True) or no: the first ``yes`` or ``no`` word after any
    thoughts; neither is no."""
    found = _VERDICT.search(without_thoughts(text))
    return found is not None and found.group(1).lower() == "yes"


# --- models ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """A model and where it is served: a litellm model string, an API base and key."""

    model: str
    api_base: str | None = None
    api_key: str | None = None


@dataclass(frozen=True)
class Reply:
    text: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float


class ModelCaller:
    """One model at one endpoint, asked one user message at a time, at temperature 0.

    The call goes through the client ``GLEANER_HARVEST_LLM`` names (the lean
    OpenAI-compatible client for ``openai/...`` at an API base, litellm for any other) and
    harvest's one retry layer, with the harvest settings' timeout and attempts.
    """

    def __init__(self, endpoint: Endpoint, settings: Settings, *, max_tokens: int) -> None:
        from pydantic import SecretStr

        from harvest.model import resolve_llm
        from harvest.options import ModelOptions

        self.endpoint = endpoint
        self.options: ModelOptions = ModelOptions(
            model=endpoint.model,
            llm=settings.harvest_llm,
            api_base=endpoint.api_base,
            api_key=None if endpoint.api_key is None else SecretStr(endpoint.api_key),
            timeout_seconds=settings.harvest_timeout_seconds,
            max_attempts=settings.harvest_max_attempts,
            max_retry_seconds=settings.harvest_max_retry_seconds,
            max_answer_tokens=max_tokens,
            temperature=0.0,
            response_format="none",
        )
        self.llm: HarvestLLM = resolve_llm(self.options)

    def ask(self, prompt: str) -> Reply:
        from harvest.retry import call_with_retries

        started = time.perf_counter()
        answer = call_with_retries(self.llm, [{"role": "user", "content": prompt}], self.options)
        return Reply(
            answer.text,
            answer.prompt_tokens,
            answer.completion_tokens,
            time.perf_counter() - started,
        )


# --- the baseline: BM25 over the haystack's turns --------------------------------------

_WORD = re.compile(r"[a-z0-9]+")


def _stop_words() -> frozenset[str]:
    from store.terms import CLASSIC_STOP_WORDS

    return frozenset(word for entry in CLASSIC_STOP_WORDS for word in _WORD.findall(entry))


def bm25_tokens(text: str, stop: frozenset[str]) -> list[str]:
    """Lowercase words (letters and digits) less English stop words."""
    return [word for word in _WORD.findall(text.lower()) if word not in stop]


@dataclass(frozen=True)
class Entry:
    """One retrieved text as the answer model sees it, and as a record keeps it."""

    when: datetime | None
    text: str
    ref: str
    score: float

    def line(self) -> str:
        return f"({said(self.when)}) {self.text}"

    def record(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "said": said(self.when),
            "score": round(self.score, 4),
            "text": self.text[:RECORD_TEXT_CHARS],
        }


class TurnIndex:
    """BM25Okapi (``rank_bm25``) over every turn of an item's haystack, one turn a document."""

    def __init__(self, item: Item, stop: frozenset[str]) -> None:
        from rank_bm25 import BM25Okapi

        self.stop = stop
        self.turns = [
            (session, number, turn)
            for session in item.sessions
            for number, turn in enumerate(session.turns)
        ]
        corpus = [bm25_tokens(turn.content, stop) for _, _, turn in self.turns]
        # rank_bm25 divides by the corpus's words: a haystack with none has nothing to rank.
        self.bm25 = BM25Okapi(corpus) if any(corpus) else None

    def search(self, query: str, limit: int) -> list[Entry]:
        """The ``limit`` best turns for ``query``, best first (ties in haystack order)."""
        if self.bm25 is None:
            return []
        scores = [float(s) for s in self.bm25.get_scores(bm25_tokens(query, self.stop))]
        best = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:limit]
        return [
            Entry(
                when=self.turns[i][0].when,
                text=f"{self.turns[i][2].role}: {self.turns[i][2].content}",
                ref=f"{self.turns[i][0].id}#{self.turns[i][1]}",
                score=scores[i],
            )
            for i in best
        ]


def note_entries(hits: Sequence[SearchHit]) -> list[Entry]:
    """Gleaner's hits as entries: title and body, said when the fact was said (else when
    the note was made)."""
    return [
        Entry(
            when=hit.memory.occurred_at or hit.memory.created_at,
            text=f"{hit.memory.title}: {hit.memory.body}",
            ref=hit.memory.slug,
            score=hit.score,
        )
        for hit in hits
    ]


def context_text(entries: Sequence[Entry]) -> str:
    """The entries oldest first, numbered, one a line (a text's own lines indented)."""
    known = [e for e in entries if e.when is not None]
    ordered = sorted(known, key=lambda e: e.when or datetime.min) + [
        e for e in entries if e.when is None
    ]
    lines = [
        f"[{number}] " + entry.line().replace("\n", "\n    ")
        for number, entry in enumerate(ordered, 1)
    ]
    return "\n".join(lines) or NO_ENTRIES


# --- one question ----------------------------------------------------------------------


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
    stop_words: frozenset[str] = field(default_factory=_stop_words)


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
    from harvest.errors import ContextWindowExceeded, TransientModelError

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


# --- the report ------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank ``p``-th percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def _accuracy(flags: Sequence[bool]) -> dict[str, Any]:
    correct = sum(flags)
    return {
        "n": len(flags),
        "correct": correct,
        "accuracy": round(correct / len(flags), 4) if flags else None,
    }


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


def _ms(seconds: Sequence[float]) -> dict[str, float | None]:
    return {
        name: None if (value := percentile(seconds, p)) is None else round(value * 1000, 2)
        for name, p in (("p50", 50), ("p95", 95))
    }


def _price(model: str | None, prompt: int, completion: int) -> float | None:
    from harvest.litellm_client import price_usd

    if model is None:
        return 0.0  # the offline harvester: no model, no cost
    return price_usd(model, prompt, completion)


def _system(records: Sequence[dict[str, Any]], name: str, models: Models) -> dict[str, Any]:
    results = [r[name] for r in records]
    by_type: dict[str, Any] = {}
    for question_type in QUESTION_TYPES:
        flags = [r[name]["correct"] for r in records if r["question_type"] == question_type]
        if flags:
            by_type[question_type] = _accuracy(flags)
    typed = [t["accuracy"] for t in by_type.values()]
    answer_in = sum(r["answer_prompt_tokens"] for r in results)
    answer_out = sum(r["answer_completion_tokens"] for r in results)
    judge_in = sum(r["judge_prompt_tokens"] for r in results)
    judge_out = sum(r["judge_completion_tokens"] for r in results)
    answer_cost = _price(models.answer, answer_in, answer_out)
    judge_cost = _price(models.judge, judge_in, judge_out)
    return {
        **_accuracy([r["correct"] for r in results]),
        "task_averaged": round(sum(typed) / len(typed), 4) if typed else None,
        "by_type": by_type,
        "abstention": _accuracy([r[name]["correct"] for r in records if r["abstention"]]),
        "errors": sum(r["error"] is not None for r in results),
        "tokens_per_query": {
            "answer_prompt": _mean([r["answer_prompt_tokens"] for r in results]),
            "answer_completion": _mean([r["answer_completion_tokens"] for r in results]),
            "judge_prompt": _mean([r["judge_prompt_tokens"] for r in results]),
            "judge_completion": _mean([r["judge_completion_tokens"] for r in results]),
            "prompt": _mean(
                [r["answer_prompt_tokens"] + r["judge_prompt_tokens"] for r in results]
            ),
        },
        "tokens": {
            "answer_prompt": answer_in,
            "answer_completion": answer_out,
            "judge_prompt": judge_in,
            "judge_completion": judge_out,
        },
        "search_ms": _ms([r["search_seconds"] for r in results]),
        "answer_ms": _ms([r["answer_seconds"] for r in results if r["answer_seconds"] is not None]),
        "cost_usd": {
            "answer": answer_cost,
            "judge": judge_cost,
            "total": None
            if answer_cost is None or judge_cost is None
            else answer_cost + judge_cost,
        },
    }


@dataclass(frozen=True)
class Models:
    """The models of a run, for the report and its prices (``harvest`` None: offline)."""

    answer: str
    judge: str
    harvest: str | None


def summarize(records: Sequence[dict[str, Any]], models: Models, **about: Any) -> dict[str, Any]:
    """The report of a run's records: for Gleaner and the BM25 baseline, accuracy overall,
    task-averaged, by question type (abstention questions counted in their type too, as the
    benchmark counts them) and for abstention alone; tokens per query; search and answer
    latency (p50, p95, ms); cost (USD by litellm's price table, None for a model it does not
    price). ``harvest``: sessions, jobs, model calls and tokens, in total and per
    conversation harvested. ``about`` goes in as given (the file, top_k, ...)."""
    harvests = [r["harvest"] for r in records]
    totals = Counter[str]()
    for harvest in harvests:
        for key in (
            "sessions",
            "submitted",
            "done",
            "failed",
            "unfinished",
            "notes_written",
            "notes_updated",
            "model_calls",
            "prompt_tokens",
            "completion_tokens",
        ):
            totals[key] += int(harvest[key])
        totals["refused"] += len(harvest["refused"])
    conversations = totals["done"] + totals["failed"]
    harvest_cost = _price(models.harvest, totals["prompt_tokens"], totals["completion_tokens"])
    systems = {name: _system(records, name, models) for name in SYSTEMS}
    parts = [harvest_cost] + [systems[name]["cost_usd"]["total"] for name in SYSTEMS]
    return {
        **about,
        "questions": len(records),
        "models": asdict(models),
        "harvest": {
            **dict(totals),
            "per_conversation": {
                key: round(totals[key] / conversations, 1) if conversations else None
                for key in ("model_calls", "prompt_tokens", "completion_tokens")
            },
            "cost_usd": harvest_cost,
        },
        **systems,
        "cost_usd": None if any(p is None for p in parts) else sum(p for p in parts if p),
    }


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _usd(value: float | None) -> str:
    return "unknown" if value is None else f"${value:.4f}"


def format_report(report: Mapping[str, Any]) -> str:
    """The report as a text table."""
    gleaner, bm25 = report["gleaner"], report["bm25"]
    models = report["models"]
    lines = [
        f"LongMemEval: {report['questions']} question(s), top {report.get('top_k', '?')}; "
        f"answer {models['answer']}, judge {models['judge']}, "
        f"harvest {models['harvest'] or 'offline'}",
        "",
        f"{'accuracy':<28}{'n':>5}{'gleaner':>10}{'bm25':>10}",
        f"{'overall':<28}{gleaner['n']:>5}{_percent(gleaner['accuracy']):>10}"
        f"{_percent(bm25['accuracy']):>10}",
        f"{'task-averaged':<28}{'':>5}{_percent(gleaner['task_averaged']):>10}"
        f"{_percent(bm25['task_averaged']):>10}",
    ]
    for question_type, row in gleaner["by_type"].items():
        other = bm25["by_type"][question_type]
        lines.append(
            f"{question_type:<28}{row['n']:>5}{_percent(row['accuracy']):>10}"
            f"{_percent(other['accuracy']):>10}"
        )
    lines.append(
        f"{'abstention':<28}{gleaner['abstention']['n']:>5}"
        f"{_percent(gleaner['abstention']['accuracy']):>10}"
        f"{_percent(bm25['abstention']['accuracy']):>10}"
    )
    per_query = [
        ("answer tokens (prompt)", "tokens_per_query", "answer_prompt"),
        ("answer tokens (completion)", "tokens_per_query", "answer_completion"),
        ("judge tokens (prompt)", "tokens_per_query", "judge_prompt"),
        ("search ms p50", "search_ms", "p50"),
        ("search ms p95", "search_ms", "p95"),
        ("answer ms p50", "answer_ms", "p50"),
        ("answer ms p95", "answer_ms", "p95"),
    ]
    lines += ["", f"{'per query':<33}{'gleaner':>10}{'bm25':>10}"]
    for label, group, key in per_query:
        digits = 2 if group != "tokens_per_query" else 1
        lines.append(
            f"{label:<33}{_number(gleaner[group][key], digits):>10}"
            f"{_number(bm25[group][key], digits):>10}"
        )
    lines.append(
        f"{'cost (answers and judging)':<33}{_usd(gleaner['cost_usd']['total']):>10}"
        f"{_usd(bm25['cost_usd']['total']):>10}"
    )
    harvest = report["harvest"]
    per = harvest["per_conversation"]
    lines += [
        "",
        f"harvest: {harvest['sessions']} session(s), {harvest['done']} harvested, "
        f"{harvest['failed']} failed, {harvest['unfinished']} unfinished, "
        f"{harvest['refused']} refused; {harvest['notes_written']} notes written",
        f"harvest model: {harvest['model_calls']} call(s), {harvest['prompt_tokens']:,} prompt "
        f"+ {harvest['completion_tokens']:,} completion tokens; per conversation "
        f"{_number(per['model_calls'])} call(s), {_number(per['prompt_tokens'])} + "
        f"{_number(per['completion_tokens'])} tokens; cost {_usd(harvest['cost_usd'])}",
        f"total cost: {_usd(report['cost_usd'])}",
    ]
    errors = gleaner["errors"] + bm25["errors"]
    if errors:
        lines.append(f"model calls that failed after retries: {errors} (judged wrong)")
    return "\n".join(lines)
