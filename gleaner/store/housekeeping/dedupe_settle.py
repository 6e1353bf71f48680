"""Settling a dedupe run's pairs: each scope's keepers planned against its notes as they are
now, and the supersedes written in batches (on PostgreSQL on a thread, while later scopes
are read)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gleaner.store.housekeeping.dedupe_run import DETAILS_READ, DuplicatePair, Scan, Step
from gleaner.store.housekeeping.keepers import KeeperRow, choose_keepers
from gleaner.store.housekeeping.state import MAX_REPORTED_PAIRS
from gleaner.store.notes.overlap import Candidates
from gleaner.store.notes.supersede import lock_scopes
from gleaner.store.notes.supersede import write as write_supersedes
from gleaner.store.notes.terms import FactText
from gleaner.store.schema.models import Memory
from gleaner.store.schema.sql import dialect_name, one_of
from gleaner.store.schema.tables import LIVE
from gleaner.store.schemas import Scope

# The run's own logger: its warnings read as the dedupe's.
log = logging.getLogger("gleaner.store.housekeeping.dedupe")

# Planned pairs written per set of statements (and kept in memory until then).
SUPERSEDE_BATCH = 2_000


_DETAILS = select(
    Memory.id,
    Memory.slug,
    Memory.pinned,
    Memory.updated_at,
    Memory.confidence,
    Memory.title,
    Memory.body,
    Memory.topics,
    Memory.topic_key.is_not(None),
    Memory.provenance == "user",
).where(one_of(Memory.id, "ids"))


# A planned ``keeper supersedes loser`` pair, with its scope and score.
Pair = tuple[Scope, KeeperRow, KeeperRow, float]


@dataclass(frozen=True)
class Found:
    """A scope's duplicate edges, waiting for its notes' details: ``(id, seq)`` by position
    for every note with an edge."""

    scope: Scope
    candidates: Candidates
    notes: dict[int, tuple[int, int]]


def found_in(scope: Scope, scan: Scan, found: Candidates) -> Found:
    positions = {p for g in found.edges for p in found.groups[g]}
    return Found(scope, found, {p: (scan.ids[p], scan.seqs[p]) for p in sorted(positions)})


def _plan_pairs(session: Session, waiting: Sequence[Found], id_chunk: int) -> list[Pair]:
    """Read the details of every waiting scope's notes (``id_chunk`` ids per statement) and
    pair each duplicate with its keeper. A note deleted since its scope was read is left out."""
    ids = sorted(note_id for found in waiting for note_id, _ in found.notes.values())
    details: dict[int, tuple[str, bool, datetime, float | None, FactText, bool, bool]] = {}
    for start in range(0, len(ids), id_chunk):
        result = session.connection().execute(_DETAILS, {"ids": ids[start : start + id_chunk]})
        details.update(
            {
                row[0]: (
                    row[1],
                    bool(row[2]),
                    row[3],
                    row[4],
                    FactText(row[5], row[6], row[7]),
                    bool(row[8]),
                    bool(row[9]),
                )
                for row in result
            }
        )
    pairs: list[Pair] = []
    for found in waiting:
        rows = {
            p: KeeperRow(note_id, *details[note_id], seq=seq)
            for p, (note_id, seq) in found.notes.items()
            if note_id in details
        }
        pairs.extend(
            (found.scope, rows[keep], rows[lose], score)
            for keep, lose, score in choose_keepers(rows, found.candidates)
        )
    return pairs


def _supersede(session: Session, plan: Sequence[Pair], id_chunk: int) -> list[Pair]:
    """Write the planned ``keeper supersedes loser`` pairs in bulk; return those written.

    ``store.notes.links.link``'s rules hold because a pair is written only when both notes are as
    loaded (same ``updated_seq``, live, no superseder): the keeper then heads no chain, so no
    cycle can form, and the loser gets its first and only superseder. The scopes' supersede
    locks are taken first and, on PostgreSQL, the rows are locked before the check.
    """
    lock_scopes(session, {scope for scope, *_ in plan})
    postgres = dialect_name(session) == "postgresql"
    loaded = {row.id: row.seq for _, keeper, loser, _ in plan for row in (keeper, loser)}
    ids = sorted(loaded)
    current: set[int] = set()
    for start in range(0, len(ids), id_chunk):
        stmt = (
            select(Memory.id, Memory.updated_seq)
            .where(
                Memory.id.in_(ids[start : start + id_chunk]),
                Memory.status == LIVE,
                Memory.superseded_by_id.is_(None),
            )
            .order_by(Memory.id)
        )
        if postgres:
            stmt = stmt.with_for_update()
        current.update(note_id for note_id, seq in session.execute(stmt) if seq == loaded[note_id])
    done = [pair for pair in plan if pair[1].id in current and pair[2].id in current]
    write_supersedes(session, [(keeper.id, loser.id) for _, keeper, loser, _ in done])
    return done


class Settler:
    """Turns found duplicates into superseded notes: reads their notes' details, pairs each
    duplicate with its keeper and writes the pairs, many scopes per statement.

    With ``apart`` (the scan reads on a connection of its own), this happens on a thread of
    its own, so the session's statements run while the next scopes are scanned; the session
    is then used by that thread alone until :meth:`finish` has returned. Details are read
    once ``id_chunk`` notes wait, and pairs written once ``batch`` are planned.
    """

    def __init__(
        self,
        session: Session,
        *,
        dry_run: bool,
        apart: bool,
        batch: int,
        id_chunk: int,
        on_step: Step,
    ) -> None:
        self.session = session
        self.dry_run = dry_run
        self.batch = batch
        self.id_chunk = id_chunk
        self.on_step = on_step
        self.superseded = self.skipped = 0
        self.reported: list[DuplicatePair] = []
        self._plan: list[Pair] = []
        self._waiting: list[Found] = []  # scopes whose notes' details are not read yet
        self._noted = 0
        self._thread = ThreadPoolExecutor(1) if apart else None
        self._running: list[Future[None]] = []
        self._failed = False

    def add(self, found: Found) -> None:
        self._waiting.append(found)
        self._noted += len(found.notes)
        if self._noted >= self.id_chunk:
            self._run(self._waiting, last=False)
            self._waiting, self._noted = [], 0

    def finish(self) -> None:
        self._run(self._waiting, last=True)
        for future in self._running:
            future.result()  # a failed write raises here

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True)  # nothing touches the session after this

    def _run(self, batch: list[Found], *, last: bool) -> None:
        if self._thread is None:
            self._settle(batch, last=last)
            return
        for future in self._running:
            if future.done():
                future.result()  # stop at the first failed write, not at the end
        self._running = [f for f in self._running if not f.done()]
        self._running.append(self._thread.submit(self._settle, batch, last=last))

    def _settle(self, batch: list[Found], *, last: bool) -> None:
        if self._failed:
            return  # queued behind a failed write: the run is over
        try:
            self._plan.extend(_plan_pairs(self.session, batch, self.id_chunk))
            self.on_step(DETAILS_READ)
            if last or len(self._plan) >= self.batch:  # many scopes' pairs per statement
                self._write()
        except BaseException:
            self._failed = True
            raise

    def _write(self) -> None:
        plan = self._plan
        applied = (
            plan if self.dry_run or not plan else _supersede(self.session, plan, self.id_chunk)
        )
        if len(applied) < len(plan):
            log.warning(
                "dedupe skipped %d pair(s): notes changed during the run; the next run looks again",
                len(plan) - len(applied),
            )
            self.skipped += len(plan) - len(applied)
        self.superseded += len(applied)
        room = MAX_REPORTED_PAIRS - len(self.reported)
        self.reported.extend(
            DuplicatePair(scope=scope, keeper=keeper.slug, loser=loser.slug, score=score)
            for scope, keeper, loser, score in applied[:room]
        )
        self._plan = []
