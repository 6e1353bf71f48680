"""A JSON array of conversations read one element at a time.

A ChatGPT or Claude export's ``conversations.json`` is one JSON array. Parsed whole, a 250 MB
export of tiny messages held 2.7 GB (a parsed JSON value is about ten times its text). Here
the file (or the zip's member, inflated in pieces) is read a piece at a time and each element
decoded on its own by the json module's decoder, so reading holds the element being read and
a piece of the file, whatever the file's size. (ijson's C backend, the usual choice, turns a
lone surrogate escape into "?" where json refuses it: a hostile text would pass altered.)
Within ``GLEANER_MAX_FILE_BYTES`` still: a file's size is checked first and the bytes read
are counted (a file may grow, a zip may lie).
"""

from __future__ import annotations

import codecs
import itertools
import json
import os
import zipfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, BinaryIO

from gleaner.harvest.errors import TranscriptFormatError
from gleaner.harvest.readers._common import json_problem, too_deep
from gleaner.harvest.readers.files import (
    DAMAGED,
    EXPORT_MEMBER,
    check_entries,
    export_member_info,
    is_zip,
    not_a_transcript,
)
from gleaner.harvest.transcript import Limits, too_large

# Bytes read at a time (ijson's own default buffer).
PIECE = 64 * 1024
_BOM = b"\xef\xbb\xbf"
_SPACE = b" \t\r\n"


class _Counted:
    """A binary stream that refuses (``too_large``) to hand over more than ``limit`` bytes,
    with some bytes already read put back in front."""

    def __init__(self, raw: IO[bytes], limit: int, what: str, front: bytes = b"") -> None:
        self.raw, self.limit, self.what, self.front = raw, limit, what, front
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        if size == 0:  # ijson asks read(0) to tell bytes from text
            return b""
        if self.front:
            piece, self.front = self.front, b""
        else:
            piece = self.raw.read(PIECE if size is None or size < 0 else size)
            self.count += len(piece)
        if self.count > self.limit:
            raise too_large(
                self.what, f"more than {self.limit:,} bytes", self.limit, "GLEANER_MAX_FILE_BYTES"
            )
        return piece


@contextmanager
def _document(path: Path, limits: Limits) -> Iterator[tuple[IO[bytes], str]]:
    """The file's bytes, or those of the export zip's conversations.json, as a stream (and
    how the limit names it). Raises TranscriptFormatError (too_large), OSError or zipfile's
    errors, which the caller answers by reading the file the usual way (whose errors say
    what is wrong)."""
    with ExitStack() as stack:
        fp: BinaryIO = stack.enter_context(path.open("rb"))
        if path.suffix.lower() == ".zip" or is_zip(path):
            check_entries(fp, path, limits)
            archive = stack.enter_context(zipfile.ZipFile(fp))
            member = export_member_info(archive, path, limits)
            what = f"{path}: the archive's {EXPORT_MEMBER}"
            yield stack.enter_context(archive.open(member)), what
            return
        size = os.fstat(fp.fileno()).st_size
        if size > limits.file_bytes:
            raise too_large(
                f"{path}: file", f"{size:,} bytes", limits.file_bytes, "GLEANER_MAX_FILE_BYTES"
            )
        yield fp, f"{path}: file"


def _starts_an_array(stream: _Counted) -> bool:
    """Whether the document's first character (after a BOM and white space) is ``[``; the
    bytes read to tell are put back, from that character on."""
    head = b""
    while piece := stream.read(PIECE):
        head += piece
        if head.removeprefix(_BOM).lstrip(_SPACE):
            break
    text = head.removeprefix(_BOM).lstrip(_SPACE)
    stream.front = text
    return text[:1] == b"["


@contextmanager
def array_elements(path: Path, limits: Limits) -> Iterator[Iterator[object] | None]:
    """The elements of the JSON array the file (or the export zip's conversations.json)
    holds, parsed one at a time; None when the document is not a JSON array or cannot be
    opened this way (then it is read whole, which says what is wrong with it).

    Iterating raises TranscriptFormatError naming the file when the bytes stop being JSON
    or UTF-8, the archive is damaged, or the bytes grow past ``limits.file_bytes``
    (``too_large``); ``too_deep`` for an element nested deeper than Python parses.
    """
    with ExitStack() as stack:
        try:
            raw, what = stack.enter_context(_document(path, limits))
        except (TranscriptFormatError, OSError, NotImplementedError, RuntimeError, *DAMAGED):
            yield None
            return
        stream = _Counted(raw, limits.file_bytes, what)
        try:
            is_array = _starts_an_array(stream)
        except (OSError, NotImplementedError, RuntimeError, *DAMAGED):
            is_array = False
        if not is_array:
            yield None
            return
        yield _elements_of(stream, path, zipped=what.endswith(EXPORT_MEMBER))


def _elements_of(stream: _Counted, path: Path, *, zipped: bool) -> Iterator[object]:
    """The array's elements, each failure to read one raised as the TranscriptFormatError
    naming ``path`` that ``array_elements`` promises."""
    try:
        yield from _elements(stream)
    except _ReadFailed as exc:
        if zipped or not isinstance(exc.__cause__, OSError):
            raise not_a_transcript(path, "a damaged zip archive") from None
        raise TranscriptFormatError(
            f"{path}: cannot be read ({exc.__cause__.strerror or exc.__cause__})",
            reason="unreadable",
        ) from None
    except RecursionError:
        raise too_deep(f"{path}: ") from None
    except UnicodeDecodeError:
        raise not_a_transcript(path, "not UTF-8 text") from None
    except _NotJSON as exc:
        raise not_a_transcript(path, f"not JSON: {exc}") from None
    except ValueError as exc:  # JSONDecodeError, or an integer over the digit limit
        raise not_a_transcript(path, f"not JSON: {json_problem(exc)}") from None


class _NotJSON(ValueError):
    """Raised when the array's punctuation between elements is wrong."""


class _ReadFailed(Exception):
    """Raised when the bytes could not be read (the disk, a damaged archive); the cause
    says why."""


_DECODER = json.JSONDecoder()
_WHITE = " \t\r\n"


class _Text:
    """The text of a stream decoded as UTF-8, held from the element being decoded on."""

    def __init__(self, stream: _Counted) -> None:
        self.stream = stream
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.text, self.pos, self.ended = "", 0, False

    def more(self, at_least: int) -> bool:
        """Drop what was decoded and read at least ``at_least`` bytes more (all that is left
        near the end); False when everything was read already."""
        if self.ended:
            return False
        self.text, self.pos = self.text[self.pos :], 0
        wanted, got = max(at_least, PIECE), 0
        while got < wanted:
            try:
                piece = self.stream.read(wanted - got)
            except TranscriptFormatError:
                raise
            except (*DAMAGED, OSError, RuntimeError, NotImplementedError) as exc:
                raise _ReadFailed from exc
            if not piece:
                self.ended = True
                self.text += self.decoder.decode(b"", final=True)
                break
            got += len(piece)
            self.text += self.decoder.decode(piece)
        return True

    def next_char(self) -> str:
        """The next character that is not white space (the position moves to it); ``""``
        at the end."""
        while True:
            while self.pos < len(self.text) and self.text[self.pos] in _WHITE:
                self.pos += 1
            if self.pos < len(self.text):
                return self.text[self.pos]
            if not self.more(PIECE):
                return ""

    def value(self) -> object:
        """Decode the JSON value at the position and move past it. A value cut by the end
        of what was read is decoded again once as much again was read, so a value costs a
        bounded number of passes over it; an error stands once everything was read."""
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, self.pos)
            except json.JSONDecodeError:
                if not self.more(len(self.text) - self.pos):
                    raise
                continue
            if end == len(self.text) and self.more(PIECE):
                continue  # a number may go on past what was read
            self.pos = end
            return value


def _elements(stream: _Counted) -> Iterator[object]:
    """Each element of the JSON array whose ``[`` starts ``stream``, decoded by the json
    module's own decoder (``raw_decode``: the same values and refusals as ``json.loads``)."""
    text = _Text(stream)
    text.more(PIECE)
    text.pos = 1  # past the "["
    char = text.next_char()
    while char not in ("]", ""):
        yield text.value()
        char = text.next_char()
        if char == ",":
            text.pos += 1
            char = text.next_char()
            if char in ("]", ""):
                raise _NotJSON("a list element is missing after a comma")
        elif char != "]":
            raise _NotJSON("expected ',' or ']' between the list's elements")
    if char == "":
        raise _NotJSON("the list is not closed")
    text.pos += 1
    if text.next_char():
        raise _NotJSON("extra data after the list")


@contextmanager
def json_lines(path: Path, limits: Limits) -> Iterator[Iterator[str] | None]:
    """The lines of a JSON Lines file, read one at a time (split at "\\n" only, a trailing
    "\\r" dropped, as ``split_lines``); None when the file is a coding agent's session (one
    conversation, read whole), a zip, or cannot be opened this way (then it is read whole,
    which says what is wrong with it).

    Iterating raises TranscriptFormatError naming the file when a line is not UTF-8 or the
    bytes grow past ``limits.file_bytes`` (``too_large``).
    """
    from gleaner.harvest.readers.sessions import SNIFF_LINES, session_kind

    with ExitStack() as stack:
        try:
            raw, what = stack.enter_context(_document(path, limits))
        except (TranscriptFormatError, OSError, NotImplementedError, RuntimeError, *DAMAGED):
            yield None
            return
        if what.endswith(EXPORT_MEMBER):
            yield None
            return
        counted = _Counted(raw, limits.file_bytes, what)

        def decoded() -> Iterator[str]:
            first = True
            for line in _raw_lines(counted):
                try:
                    text = line.decode("utf-8-sig" if first else "utf-8")
                except UnicodeDecodeError:
                    raise not_a_transcript(path, "not UTF-8 text") from None
                first = False
                yield text.removesuffix("\n").removesuffix("\r")

        lines = decoded()
        head: list[str] = []
        for line in lines:
            head.append(line)
            if sum(1 for h in head if h.strip()) >= SNIFF_LINES:
                break
        if session_kind("\n".join(head)) is not None:
            yield None
            return
        yield itertools.chain(head, lines)


def _raw_lines(stream: _Counted) -> Iterator[bytes]:
    """The stream's lines as bytes, each with its "\\n" (the last may have none). A long
    line is gathered in pieces and searched once (only each new piece is searched)."""
    pieces: list[bytes] = []
    while piece := stream.read(PIECE):
        start = 0
        while (end := piece.find(b"\n", start)) >= 0:
            pieces.append(piece[start : end + 1])
            yield b"".join(pieces)
            pieces = []
            start = end + 1
        if start < len(piece):
            pieces.append(piece[start:])
    if pieces:
        yield b"".join(pieces)
