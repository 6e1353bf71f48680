"""Gleaner's note store: the only code that touches the database.

The public surface, for a platform: what this package exports (``Store``, its schemas,
errors and settings, the text helpers).

The pipeline's seam, for ``harvest``, ``workers``, ``gleaner`` and ``bench`` (functions that
take the caller's session, so a harvest writes notes, ledger and job outcome in one
transaction; those a step of single statements runs take an ``Executor``, a session or the
Core connection of ``Store.statements``; the reads of ``recall.search`` and ``recall.index``
take a Core connection, a session's being ``session.connection()``, and ``jobs.reports``
either), by sub-package:

- ``notes``: ``notes.notes`` (write, write_batch), ``notes.similar`` and ``notes.keyed``
  (near-duplicates, topic keys, the notes a harvest shows its model), ``notes.judge`` (the
  same fact), ``notes.terms``, ``notes.links``, ``notes.history``, ``notes.instructions``;
- ``recall``: ``recall.search``, ``recall.search_terms`` (the search tokenizer),
  ``recall.vectors`` (note vectors), ``recall.index`` (the index text),
  ``recall.freshness``;
- ``jobs``: ``jobs.queue`` (claim, finish, fail), ``jobs.leases``, ``jobs.reports``,
  ``jobs.status``, ``jobs.ledger``, ``jobs.spend``;
- ``housekeeping``: ``housekeeping.decay``, ``housekeeping.dedupe``;
- ``owners``: ``owners.export``, ``owners.restore``, ``owners.forget``;
- and ``keys``, ``text``, ``schemas``, ``errors``, ``settings`` and ``db`` (migrations and
  revisions) at the top.

Everything else is internal and may change without notice: the one writer
(``notes.writer``, ``notes.write_plan``, ``notes.write_item``, ``notes.write_lookup``,
``notes.term_index``, ``recall.search_index``, ``notes.drafts``), the whole ``schema``
package (models, records, tables, dialect SQL), advisory locks (``jobs.locks``, reached
through ``Store.transcript_lock``, whose ``TranscriptLock`` is exported here),
superseding, dedupe's parts, forgetting one conversation (reached through
``Store.forget_conversation``), ``notes.mem``, ``notes.tending``, ``api`` and ``sessions``
(``Store`` is exported here), ``migrations``, and the pieces public modules are split into
and re-export. The settings are declared in ``gleaner.config`` (the store's own part is
``StoreSettings``, which every store module but ``sessions`` is typed against).
``tests/test_layout.py`` (``STORE_INTERNAL``) holds every package to this and to the
direction ``workers -> harvest -> store``.
"""

from typing import TYPE_CHECKING

from gleaner.privacy import strip_private
from gleaner.store.errors import (
    ConfigError,
    DataRefused,
    InvalidInput,
    LinkRefused,
    NotFound,
    StorageFailure,
    StoreError,
    format_error,
)
from gleaner.store.text import normalize_topics, slugify, snippet, topics

# The rest is imported from its module when first asked for (PEP 562): importing one module
# of the store (`gleaner search` imports ``store.recall.search``) does not pay for them all, and
# ``Store`` alone costs the ORM.
_LAZY = {
    "Store": "gleaner.store.api",
    **dict.fromkeys(
        (
            "LinkResult",
            "Note",
            "NoteVersion",
            "NoteWithLinks",
            "SaveResult",
            "Scope",
            "SearchHit",
            "Similar",
            "WriteResult",
        ),
        "gleaner.store.schemas",
    ),
    "Settings": "gleaner.config",
    "load_settings": "gleaner.store.settings",
    "Executor": "gleaner.store.schema.sql",
    "TranscriptLock": "gleaner.store.jobs.locks",
}

if TYPE_CHECKING:
    from gleaner.config import Settings
    from gleaner.store.api import Store
    from gleaner.store.jobs.locks import TranscriptLock
    from gleaner.store.schema.sql import Executor
    from gleaner.store.schemas import (
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
    from gleaner.store.settings import load_settings
else:

    def __getattr__(name: str) -> object:
        # Any other name is an AttributeError, so `from gleaner.store import notes` goes on to
        # import the submodule as usual. (Hidden from mypy, which reads the imports above.)
        home = _LAZY.get(name)
        if home is None:
            raise AttributeError(f"module 'gleaner.store' has no attribute {name!r}")
        from importlib import import_module

        value = getattr(import_module(home), name)
        globals()[name] = value
        return value


__all__ = [
    "ConfigError",
    "DataRefused",
    "Executor",
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
    "TranscriptLock",
    "WriteResult",
    "format_error",
    "load_settings",
    "normalize_topics",
    "slugify",
    "snippet",
    "strip_private",
    "topics",
]
