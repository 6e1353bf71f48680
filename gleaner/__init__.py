"""Gleaner's public Python API: hand over finished conversations, read the notes back.

from gleaner import Gleaner

g = Gleaner()                                   # GLEANER_* settings, or Gleaner(url)
job_id = g.submit(conversation, owner="alice")  # queued, or harvested in process
g.job(job_id).state                             # pending, running, done, failed
g.search("alice", "editor"), g.note("alice", slug), g.index_text("alice")
g.forget("alice")

Everything Gleaner installs lives under this package, so none of its parts can collide with
a platform's own top-level modules: ``gleaner.store`` (the only code that touches the
database), ``gleaner.harvest`` (transcript to notes), ``gleaner.workers`` (Celery),
``gleaner.service`` (HTTP and MCP), ``gleaner.cli`` (the ``gleaner`` command),
``gleaner.privacy`` (redaction), ``gleaner.config`` (the settings, declared per layer and
composed) and ``gleaner.beat_schedule``.
"""

from typing import TYPE_CHECKING

# The API's names are imported when first asked for (PEP 562): `gleaner search` imports
# ``cli``, which runs this file first, and must not pay for the client's imports.
_LAZY = {
    "Gleaner": "gleaner.client",
    "NoteDetail": "gleaner.client",
    "Conversation": "gleaner.conversation",
    "GleanerError": "gleaner.errors",
    "InvalidRequest": "gleaner.errors",
    "NotFound": "gleaner.errors",
    "TooLarge": "gleaner.errors",
    "Unavailable": "gleaner.errors",
    "Note": "gleaner.store",
    "NoteVersion": "gleaner.store",
    "SaveResult": "gleaner.store",
    "SearchHit": "gleaner.store",
    "Settings": "gleaner.store",
    "load_settings": "gleaner.store",
    "JobStatus": "gleaner.store.jobs.status",
    "ApiKey": "gleaner.store.keys",
}

if TYPE_CHECKING:
    from gleaner.client import Gleaner, NoteDetail
    from gleaner.conversation import Conversation
    from gleaner.errors import GleanerError, InvalidRequest, NotFound, TooLarge, Unavailable
    from gleaner.store import Note, NoteVersion, SaveResult, SearchHit, Settings, load_settings
    from gleaner.store.jobs.status import JobStatus
    from gleaner.store.keys import ApiKey
else:

    def __getattr__(name: str) -> object:
        # Any other name is an AttributeError, so `from gleaner import store` goes on to import
        # the sub-package as usual. (Hidden from mypy, which reads the imports above.)
        home = _LAZY.get(name)
        if home is None:
            raise AttributeError(f"module 'gleaner' has no attribute {name!r}")
        from importlib import import_module

        value = getattr(import_module(home), name)
        globals()[name] = value
        return value


__all__ = [
    "ApiKey",
    "Conversation",
    "Gleaner",
    "GleanerError",
    "InvalidRequest",
    "JobStatus",
    "NotFound",
    "Note",
    "NoteDetail",
    "NoteVersion",
    "SaveResult",
    "SearchHit",
    "Settings",
    "TooLarge",
    "Unavailable",
    "load_settings",
]
