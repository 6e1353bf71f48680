"""Reading a path: which format it is, and every conversation in it."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from harvest.errors import TranscriptFormatError
from harvest.readers.chatgpt import read_chatgpt
from harvest.readers.claude import read_claude
from harvest.readers.native import read_native, read_openai
from harvest.redact import redact_text
from harvest.transcript import Transcript

SUFFIXES = frozenset({".json", ".jsonl", ".zip"})
_LINES_SUFFIXES = frozenset({".jsonl", ".ndjson"})
EXPORT_MEMBER = "conversations.json"
# Files that sit beside conversations.json in an unpacked ChatGPT or Claude export: account
# data, not conversations, so a folder import skips them instead of failing on them.
_EXPORT_SIDECARS = frozenset(
    {
        "user.json",
        "users.json",
        "projects.json",
        "memories.json",
        "message_feedback.json",
        "model_comparisons.json",
        "shared_conversations.json",
    }
)
EXPECTED = (
    "expected one of: native JSON {conversation_id, owner | scope, messages}, "
    "JSON Lines of native objects, an OpenAI-style {messages: [...]}, "
    "a ChatGPT or Claude export conversations.json, or the export .zip holding it"
)

# A conversation id is at most this long (the transcript refuses longer ones).
_MAX_LABEL_ID_CHARS = 255
_JSON_NAMES = {str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
Reader = Callable[..., Transcript]
_READERS: dict[str, Reader] = {
    "native": read_native,
    "openai": read_openai,
    "chatgpt": read_chatgpt,
    "claude": read_claude,
}


@dataclass
class ReadResult:
    """The conversations read from one path, and the ones skipped as ``(label, reason)``.

    A label is the file, then ``[index]`` in a JSON list or ``:line`` in JSON Lines, then the
    conversation's id when it has one: ``export/conversations.json[3] 6634f0a0-...``.
    """

    transcripts: list[Transcript] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)


def not_a_transcript(path: Path, why: str) -> TranscriptFormatError:
    """The error for a whole file that is no transcript: names the file and what was expected."""
    return TranscriptFormatError(f"{path}: not a transcript file ({why}); {EXPECTED}")


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


def _label(base: str, obj: object) -> str:
    """``base`` and the conversation's id, under the privacy rule and cut to 255 characters
    (a label is printed and stored whether or not the conversation could be read)."""
    for key in ("conversation_id", "uuid", "id"):
        value = obj.get(key) if isinstance(obj, Mapping) else None
        if isinstance(value, str | int) and not isinstance(value, bool) and value != "":
            shown = redact_text(str(value))
            if len(shown) > _MAX_LABEL_ID_CHARS:
                shown = shown[:_MAX_LABEL_ID_CHARS] + "…"
            return f"{base} {shown}"
    return base


def _read_one(
    result: ReadResult,
    label: str,
    kind: str,
    obj: Any,
    *,
    path: Path,
    default_owner: str | None,
    source_format: str | None = None,
    where: str = "",
) -> None:
    """Read one conversation into ``result``; a bad one becomes an error, not an exception.

    ``where`` (a line number) prefixes the reason, so the reason alone still says where.
    """
    try:
        transcript = _READERS[kind](
            obj, path=path, default_owner=default_owner, source_format=source_format or kind
        )
    except TranscriptFormatError as exc:
        result.errors.append((label, where + exc.message))
    else:
        result.transcripts.append(transcript)


def _read_value(value: object, path: Path, default_owner: str | None) -> ReadResult:
    result = ReadResult()
    if isinstance(value, Mapping):
        kind = kind_of(value)
        if kind is None:
            raise not_a_transcript(path, "a JSON object without messages, mapping or chat_messages")
        _read_one(
            result, _label(str(path), value), kind, value, path=path, default_owner=default_owner
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
            _read_one(result, str(path), "openai", value, path=path, default_owner=default_owner)
            return result
        raise not_a_transcript(path, "a JSON list holding no conversation")
    for index, (item, kind) in enumerate(zip(value, kinds, strict=True)):
        label = _label(f"{path}[{index}]", item)
        if kind is None:
            result.errors.append((label, "matches no conversation format"))
        else:
            _read_one(result, label, kind, item, path=path, default_owner=default_owner)
    return result


def _read_lines(text: str, path: Path, default_owner: str | None) -> ReadResult | None:
    """JSON Lines, one conversation a line; None when no line holds a conversation at all."""
    result = ReadResult()
    recognised = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        label = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            result.errors.append((label, f"line {number}: not JSON ({exc.msg})"))
            continue
        kind = kind_of(obj)
        if kind is None:
            result.errors.append((label, f"line {number}: not a conversation object"))
            continue
        recognised += 1
        _read_one(
            result,
            _label(label, obj),
            kind,
            obj,
            path=path,
            default_owner=default_owner,
            source_format="jsonl",
            where=f"line {number}: ",
        )
    return result if recognised else None


def _decode(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise not_a_transcript(path, "not UTF-8 text") from None


def _read_zip(path: Path) -> str:
    """The text of the export's conversations.json; no other member is read."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = [
                info
                for info in archive.infolist()
                if not info.is_dir()
                and PurePosixPath(info.filename).name == EXPORT_MEMBER
                and not info.filename.startswith("__MACOSX/")
            ]
            if not members:
                raise not_a_transcript(path, f"a zip archive without {EXPORT_MEMBER}")
            # The shallowest one is the export's own; deeper ones belong to nested folders.
            member = min(members, key=lambda i: (i.filename.count("/"), i.filename))
            return _decode(archive.read(member), path)
    except zipfile.BadZipFile:
        # Not its message: some name members of the archive, which are the file's own text.
        raise not_a_transcript(path, "a damaged zip archive") from None


def _read_text(path: Path) -> str:
    try:
        if path.suffix.lower() == ".zip":
            return _read_zip(path)
        data = path.read_bytes()
        if data.startswith(b"PK\x03\x04"):
            return _read_zip(path)
        return _decode(data, path)
    except IsADirectoryError:
        raise TranscriptFormatError(
            f"{path}: is a directory, not a transcript file", reason="unreadable"
        ) from None
    except OSError as exc:
        raise TranscriptFormatError(
            f"{path}: cannot be read ({exc.strerror or exc})", reason="unreadable"
        ) from None


def read_path(path: Path, *, default_owner: str | None = None) -> ReadResult:
    """Every conversation in one file, whatever supported format it is.

    ``default_owner`` is the owner of conversations that name none (exports never do); it may
    be None and the caller decides. A bad conversation inside a readable file is listed in
    ``errors`` and skipped; a file that is no transcript at all (not JSON, empty, unknown
    shape, unreadable) raises TranscriptFormatError naming it.
    """
    path = Path(path)
    text = _read_text(path)
    if not text.strip():
        raise not_a_transcript(path, "the file is empty")
    if path.suffix.lower() in _LINES_SUFFIXES:
        lines = _read_lines(text, path, default_owner)
        if lines is None:
            raise not_a_transcript(path, "no line holds a conversation")
        return lines
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        # Not one JSON document: JSON Lines under another name, or not JSON at all.
        lines = _read_lines(text, path, default_owner)
        if lines is None:
            raise not_a_transcript(
                path, f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
            ) from None
        return lines
    return _read_value(value, path, default_owner)


def _skipped(file: Path, root: Path) -> bool:
    relative = file.relative_to(root).parts
    if any(part.startswith(".") for part in relative):
        return True  # hidden files and folders (.git, editor state) hold no transcripts
    return file.name in _EXPORT_SIDECARS and (file.parent / EXPORT_MEMBER).is_file()


def iter_paths(paths: Iterable[Path | str]) -> Iterator[Path]:
    """The files to read: each file as given, each folder expanded recursively.

    A folder yields its .json, .jsonl and .zip files, sorted, skipping hidden ones and the
    account files beside an unpacked export's conversations.json.
    """
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = (
                f
                for f in path.rglob("*")
                if f.suffix.lower() in SUFFIXES and f.is_file() and not _skipped(f, path)
            )
            yield from sorted(found)
        else:
            yield path
