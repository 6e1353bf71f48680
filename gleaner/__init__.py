"""Gleaner's public Python API: hand over finished conversations, read the notes back.

from gleaner import Gleaner

g = Gleaner()                                   # GLEANER_* settings, or Gleaner(url)
job_id = g.submit(conversation, owner="alice")  # queued, or harvested in process
g.job(job_id).state                             # pending, running, done, failed
g.search("alice", "editor"), g.note("alice", slug), g.index_text("alice")
g.forget("alice")
"""

from gleaner.client import Gleaner, NoteDetail
from gleaner.conversation import Conversation
from gleaner.errors import GleanerError, InvalidRequest, NotFound, TooLarge, Unavailable
from store import Note, NoteVersion, SaveResult, SearchHit, Settings, load_settings
from store.jobs.status import JobStatus
from store.keys import ApiKey

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
