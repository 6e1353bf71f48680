"""Transcript readers: detect a file's format and read every conversation in it.

Formats: native JSON (one object or a list), JSON Lines of native objects, OpenAI-style
``{"messages": [...]}``, the ChatGPT and Claude data exports (``conversations.json`` or the
export ``.zip``), Claude Code session files and Codex CLI rollouts; ``-`` is standard input.
"""

from __future__ import annotations

from gleaner.harvest.readers.files import EXPECTED, STDIN
from gleaner.harvest.readers.load import iter_path, kind_of, read_bytes, read_path
from gleaner.harvest.readers.paths import SUFFIXES, iter_paths
from gleaner.harvest.readers.results import Read, ReadResult

__all__ = [
    "EXPECTED",
    "STDIN",
    "SUFFIXES",
    "Read",
    "ReadResult",
    "iter_path",
    "iter_paths",
    "kind_of",
    "read_bytes",
    "read_path",
]
