"""What the note writer takes and gives: an ``Item`` to write (with the ``Expect`` a harvest
checks), and what became of it (``Written``). Shared by ``store.notes.writer``, its planner
(``store.notes.write_plan``) and its lookups (``store.notes.write_lookup``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gleaner.store.notes.drafts import Draft
from gleaner.store.schema.models import Memory

Outcome = Literal["created", "updated", "deduped"]


@dataclass(frozen=True)
class Expect:
    """What a harvest decided from a read without a lock, checked against the stored note
    once its row is locked, before anything is written over it: the note is neither pinned
    nor person-written (``user``) nor superseded, and with ``text`` it is live and holds that
    ``(title, body, topics)``. A note found otherwise raises ``NoteChanged``; a note gone
    since is written anew only when no ``text`` was expected."""

    text: tuple[str, str, str] | None = None


@dataclass(frozen=True)
class Item:
    """One validated note to write, with what the caller adds to its attrs."""

    draft: Draft
    provenance: str
    note_type: str | None = None
    topic_key: str | None = None
    # Why an update replaces a note's text (history); default slug_upsert / topic_key_upsert.
    reason: str | None = None
    # A harvest's rewrite of a note it read unlocked: what it assumed of that note.
    expect: Expect | None = None


@dataclass(frozen=True)
class Written:
    """What became of one item: its note's id and slug, and whether it was created."""

    outcome: Outcome
    id: int
    slug: str
    # The row as written, when the caller asked for rows (a detached ``Memory``).
    row: Memory | None = None
