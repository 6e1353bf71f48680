"""Reading a path: which format it is, and every conversation in it (the files a folder
holds: ``harvest.readers.paths``; what a read returns: ``harvest.readers.results``)."""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from gleaner.harvest.errors import TranscriptFormatError
from gleaner.harvest.readers._common import bad, json_problem, split_lines, too_deep
from gleaner.harvest.readers.chatgpt import read_chatgpt
from gleaner.harvest.readers.claude import read_claude
from gleaner.harvest.readers.claude_code import read_claude_code
from gleaner.harvest.readers.codex import read_codex
from gleaner.harvest.readers.files import (
    STDIN,
    STDIN_NAME,
    decode,
    not_a_transcript,
    read_stdin,
    read_text,
    read_zip,
)
from gleaner.harvest.readers.native import read_native, read_openai
from gleaner.harvest.readers.results import Read, ReadResult, label_of, refusal
from gleaner.harvest.readers.sessions import session_events, session_id, session_kind
from gleaner.harvest.redact import redact_text
from gleaner.harvest.transcript import DEFAULT_LIMITS, Limits, Transcript, too_large

log = logging.getLogger(__name__)

_LINES_SUFFIXES = frozenset({".jsonl", ".ndjson"})
_JSON_NAMES = {str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
Reader = Callable[..., Transcript]
_READERS: dict[str, Reader] = {
    "native": read_native,
    "openai": read_openai,
    "chatgpt": read_chatgpt,
    "claude": read_claude,
    "claude-code": read_claude_code,
    "codex": read_codex,
}


def kind_of(obj: object) -> str | None:
    """Which conversation format one JSON object is, or None."""
    if not isinstance(obj, Mapping):
        return None
    if isinstance(obj.get("mapping"), Mapping):
        return "chatgpt"
    if isinstance(obj.get("chat_messages"), list):
        return "claude"
    if "messages" in obj and any(k in obj for k in ("conversation_id", "owner", "scope")):
        return "native"  # even when its messages are broken: then the reader says how
    if isinstance(obj.get("messages"), list):
        return "openai"
    return None


def _read_one(
    result: ReadResult,
    label: str,
    kind: str,
    obj: Any,
    *,
    path: Path,
    default_owner: str | None,
    limits: Limits,
    source_format: str | None = None,
    where: str = "",
) -> None:
    """Read one conversation into ``result``; a bad one becomes an error, not an exception.

    ``where`` (a line number) prefixes the reason, so the reason alone still says where.
    """
    try:
        transcript = _READERS[kind](
            obj,
            path=path,
            default_owner=default_owner,
            source_format=source_format or kind,
            limits=limits,
        )
    except TranscriptFormatError as exc:
        result.errors.append((label, refusal(exc, where)))
    except RecursionError:
        result.errors.append((label, refusal(too_deep(""), where)))
    except (TypeError, AttributeError) as exc:
        # A JSON value of a type the reader did not check for (a list where a name belongs):
        # this conversation is refused, and the rest of the file and the import go on. Logged
        # with its traceback, since a reader missed a check; no value is quoted.
        log.warning(
            "%s: the %s reader met a value of a type it did not expect", label, kind, exc_info=exc
        )
        problem = bad(f"a field holds a JSON value of an unexpected type ({type(exc).__name__})")
        result.errors.append((label, refusal(problem, where)))
    else:
        result.transcripts.append(transcript)


def _read_value(value: object, path: Path, default_owner: str | None, limits: Limits) -> ReadResult:
    result = ReadResult()
    if isinstance(value, Mapping):
        kind = kind_of(value)
        if kind is None:
            raise not_a_transcript(path, "a JSON object without messages, mapping or chat_messages")
        _read_one(
            result,
            label_of(str(path), value),
            kind,
            value,
            path=path,
            default_owner=default_owner,
            limits=limits,
        )
        return result
    if not isinstance(value, list):
        raise not_a_transcript(path, f"a JSON {_JSON_NAMES.get(type(value), 'value')}")
    if not value:
        raise not_a_transcript(path, "an empty JSON list")
    kinds = [kind_of(item) for item in value]
    if not any(kinds):
        if all(isinstance(item, Mapping) and "role" in item for item in value):
            # A bare list of chat messages: one OpenAI-style conversation.
            _read_one(
                result,
                redact_text(str(path)),
                "openai",
                value,
                path=path,
                default_owner=default_owner,
                limits=limits,
            )
            return result
        raise not_a_transcript(path, "a JSON list holding no conversation")
    for index, (item, kind) in enumerate(zip(value, kinds, strict=True)):
        label = label_of(f"{path}[{index}]", item)
        if kind is None:
            result.errors.append((label, "matches no conversation format"))
        else:
            _read_one(
                result, label, kind, item, path=path, default_owner=default_owner, limits=limits
            )
    return result


def _read_lines(
    text: str, path: Path, default_owner: str | None, limits: Limits
) -> ReadResult | None:
    """JSON Lines, one conversation a line; None when no line holds a conversation at all."""
    result = ReadResult()
    recognised = False
    for conversation, one in _each_line(split_lines(text), path, default_owner, limits):
        recognised |= conversation
        result.transcripts += one.transcripts
        result.errors += one.errors
    return result if recognised else None


def _each_line(
    lines: Iterable[str], path: Path, default_owner: str | None, limits: Limits
) -> Iterator[tuple[bool, ReadResult]]:
    """Each non-blank line of JSON Lines read: whether it is a conversation object, and what
    was read from it (the transcript, or why it was skipped)."""
    where = redact_text(str(path))  # once, not a line
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        result = ReadResult()
        label = f"{where}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            result.errors.append((label, f"line {number}: not JSON ({exc.msg})"))
            yield False, result
            continue
        except ValueError as exc:  # valid JSON Python's parser refuses: see json_problem
            result.errors.append((label, f"line {number}: not JSON ({json_problem(exc)})"))
            yield False, result
            continue
        except RecursionError:
            result.errors.append((label, refusal(too_deep(""), f"line {number}: ")))
            yield False, result
            continue
        kind = kind_of(obj)
        if kind is None:
            result.errors.append((label, f"line {number}: not a conversation object"))
            yield False, result
            continue
        _read_one(
            result,
            label_of(label, obj),
            kind,
            obj,
            path=path,
            default_owner=default_owner,
            limits=limits,
            source_format="jsonl",
            where=f"line {number}: ",
        )
        yield True, result


def iter_path(
    path: Path | str, *, default_owner: str | None = None, limits: Limits = DEFAULT_LIMITS
) -> Iterator[Read]:
    """:func:`read_path` a conversation at a time, for callers that need not hold them all.

    A JSON array of conversations (an export's conversations.json, also inside its zip) is
    parsed an element at a time, and a JSON Lines file (``.jsonl``, ``.ndjson``) a line at a
    time (``harvest.readers.stream``): reading holds the conversation being read, not the
    file. Any other document (one conversation, a session file, a zip of JSON Lines,
    standard input) is read whole, as before. A file that stops being JSON part-way
    raises TranscriptFormatError after the conversations before the fault were yielded.
    """
    from gleaner.harvest.readers.stream import array_elements, json_lines

    if str(path) != STDIN and Path(path).suffix.lower() in _LINES_SUFFIXES:
        path = Path(path)
        with json_lines(path, limits) as lines:
            if lines is not None:
                recognised = False
                for conversation, one in _each_line(lines, path, default_owner, limits):
                    recognised |= conversation
                    yield from one.items()
                if not recognised:
                    raise not_a_transcript(path, "no line holds a conversation")
                return
    elif str(path) != STDIN:
        path = Path(path)
        with array_elements(path, limits) as elements:
            if elements is not None:
                first = next(elements, _END)
                if first is _END:
                    raise not_a_transcript(path, "an empty JSON list")
                if kind_of(first) is not None:
                    for index, item in enumerate(itertools.chain([first], elements)):
                        yield from _read_element(index, item, path, default_owner, limits)
                    return
        # A list of chat messages, or of something else first: read whole, as before.
    yield from _read_whole(path, default_owner, limits).items()


_END = object()


def _read_element(
    index: int, item: object, path: Path, default_owner: str | None, limits: Limits
) -> Iterator[Read]:
    """One element of a JSON list of conversations, as :func:`_read_value` reads it."""
    one = ReadResult()
    label = label_of(f"{path}[{index}]", item)
    kind = kind_of(item)
    if kind is None:
        one.errors.append((label, "matches no conversation format"))
    else:
        _read_one(one, label, kind, item, path=path, default_owner=default_owner, limits=limits)
    return one.items()


def read_path(
    path: Path, *, default_owner: str | None = None, limits: Limits = DEFAULT_LIMITS
) -> ReadResult:
    """Every conversation in one file, whatever supported format it is.

    ``default_owner`` is the owner of conversations that name none (exports never do); it may
    be None and the caller decides. A bad conversation inside a readable file is listed in
    ``errors`` and skipped, and so is one over ``limits`` (``too_large``); a file that is no
    transcript at all (not JSON, empty, unknown shape, unreadable) raises
    TranscriptFormatError naming it, as does one over ``limits.file_bytes`` (``too_large``) or
    nested too deeply to parse (``too_deep``). Nothing here tokenizes. An export's JSON
    array is parsed a conversation at a time (:func:`iter_path`).
    """
    result = ReadResult()
    for read in iter_path(path, default_owner=default_owner, limits=limits):
        if read.transcript is not None:
            result.transcripts.append(read.transcript)
        else:
            result.errors.append((read.label, read.error))
    return result


def _read_whole(path: Path | str, default_owner: str | None, limits: Limits) -> ReadResult:
    if str(path) == STDIN:
        return read_bytes(
            read_stdin(limits), STDIN_NAME, default_owner=default_owner, limits=limits
        )
    path = Path(path)
    return _read_document(read_text(path, limits), path, default_owner, limits)


def read_bytes(
    data: bytes, name: str, *, default_owner: str | None = None, limits: Limits = DEFAULT_LIMITS
) -> ReadResult:
    """Every conversation in a file's bytes that were not read from disk (an upload, standard
    input), under the same formats, limits and errors as :func:`read_path`; ``name`` stands
    for the file in labels and errors."""
    path = Path(name)
    if len(data) > limits.file_bytes:
        raise too_large(
            f"{path}: file", f"{len(data):,} bytes", limits.file_bytes, limits.file_bytes_setting
        )
    zipped = data[:4] == b"PK\x03\x04"
    text = read_zip(path, limits, data) if zipped else decode(data, path)
    return _read_document(text, path, default_owner, limits)


def _read_document(text: str, path: Path, default_owner: str | None, limits: Limits) -> ReadResult:
    if not text.strip():
        raise not_a_transcript(path, "the file is empty")
    kind = session_kind(text)
    if kind is not None:
        return _read_session(kind, text, path, default_owner, limits)
    if path.suffix.lower() in _LINES_SUFFIXES:
        lines = _read_lines(text, path, default_owner, limits)
        if lines is None:
            raise not_a_transcript(path, "no line holds a conversation")
        return lines
    try:
        value = json.loads(text)
    except RecursionError:
        raise too_deep(f"{path}: ") from None
    except ValueError as exc:  # a JSONDecodeError, or an integer over the digit limit
        # Not one JSON document: JSON Lines under another name, or not JSON at all.
        lines = _read_lines(text, path, default_owner, limits)
        if lines is None:
            raise not_a_transcript(path, f"not JSON: {json_problem(exc)}") from None
        return lines
    return _read_value(value, path, default_owner, limits)


def _read_session(
    kind: str, text: str, path: Path, default_owner: str | None, limits: Limits
) -> ReadResult:
    """A coding agent's session file (``harvest.readers.sessions``): one conversation."""
    result = ReadResult()
    try:
        events = session_events(text)
    except TranscriptFormatError as exc:
        result.errors.append((redact_text(str(path)), refusal(exc, "")))
        return result
    label = label_of(str(path), {"id": session_id(events)})
    _read_one(result, label, kind, events, path=path, default_owner=default_owner, limits=limits)
    return result
