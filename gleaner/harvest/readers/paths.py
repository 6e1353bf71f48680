"""Which files to read: each file as given, a folder's conversation files."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from gleaner.harvest.readers.files import EXPORT_MEMBER

SUFFIXES = frozenset({".json", ".jsonl", ".zip"})
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
