"""Dedupe: near-duplicate live notes superseded by their best keeper, scope by scope.

Per scope, live notes whose title+topic Jaccard score reaches ``duplicate_threshold`` are
found by the prefix-filter join (``store.notes.overlap``), only for notes changed since the last
run's ``updated_seq`` watermark; a pair is superseded only when the two hold the same fact
(``store.notes.terms``: nothing in title or body contradicts). Every pair acted on is scored
exactly.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing

from sqlalchemy import bindparam, func, or_, select, text
from sqlalchemy.engine import Connection, Engine, Row
from sqlalchemy.orm import Session

from gleaner.config.store import StoreSettings
from gleaner.store.housekeeping.dedupe_run import (
    DETAILS_READ,
    LOCKED,
    SCOPE_READ,
    STEPS,
    DedupeResult,
    DuplicatePair,
    Scan,
    Step,
)
from gleaner.store.housekeeping.dedupe_settle import SUPERSEDE_BATCH, Settler, found_in
from gleaner.store.housekeeping.state import DEDUPE, elapsed, lock_key, record, watermark
from gleaner.store.notes.fact_terms import similarity_terms
from gleaner.store.notes.mem import SUMMARY_TYPE
from gleaner.store.notes.overlap import similar_groups
from gleaner.store.schema.models import Memory
from gleaner.store.schema.sql import ID_CHUNK, dialect_name
from gleaner.store.schema.tables import LIVE
from gleaner.store.schemas import Scope

# Dedupe -----------------------------------------------------------------------------------

log = logging.getLogger(__name__)


def _no_step(step: str) -> None:
    """The default ``on_step``: nothing."""


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


# Scopes read ahead of the one being scanned (PostgreSQL): enough to keep the reader busy
# through a large scope, few enough to keep memory at a few scopes' rows.
READ_AHEAD = 3


def _reads_apart(session: Session, scopes: Sequence[Scope]) -> bool:
    """Whether the scan reads on a connection of its own (PostgreSQL, several scopes)."""
    return len(scopes) > 1 and dialect_name(session) == "postgresql"


def _scans(
    source: Session | Engine, scopes: Sequence[Scope]
) -> Generator[tuple[Scope, Scan], None, None]:
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

    def scan(rows: Sequence[Row[int, str, str, int]]) -> Scan:
        ids, titles, topics, seqs = zip(*rows, strict=True) if rows else ((), (), (), ())
        return Scan(list(ids), list(seqs), list(map(similarity_terms, titles, topics)))

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
    settings: StoreSettings,
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
    settler = Settler(
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
                    settler.add(found_in(scope, scan, found))
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


# The public names; callers import those of store.housekeeping.dedupe_run from here too.
__all__ = [
    "DETAILS_READ",
    "IN_FLIGHT_WAIT",
    "LOCKED",
    "READ_AHEAD",
    "SCOPE_READ",
    "STEPS",
    "DedupeResult",
    "DuplicatePair",
    "dedupe",
]
