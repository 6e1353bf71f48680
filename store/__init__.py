"""Gleaner's note store: the only code that touches the database."""

from store.api import Store
from store.errors import (
    ConfigError,
    InvalidInput,
    LinkRefused,
    NotFound,
    StorageFailure,
    StoreError,
    format_error,
)
from store.schemas import (
    LinkResult,
    Note,
    NoteVersion,
    NoteWithLinks,
    SaveResult,
    Scope,
    SearchHit,
    Similar,
    WriteResult,
)
from store.settings import Settings, load_settings
from store.text import normalize_topics, slugify, snippet, strip_private, topics

__all__ = [
    "ConfigError",
    "InvalidInput",
    "LinkRefused",
    "LinkResult",
    "NotFound",
    "Note",
    "NoteVersion",
    "NoteWithLinks",
    "SaveResult",
    "Scope",
    "SearchHit",
    "Settings",
    "Similar",
    "StorageFailure",
    "Store",
    "StoreError",
    "WriteResult",
    "format_error",
    "load_settings",
    "normalize_topics",
    "slugify",
    "snippet",
    "strip_private",
    "topics",
]
