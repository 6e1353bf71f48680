"""Transcript readers: detect a file's format and read every conversation in it.

Formats: native JSON (one object or a list), JSON Lines of native objects, OpenAI-style
``{"messages": [...]}``, and the ChatGPT and Claude data exports (``conversations.json`` or
the export ``.zip``).
"""

from __future__ import annotations

from harvest.readers.load import (
    EXPECTED,
    SUFFIXES,
    ReadResult,
    iter_paths,
    kind_of,
    read_bytes,
    read_path,
)

__all__ = ["EXPECTED", "SUFFIXES", "ReadResult", "iter_paths", "kind_of", "read_bytes", "read_path"]
