"""Dedupe: near-duplicate live notes superseded by their best keeper, scope by scope.

Per scope, live notes whose title+topic Jaccard score reaches ``duplicate_threshold`` are
found by the prefix-filter join (``store.overlap``), only for notes changed since the last
run's ``updated_seq`` watermark; a pair is superseded only when the two hold the same fact
(``store.terms``: nothing in title or body contradicts). Every pair acted on is scored exactly.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Generator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime

from pydantic import Field
from sqlalchemy import (
    bindparam,
    func,
    or_,
    select,
    text,
)
from sqlalchemy.engine import Connection, Engine, Row
from sqlalchemy.orm import Session

from store.fact_terms import similarity_terms
from store.housekeeping import DEDUPE, MAX_REPORTED_PAIRS, elapsed, lock_key, record, watermark
from store.judge import contradiction
from store.mem import SUMMARY_TYPE
from store.models import Memory
from store.overlap import Candidates, similar_groups
from store.schemas import Frozen, Scope
from store.settings import Settings
from store.sql import ID_CHUNK, dialect_name, one_of
from store.supersede import lock_scopes
from store.supersede import write as write_supersedes
from store.tables import LIVE
from store.terms import FactText, covers

# Dedupe -----------------------------------------------------------------------------------

log = logging.getLogger(__name__)

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


def _no_step(step: str) -> None:
    """The default ``on_step``: nothing."""


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


@dataclass(slots=True)
class _Row:
    """What choosing keepers needs of a note with a near-duplicate (``seq`` as scanned)."""

    id: int
    slug: str
    pinned: bool
    updated_at: datetime
    confidence: float | None
    text: FactText
    keyed: bool  # holds a topic key: saves and harvests upsert through it, so it stays live
    by_person: bool  # ``user`` provenance: what a person wrote is never hidden by a copy
    seq: int

    @property
    def rank(self) -> tuple[bool, bool, bool, datetime, float, int]:
        """Keeper order, best highest: pinned, then person-written, then keyed, then newer,
        then more confident, then higher id."""
        confidence = -1.0 if self.confidence is None else self.confidence
        return (self.pinned, self.by_person, self.keyed, self.updated_at, confidence, self.id)

    @property
    def kept(self) -> bool:
        """Never superseded: pinned, person-written or holding a topic key."""
        return self.pinned or self.by_person or self.keyed


def _choose_keepers(rows: Mapping[int, _Row], found: Candidates) -> list[tuple[int, int, float]]:
    """``(keeper, loser, score)`` positions: each duplicate paired with its best keeper.

    ``rows`` holds the positions that have an edge (one missing, deleted mid-run, is left
    out). Notes are visited best first (``_Row.rank``); one nobody has claimed is a keeper and
    claims every unclaimed, lower-ranked note it is similar to that holds the same fact and
    says nothing the keeper does not (``covers``: superseded, its extra words would drop out
    of search). So a loser's keeper is the best surviving note similar to it (never one it
    only reaches through a third note), pinned, person-written and topic-keyed notes are
    never claimed (``_Row.kept``: a person's text is not hidden by a copy, and a later
    harvest under a key upserts that note), and keepers outrank losers (no cycles).
    """
    group_of = {p: g for g in found.edges for p in found.groups[g] if p in rows}
    involved = sorted(group_of, key=lambda p: rows[p].rank, reverse=True)
    place = {p: n for n, p in enumerate(involved)}
    claimed: set[int] = set()
    # A group a keeper has claimed from holds nothing a later (lower) keeper could claim.
    drained: set[int] = set()
    plan: list[tuple[int, int, float]] = []
    for keeper in involved:
        if keeper in claimed:
            continue
        for group, score in found.edges[group_of[keeper]]:
            if group in drained:
                continue
            contradicted = False
            for loser in found.groups[group]:
                if (
                    loser in place
                    and place[loser] > place[keeper]
                    and not rows[loser].kept
                    and loser not in claimed
                ):
                    # The score says near-duplicate; only the same fact, all of it in the
                    # keeper, is superseded.
                    if contradiction(rows[keeper].text, rows[loser].text) is not None or not (
                        covers(rows[keeper].text, rows[loser].text)
                    ):
                        contradicted = True
                        continue
                    claimed.add(loser)
                    plan.append((keeper, loser, score))
            if not contradicted:
                drained.add(group)
    return plan


# Planned pairs written per set of statements (and kept in memory until then).
SUPERSEDE_BATCH = 2_000

# Built once: only the scope changes from one load to the next. Every live note is read,
# so only what similarity needs is; the few notes with a near-duplicate get the rest
# (``_DETAILS``).
_LOAD = (
    select(Memory.id, Memory.title, Memory.topics, Memory.updated_seq)
    .where(
        Memory.scope_kind == bindparam("kind"),
        Memory.scope_id == bindparam("sid"),
        Memory.status == LIVE,
        # Session summaries share a title by design; each is its session's record.
        or_(Memory.type.is_(None), Memory.type != SUMMARY_TYPE),
    )
    .order_by(Memory.id)
)
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


@dataclass(frozen=True)
class _Scan:
    """A scope's live notes, by position: ids, ``updated_seq`` and term sets."""

    ids: list[int]
    seqs: list[int]
    terms: list[frozenset[str]]


# Scopes read ahead of the one being scanned (PostgreSQL): enough to keep the reader busy
# through a large scope, few enough to keep memory at a few scopes' rows.
READ_AHEAD = 3


def _reads_apart(session: Session, scopes: Sequence[Scope]) -> bool:
    """Whether the scan reads on a connection of its own (PostgreSQL, several scopes)."""
    return len(scopes) > 1 and dialect_name(session) == "postgresql"


def _scans(
    source: Session | Engine, scopes: Sequence[Scope]
) -> Generator[tuple[Scope, _Scan], None, None]:
    """Each scope's live notes, in order, read through ``source``.

    Given the engine (PostgreSQL, several scopes), the next scopes are read on a connection
    of their own while the caller works, so the database's time hides behind Python's; the
    reading thread only fetches (terms are extracted here), as it is the one waited on. The
    scan then never touches the caller's session, which the settler's thread writes on.
    Plain reads are enough: ``_supersede`` writes a pair only if both notes are still as
    read, whichever connection read them.
    """

    def read(conn: Connection, scope: Scope) -> Sequence[Row[int, str, str, int]]:
        return conn.execute(_LOAD, {"kind": scope.kind, "sid": scope.id}).all()

    def scan(rows: Sequence[Row[int, str, str, int]]) -> _Scan:
        ids, titles, topics, seqs = zip(*rows, strict=True) if rows else ((), (), (), ())
        return _Scan(list(ids), list(seqs), list(map(similarity_terms, titles, topics)))

    if isinstance(source, Session):
        for scope in scopes:
            # Straight through the connection: plain rows, none of the ORM's statement work.
            yield scope, scan(read(source.connection(), scope))
        return
    with source.connect() as reader, ThreadPoolExecutor(1) as ahead:
        pending = deque(ahead.submit(read, reader, scope) for scope in scopes[:READ_AHEAD])
        for n, scope in enumerate(scopes):
            rows = pending.popleft().result()
            if n + READ_AHEAD < len(scopes):
                pending.append(ahead.submit(read, reader, scopes[n + READ_AHEAD]))
            yield scope, scan(rows)


# A planned ``keeper supersedes loser`` pair, with its scope and score.
_Pair = tuple[Scope, _Row, _Row, float]


@dataclass(frozen=True)
class _Found:
    """A scope's duplicate edges, waiting for its notes' details: ``(id, seq)`` by position
    for every note with an edge."""

    scope: Scope
    candidates: Candidates
    notes: dict[int, tuple[int, int]]


def _found(scope: Scope, scan: _Scan, found: Candidates) -> _Found:
    positions = {p for g in found.edges for p in found.groups[g]}
    return _Found(scope, found, {p: (scan.ids[p], scan.seqs[p]) for p in sorted(positions)})


def _plan_pairs(session: Session, waiting: Sequence[_Found], id_chunk: int) -> list[_Pair]:
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
    pairs: list[_Pair] = []
    for found in waiting:
        rows = {
            p: _Row(note_id, *details[note_id], seq=seq)
            for p, (note_id, seq) in found.notes.items()
            if note_id in details
        }
        pairs.extend(
            (found.scope, rows[keep], rows[lose], score)
            for keep, lose, score in _choose_keepers(rows, found.candidates)
        )
    return pairs


def _supersede(session: Session, plan: Sequence[_Pair], id_chunk: int) -> list[_Pair]:
    """Write the planned ``keeper supersedes loser`` pairs in bulk; return those written.

    ``store.links.link``'s rules hold because a pair is written only when both notes are as
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


class _Settler:
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
        self._plan: list[_Pair] = []
        self._waiting: list[_Found] = []  # scopes whose notes' details are not read yet
        self._noted = 0
        self._thread = ThreadPoolExecutor(1) if apart else None
        self._running: list[Future[None]] = []
        self._failed = False

    def add(self, found: _Found) -> None:
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

    def _run(self, batch: list[_Found], *, last: bool) -> None:
        if self._thread is None:
            self._settle(batch, last=last)
            return
        for future in self._running:
            if future.done():
                future.result()  # stop at the first failed write, not at the end
        self._running = [f for f in self._running if not f.done()]
        self._running.append(self._thread.submit(self._settle, batch, last=last))

    def _settle(self, batch: list[_Found], *, last: bool) -> None:
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


# How long a run waits for the writers running when it starts (PostgreSQL).
IN_FLIGHT_WAIT = 10.0

# The highest updated_seq committed, and the other transactions open in this database when
# it was read (pid and start: a pooled connection's next transaction is another one). A
# note's number is taken when it is written (even a statement ahead) but seen only at its
# commit, so only those can still commit a note numbered below it.
_TOP_AND_OPEN = text(
    "SELECT m.top, o.pids, o.starts FROM (SELECT max(updated_seq) AS top FROM memories) AS m,"
    " (SELECT array_agg(pid) AS pids, array_agg(xact_start) AS starts FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    " AND backend_type = 'client backend' AND xact_start IS NOT NULL) AS o"
)
_STILL_OPEN = text(
    "SELECT count(*) FROM pg_stat_activity AS a"
    " JOIN unnest(CAST(:pids AS integer[]), CAST(:starts AS timestamptz[])) AS o(pid, started)"
    " ON a.pid = o.pid AND a.xact_start = o.started"
)
# pg_stat_activity is read once a transaction unless this discards what was read.
_FRESH_ACTIVITY = text("SELECT pg_stat_clear_snapshot()")


def _settled_top(session: Session, wait: float) -> tuple[int, int]:
    """``(top, in_flight)``: the highest ``updated_seq`` committed, once every transaction that
    could still commit a lower one has ended or ``wait`` seconds have passed; ``in_flight``
    counts those still open then (0: every note numbered up to ``top`` is visible from here
    on). Transactions of roles whose activity this one may not see are not waited for."""
    if dialect_name(session) != "postgresql":
        # SQLite: this transaction is the only writer (BEGIN IMMEDIATE).
        return int(session.execute(select(func.max(Memory.updated_seq))).scalar_one() or 0), 0
    session.execute(_FRESH_ACTIVITY)
    top, pids, starts = session.execute(_TOP_AND_OPEN).one()
    deadline = time.monotonic() + wait
    running = len(pids or ())
    while running:
        session.execute(_FRESH_ACTIVITY)
        running = int(session.execute(_STILL_OPEN, {"pids": pids, "starts": starts}).scalar_one())
        if not running or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return int(top or 0), running


def dedupe(
    session: Session,
    settings: Settings,
    *,
    dry_run: bool = False,
    supersede_batch: int = SUPERSEDE_BATCH,
    id_chunk: int = ID_CHUNK,
    on_step: Step = _no_step,
    in_flight_wait: float = IN_FLIGHT_WAIT,
) -> DedupeResult:
    """Supersede near-duplicates among live notes changed since the last run, scope by scope.

    One transaction, the caller's. On PostgreSQL it first tries an advisory lock and, when
    another run holds it, returns ``locked=True`` having done nothing; SQLite's
    ``BEGIN IMMEDIATE`` makes a second run wait instead. The watermark moves to the highest
    ``updated_seq`` seen at the start (not in a dry run, nor when a pair was skipped because
    its notes changed mid-run: the next run then looks again), so the next run sees only
    later changes; pairs of two unchanged notes are never rescanned. On PostgreSQL a writer
    running at the start may still commit a note numbered below that: the run first waits
    up to ``in_flight_wait`` seconds for such writers to end, and leaves the watermark where
    it was when some still run.

    ``supersede_batch`` planned pairs are written per set of statements (and held until
    then); the notes' details are read ``id_chunk`` ids per statement. ``on_step`` is called
    with each named point of the run (``STEPS``) as it is reached, on the thread reaching it.
    """
    started = time.perf_counter()
    if dialect_name(session) == "postgresql":
        acquired = session.execute(
            text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": lock_key(DEDUPE)}
        ).scalar_one()
        if not acquired:
            return DedupeResult(dry_run=dry_run, locked=True, seconds=elapsed(started))
    since = watermark(session, DEDUPE)
    on_step(LOCKED)
    top, in_flight = _settled_top(session, in_flight_wait)
    scopes = session.execute(
        select(Memory.scope_kind, Memory.scope_id)
        .where(Memory.updated_seq > since, Memory.status == LIVE)
        .distinct()
        .order_by(Memory.scope_kind, Memory.scope_id)
    ).all()

    scanned = changed = checked = 0
    in_scopes = [Scope.stored(kind, sid) for kind, sid in scopes]
    apart = _reads_apart(session, in_scopes)
    # Apart, the scan reads through the engine and the settler's thread alone uses the
    # session until ``close``: nothing else here touches it in between.
    source: Session | Engine = session.get_bind().engine if apart else session
    settler = _Settler(
        session,
        dry_run=dry_run,
        apart=apart,
        batch=supersede_batch,
        id_chunk=id_chunk,
        on_step=on_step,
    )
    # closing(): on an error the reading thread stops and its connection goes back at once,
    # not whenever the traceback holding this frame is let go.
    with closing(_scans(source, in_scopes)) as scans:
        try:
            for scope, scan in scans:
                on_step(SCOPE_READ)
                fresh = [seq > since for seq in scan.seqs]
                found = similar_groups(scan.terms, fresh, settings.duplicate_threshold)
                scanned += len(scan.ids)
                changed += sum(fresh)
                checked += found.checked
                if found.edges:
                    settler.add(_found(scope, scan, found))
            settler.finish()
        finally:
            settler.close()
    superseded, skipped = settler.superseded, settler.skipped
    result = DedupeResult(
        dry_run=dry_run,
        scopes_scanned=len(scopes),
        notes_scanned=scanned,
        notes_changed=changed,
        candidates_checked=checked,
        superseded=superseded,
        skipped=skipped,
        in_flight=in_flight,
        pairs=settler.reported,
        since_seq=since,
        watermark=since if dry_run or skipped or in_flight else max(since, top),
        seconds=elapsed(started),
    )
    if not dry_run:
        record(session, DEDUPE, result, watermark=result.watermark)
    return result
