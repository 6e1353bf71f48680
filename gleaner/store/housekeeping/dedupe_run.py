"""A dedupe run's vocabulary: the named steps a test can stop it at, a scope's scanned term
sets, and what the run reports (``DedupeResult``, ``DuplicatePair``). ``store.housekeeping.dedupe``
re-exports the public names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import Field

from gleaner.store.schemas import Frozen, Scope

# The named points of a run, in order: ``dedupe(on_step=...)`` is called with each as it is
# reached, so a test can stop a run there and change the store under it.
#
# The run holds its lock (PostgreSQL's advisory lock, SQLite's write transaction) and has
# read its watermark.
LOCKED = "locked"
# A scope's live notes are read and not yet paired (once a scope).
SCOPE_READ = "scope_read"
# The details of notes with a near-duplicate are read; their pairs are not yet checked
# against the notes as they are now, nor written.
DETAILS_READ = "details_read"
STEPS = (LOCKED, SCOPE_READ, DETAILS_READ)
Step = Callable[[str], None]


class DuplicatePair(Frozen):
    """``loser`` is (with ``dry_run``: would be) superseded by ``keeper``, Jaccard ``score``."""

    scope: Scope
    keeper: str
    loser: str
    score: float


class DedupeResult(Frozen):
    """What a dedupe run found and did; ``locked``: another run held the lock, nothing done."""

    dry_run: bool
    locked: bool = False
    scopes_scanned: int = 0
    notes_scanned: int = 0  # live notes loaded from the scanned scopes
    notes_changed: int = 0  # of those, changed since the watermark
    candidates_checked: int = 0  # pairs of distinct term sets scored exactly
    superseded: int = 0  # with dry_run: would be
    skipped: int = 0  # pairs left because a note changed during the run (tried again next run)
    # PostgreSQL: writers still running when the run stopped waiting for them; their notes
    # may hold an updated_seq below the highest seen, so the watermark stays (looked at again).
    in_flight: int = 0
    pairs: list[DuplicatePair] = Field(default_factory=list)  # the first MAX_REPORTED_PAIRS
    since_seq: int = 0  # the watermark the run started from
    watermark: int = 0  # the watermark it left
    seconds: float = 0.0


@dataclass(frozen=True)
class Scan:
    """A scope's live notes, by position: ids, ``updated_seq`` and term sets."""

    ids: list[int]
    seqs: list[int]
    terms: list[frozenset[str]]
