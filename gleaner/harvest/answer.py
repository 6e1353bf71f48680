"""The notes in a model's answer: JSON found in the text (raw, fenced or inside prose), each
item validated, the invalid ones dropped and counted, and what was wrong when nothing was
found, in one line the re-ask can show the model."""

from __future__ import annotations

import itertools
import json
import logging
import re
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from gleaner.harvest.candidate import NoteCandidate
from gleaner.harvest.errors import UnparseableAnswer
from gleaner.harvest.prompt import is_placeholder

log = logging.getLogger(__name__)


class ParsedNotes(BaseModel):
    """The valid notes of one answer and how many items were dropped as invalid."""

    model_config = ConfigDict(frozen=True)

    notes: list[NoteCandidate]
    dropped: int = 0


_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\r?\n?(.*?)```", re.DOTALL)
# A reasoning model's thoughts ahead of its answer, in the content itself (DeepSeek-R1 or
# Qwen3 through llama.cpp or Ollama): a draft of the JSON in there is not the answer.
_THOUGHTS = re.compile(r"\A\s*<(think|thinking|reasoning)>", re.IGNORECASE)
ONLY_THOUGHTS = "it holds only the model's thoughts: its <{tag}> block never ends"
# Scanning prose for JSON tries each '{' or '[' in turn; an answer is small, but this
# keeps a pathological one from costing quadratic time.
_MAX_SCAN_STARTS = 200


def parse_answer(text: str, types: Sequence[str]) -> ParsedNotes:
    """The notes in a model answer: raw JSON, JSON in a ```json fence, or JSON inside prose.

    A reasoning model's ``<think>...</think>`` block ahead of the answer is left out (one
    that never ends leaves no answer). The top level must be ``{"notes": [...]}`` or a bare
    list; each item is validated as a :class:`NoteCandidate` whose type is one of
    ``types``, and invalid ones are dropped and counted, a note whose title or body is the
    prompt's placeholder text among them. Raises
    UnparseableAnswer when no JSON of that shape is found; its ``problem`` says why in one
    line that quotes nothing of the answer.
    """
    thoughts = _THOUGHTS.match(text)
    if thoughts is not None:
        tag = thoughts.group(1).lower()
        end = text.lower().find(f"</{tag}>", thoughts.end())
        if end < 0:
            problem = ONLY_THOUGHTS.format(tag=tag)
            raise UnparseableAnswer(
                f"the model's answer ({len(text)} characters) held no notes JSON: {problem}",
                problem=problem,
            )
        text = text[end + len(tag) + 3 :]
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
        return _dropped("not a JSON object")
    try:
        note = NoteCandidate.model_validate(item)
    except ValidationError as exc:
        # Where and why, never the value: the model's text may quote the transcript.
        return _dropped(
            "; ".join(f"{'.'.join(map(str, e['loc']))} {e['msg']}" for e in exc.errors())
        )
    if note.type not in allowed:
        return _dropped("type is not one of the observation types")
    if is_placeholder(note.title) or is_placeholder(note.body):
        return _dropped("title or body is the prompt's example text")
    return note


def _dropped(reason: str) -> NoteCandidate | None:
    """None, for an item dropped for ``reason`` (logged)."""
    log.info("a note of the model's answer was dropped: %s", reason)
    return None


def _problem(text: str) -> str:
    """What is wrong with an answer :func:`_find_items` found nothing in, in one line."""
    stripped = text.strip()
    if not stripped:
        return "the answer was empty"
    try:
        whole = json.loads(stripped)
    except RecursionError:
        return "it is JSON nested too deeply to read"
    except ValueError as exc:
        if stripped[0] not in "{[":
            return 'it is not JSON and holds no JSON object with a "notes" list'
        if not isinstance(exc, json.JSONDecodeError):
            # Valid JSON Python's parser refuses: an integer over its digit limit.
            digits = sys.get_int_max_str_digits()
            return f"it holds a number of more than {digits:,} digits, too long to read"
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
        except (ValueError, RecursionError):  # not JSON there, or JSON nested too deeply
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
    """``text`` parsed, or _NOT_JSON: not JSON, JSON nested deeper than Python's parser
    recurses (RecursionError), or an integer over its digit limit (ValueError)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _NOT_JSON
