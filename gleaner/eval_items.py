"""``gleaner eval``'s data: LongMemEval questions (``Item``), their haystack sessions
and turns, read and checked from the file the user supplies (:func:`load_items`)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gleaner.errors import InvalidRequest

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
