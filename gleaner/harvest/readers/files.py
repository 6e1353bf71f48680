"""Bytes in, within the limits: a file, the conversations.json of an export .zip, or
standard input, each refused (``too_large``) before or while it grows past
``GLEANER_MAX_FILE_BYTES`` (a zip's declared sizes can lie), and decoded as UTF-8."""

from __future__ import annotations

import errno
import io
import lzma
import os
import struct
import sys
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from gleaner.harvest.errors import TranscriptFormatError
from gleaner.harvest.transcript import Limits, too_large

EXPORT_MEMBER = "conversations.json"
EXPECTED = (
    "expected one of: native JSON {conversation_id, owner | scope, messages}, "
    "JSON Lines of native objects, an OpenAI-style {messages: [...]}, "
    "a ChatGPT or Claude export conversations.json, or the export .zip holding it, "
    "a Claude Code session file or a Codex CLI rollout file"
)
# The path that names standard input (``gleaner harvest -``), and how it is shown.
STDIN = "-"
STDIN_NAME = "<stdin>"
# A zip member is inflated this many bytes at a time, so memory stays bounded by the limit
# whatever the member declares.
_INFLATE_PIECE = 1 << 20
# What zipfile (and the decompressors under it) raise on a damaged archive, besides
# BadZipFile: a central directory pointing before the file's start (ValueError: negative
# seek), a member name that is not the UTF-8 its flag says (UnicodeDecodeError, a
# ValueError), a header or extra field cut short (IndexError, struct.error), a zip64 offset
# past what a seek takes (OverflowError), a damaged stream (zlib.error, lzma.LZMAError,
# EOFError; bz2 raises OSError, see read_zip).
DAMAGED = (
    zipfile.BadZipFile,
    ValueError,
    IndexError,
    OverflowError,
    struct.error,
    zlib.error,
    lzma.LZMAError,
    EOFError,
)


def not_a_transcript(path: Path, why: str) -> TranscriptFormatError:
    """The error for a whole file that is no transcript: names the file and what was expected."""
    return TranscriptFormatError(f"{path}: not a transcript file ({why}); {EXPECTED}")


def decode(data: bytes | bytearray, path: Path) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise not_a_transcript(path, "not UTF-8 text") from None


def _declared_entries(fp: BinaryIO) -> int:
    """How many entries the zip's end-of-central-directory record declares (0 when there is
    none: ZipFile then says the archive is damaged)."""
    # zipfile's own reader of that record (zip64 included): private, but in every Python 3.
    record = zipfile._EndRecData(fp)  # type: ignore[attr-defined]
    if not record:
        return 0
    return int(record[zipfile._ECD_ENTRIES_TOTAL])  # type: ignore[attr-defined]


def _inflate(
    archive: zipfile.ZipFile,
    member: zipfile.ZipInfo,
    path: Path,
    limit: int,
    setting: str = "GLEANER_MAX_FILE_BYTES",
) -> bytearray:
    """The member's bytes, inflated a piece at a time and refused past ``limit`` bytes (the
    bound ``setting`` sets)."""
    data = bytearray()
    with archive.open(member) as stream:
        while piece := stream.read(_INFLATE_PIECE):
            data += piece
            if len(data) > limit:
                raise too_large(
                    f"{path}: the archive's {EXPORT_MEMBER}",
                    f"more than {limit:,} bytes inflated",
                    limit,
                    setting,
                )
    return data


def read_zip(path: Path, limits: Limits, data: bytes | None = None) -> str:
    """The text of the export's conversations.json; no other member is read. ``data`` is the
    archive's bytes when it is not read from ``path``.

    Refused (``too_large``) before anything is inflated when the archive declares more than
    ``limits.zip_entries`` entries (its central directory is parsed whole, an object per
    entry, before any member is read; an export holds a few thousand) or the member more
    than ``limits.file_bytes`` bytes, and while inflating once the member grows past that (a
    declared size can lie).
    """
    with path.open("rb") if data is None else io.BytesIO(data) as fp:
        try:
            return _read_export(fp, path, limits)
        except OSError as exc:
            # A seek the damaged directory sends before the file's start (EINVAL), or bz2's
            # "Invalid data stream" (no errno); any other is the disk's, and the file is
            # unreadable, not damaged. Bytes in memory have no disk.
            if data is None and exc.errno not in (None, errno.EINVAL):
                raise
        except DAMAGED:
            pass
    # Not the exception's message: some name members of the archive, which are the file's
    # own text.
    raise not_a_transcript(path, "a damaged zip archive")


def _read_export(fp: BinaryIO, path: Path, limits: Limits) -> str:
    """The text of the export's conversations.json in the open archive ``fp`` (see
    :func:`read_zip`)."""
    try:
        check_entries(fp, path, limits)
        with zipfile.ZipFile(fp) as archive:
            return decode(_export_member(archive, path, limits), path)
    except NotImplementedError:  # a compression method zipfile lacks
        raise not_a_transcript(path, "a zip archive compressed in an unsupported way") from None
    except RuntimeError as exc:
        if isinstance(exc, RecursionError):
            raise
        # zipfile's only RuntimeError: an encrypted member asked for without a password.
        raise not_a_transcript(path, "an encrypted zip archive") from None


def _export_member(archive: zipfile.ZipFile, path: Path, limits: Limits) -> bytearray:
    """The bytes of the archive's conversations.json, inflated within the limit."""
    member = export_member_info(archive, path, limits)
    return _inflate(archive, member, path, limits.file_bytes, limits.file_bytes_setting)


def check_entries(fp: BinaryIO, path: Path, limits: Limits) -> None:
    """Refuse (``too_large``) an archive that declares more than ``limits.zip_entries``
    entries, before zipfile parses its central directory."""
    entries = _declared_entries(fp)
    if entries > limits.zip_entries:
        raise too_large(
            f"{path}: zip archive",
            f"{entries:,} entries",
            limits.zip_entries,
            "GLEANER_MAX_ZIP_ENTRIES",
        )


def export_member_info(archive: zipfile.ZipFile, path: Path, limits: Limits) -> zipfile.ZipInfo:
    """The archive's conversations.json (the shallowest), refused when it declares more than
    ``limits.file_bytes`` bytes."""
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
    if member.file_size > limits.file_bytes:
        raise too_large(
            f"{path}: the archive's {EXPORT_MEMBER}",
            f"{member.file_size:,} bytes declared",
            limits.file_bytes,
            limits.file_bytes_setting,
        )
    return member


def _read_file(path: Path, limits: Limits) -> bytes:
    """The file's bytes, refused (``too_large``) past ``limits.file_bytes`` before reading."""
    limit = limits.file_bytes
    with path.open("rb") as fp:
        size = os.fstat(fp.fileno()).st_size
        # A pipe says 0, and a file may grow while it is read: the read is bounded too.
        data = b"" if size > limit else fp.read(limit + 1)
    if size > limit or len(data) > limit:
        shown = f"{size:,} bytes" if size > limit else f"more than {limit:,} bytes"
        raise too_large(f"{path}: file", shown, limit, "GLEANER_MAX_FILE_BYTES")
    return data


def is_zip(path: Path) -> bool:
    with path.open("rb") as fp:
        return fp.read(4) == b"PK\x03\x04"


def read_text(path: Path, limits: Limits) -> str:
    try:
        if path.suffix.lower() == ".zip" or is_zip(path):
            return read_zip(path, limits)
        return decode(_read_file(path, limits), path)
    except IsADirectoryError:
        raise TranscriptFormatError(
            f"{path}: is a directory, not a transcript file", reason="unreadable"
        ) from None
    except OSError as exc:
        raise TranscriptFormatError(
            f"{path}: cannot be read ({exc.strerror or exc})", reason="unreadable"
        ) from None


def read_stdin(limits: Limits) -> bytes:
    """Standard input's bytes, read up to one past ``limits.file_bytes`` (more is refused)."""
    if sys.stdin is None:
        raise TranscriptFormatError(
            f"{STDIN_NAME}: there is no standard input", reason="unreadable"
        )
    stream = getattr(sys.stdin, "buffer", None)
    try:
        if stream is not None:
            return bytes(stream.read(limits.file_bytes + 1))
        # A text stream (a test's StringIO): the same text, as UTF-8.
        return sys.stdin.read(limits.file_bytes + 1).encode("utf-8", "surrogatepass")
    except OSError as exc:
        raise TranscriptFormatError(
            f"{STDIN_NAME}: cannot be read ({exc.strerror or exc})", reason="unreadable"
        ) from None
