"""Gleaner's note store: the only code that touches the database.

The public surface, for a platform: what this package exports (``Store``, its schemas,
errors and settings, the text helpers).

The pipeline's seam, for ``harvest``, ``workers``, ``gleaner`` and ``bench`` (functions that
take the caller's session, so a harvest writes notes, ledger and job outcome in one
transaction; those a step of single statements runs take an ``Executor``, a session or the
Core connection of ``Store.statements``; the reads of ``search`` and ``index`` take a Core
connection, a session's being ``session.connection()``, and ``job_reports`` either):
``notes`` (write, write_batch), ``similar`` and ``keyed`` (near-duplicates, topic keys,
the notes a harvest shows its model), ``judge`` (the same fact), ``search_terms`` (the
search tokenizer), ``vectors`` (note vectors: pending, save, nearest, usage),
``ledger``, ``forget``, ``jobs``, ``job_leases``, ``job_reports``, ``job_status``, ``keys``,
``links``, ``history``, ``index``, ``instructions`` (notes that read as instructions to the
assistant), ``search``, ``decay``, ``export`` and ``restore`` (an
owner's JSON Lines export and loading it back), ``terms``, ``text``, ``schemas``,
``errors``, ``settings`` and ``db`` (migrations and revisions).

Everything else is internal and may change without notice: the one writer (``writer``,
``write_plan``, ``write_item``, ``write_lookup``, ``term_index``, ``search_index``,
``drafts``), dialect SQL (``sql``),
advisory locks (``locks``, reached through ``Store.transcript_lock``, whose ``TranscriptLock`` is
exported here), superseding (``supersede``), dedupe and its join (``dedupe``, ``overlap``,
``housekeeping``), forgetting one conversation (``forget_conversation``, reached through
``Store.forget_conversation``), ``mem``, ``tending``, ``api`` (``Store`` is exported here),
``models`` (with ``orm_base`` and ``records``), ``tables`` (the Core tables the read
commands use), ``migrations``, and the pieces public modules are split into and re-export:
``sessions`` (``Store``'s transactions), ``config`` and ``config_embed`` (the ``Settings``
model), ``job_intake``, ``fact_terms``, ``term_lookup``, ``search_sql``, ``fusion``,
``dedupe_run``, ``dedupe_settle``, ``keepers``, ``export_records`` and ``restore_check``.
``tests/test_layout.py`` holds every package to this and to the direction
``workers -> harvest -> store``.
"""

from typing import TYPE_CHECKING

from privacy import strip_private
from store.errors import (
    ConfigError,
    DataRefused,
    InvalidInput,
    LinkRefused,
    NotFound,
    StorageFailure,
    StoreError,
    format_error,
)
from store.text import normalize_topics, slugify, snippet, topics

# The rest is imported from its module when first asked for (PEP 562): importing one module
# of the store (`gleaner search` imports ``store.search``) does not pay for them all, and
# ``Store`` alone costs the ORM.
_LAZY = {
    "Store": "store.api",
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
        "store.schemas",
    ),
    "Settings": "store.config",
    "load_settings": "store.settings",
    "Executor": "store.sql",
    "TranscriptLock": "store.locks",
}

if TYPE_CHECKING:
    from store.api import Store
    from store.config import Settings
    from store.locks import TranscriptLock
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
    from store.settings import load_settings
    from store.sql import Executor
else:

    def __getattr__(name: str) -> object:
        # Any other name is an AttributeError, so `from store import notes` goes on to
        # import the submodule as usual. (Hidden from mypy, which reads the imports above.)
        home = _LAZY.get(name)
        if home is None:
            raise AttributeError(f"module 'store' has no attribute {name!r}")
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
