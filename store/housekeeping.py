"""Housekeeping: recency decay of note weights, and superseding near-duplicate notes.

Celery beat (``workers.tasks``) and ``gleaner housekeep`` run both; both are safe while notes
are being written, and neither deletes anything.

``decay``   walks ``memories`` in id-ordered batches, one short transaction each, setting
            ``weight = 0.5 ** (age_days / half_life_days)`` in SQL (age from ``updated_at``).
            With ``archive_below_weight`` set, unpinned live notes under it are archived.
``dedupe``  per scope, finds live notes whose title+topic Jaccard score reaches
            ``duplicate_threshold`` and has each superseded by its best keeper when the two
            hold the same fact (``store.terms``: nothing in title or body contradicts).
            Candidates come from a prefix-filtered inverted index, only for notes changed
            since the last run's ``updated_seq`` watermark; every pair acted on is scored
            exactly.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Generator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, closing
from dataclasses import dataclass
from datetime import datetime
from itertools import chain
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import (
    ColumnElement,
    and_,
    bindparam,
    case,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection, Row
from sqlalchemy.orm import Session

from store.links import scope_lock_key
from store.mem import SUMMARY_TYPE
from store.models import ARCHIVED, LIVE, SUPERSEDED, HousekeepingState, Link, Memory, utcnow
from store.notes import next_seq, next_seqs
from store.schemas import Frozen, Scope
from store.settings import Settings
from store.sql import FLOAT_SLACK, ID_CHUNK, advisory_key, decayed_weight, dialect_insert
from store.terms import FactText, disagreement, similarity_terms

log = logging.getLogger(__name__)

DECAY, DEDUPE = "decay", "dedupe"
# Results (and housekeeping_state.last_result) list at most this many pairs.
MAX_REPORTED_PAIRS = 100
# A weight moving by less than this is not worth a row write (a fresh note moves ~3e-7 a
# second at a 30-day half-life).
WEIGHT_EPSILON = 1e-6

Transactions = Callable[[], AbstractContextManager[Session]]


def _lock_key(name: str) -> int:
    """The PostgreSQL advisory-lock key of the housekeeping task ``name``."""
    return advisory_key("housekeeping", name)


def _watermark(session: Session, name: str) -> int:
    value = session.execute(
        select(HousekeepingState.watermark).where(HousekeepingState.name == name)
    ).scalar_one_or_none()
    return int(value or 0)


def _record(
    session: Session, name: str, result: BaseModel, *, watermark: int | None = None
) -> None:
    """Upsert the task's row in ``housekeeping_state``; the watermark only when given."""
    values: dict[str, Any] = {
        "last_run_at": utcnow(),
        # Counts only: reported pairs name scopes and slugs, which must not outlive a forget.
        "last_result": result.model_dump(mode="json", exclude={"pairs"}),
    }
    if watermark is not None:
        values["watermark"] = watermark
    stmt = dialect_insert(session, HousekeepingState).values(
        name=name, **{"watermark": 0, **values}
    )
    session.execute(stmt.on_conflict_do_update(index_elements=["name"], set_=values))


# Decay ------------------------------------------------------------------------------------


class DecayResult(Frozen):
    """What a decay run changed (with ``dry_run``: would change)."""

    dry_run: bool
    updated: int  # rows whose weight moved
    archived: int
    batches: int
    seconds: float


def decay(transaction: Transactions, settings: Settings, *, dry_run: bool = False) -> DecayResult:
    """Bring every note's ``weight`` up to date, archiving under ``archive_below_weight``.

    ``transaction`` opens one transaction (``Store.transaction``); each batch of
    ``housekeeping_batch_size`` rows (by id) gets its own, so writes go on meanwhile. Weight
    alone leaves ``updated_seq`` as it is; an archived note gets a new one (its scope's
    fingerprint changes). Pinned notes are decayed but never archived. Notes created after the
    run starts are left at their fresh weight.
    """
    started = time.perf_counter()
    now = utcnow()
    with transaction() as session:
        dialect = session.get_bind().dialect.name
        low, high = session.execute(select(func.min(Memory.id), func.max(Memory.id))).one()
    weight = decayed_weight(dialect, now, settings.half_life_days)
    floor = settings.archive_below_weight
    updated = archived = batches = 0
    last, stop = (0, 0) if low is None else (int(low) - 1, int(high))
    while last < stop:
        with transaction() as session:
            end = _batch_end(session, last, stop, settings.housekeeping_batch_size)
            in_batch = and_(Memory.id > last, Memory.id <= end)
            if dry_run:
                # -1 is below every weight: with archiving off nothing counts as archivable.
                changed, below = _count_batch(
                    session, in_batch, weight, -1.0 if floor is None else floor
                )
            else:
                changed = _update_weights(session, in_batch, weight)
                below = 0 if floor is None else _archive(session, in_batch, weight, floor)
        updated += changed
        archived += below
        batches += 1
        last = end
    result = DecayResult(
        dry_run=dry_run,
        updated=updated,
        archived=archived,
        batches=batches,
        seconds=_since(started),
    )
    if not dry_run:
        with transaction() as session:
            _record(session, DECAY, result)
    return result


def _batch_end(session: Session, after: int, stop: int, size: int) -> int:
    """The id closing the next batch of ``size`` rows after ``after``."""
    batch = (
        select(Memory.id)
        .where(Memory.id > after, Memory.id <= stop)
        .order_by(Memory.id)
        .limit(size)
        .subquery()
    )
    end = session.execute(select(func.max(batch.c.id))).scalar_one()
    # Rows deleted since the run began: close the range so the loop ends.
    return stop if end is None else int(end)


def _count_batch(
    session: Session, in_batch: ColumnElement[bool], weight: ColumnElement[Any], floor: float
) -> tuple[int, int]:
    """Rows of the batch whose weight would move, and those decay would archive."""
    moves = case((func.abs(Memory.weight - weight) > WEIGHT_EPSILON, 1), else_=0)
    sinks = case((_archivable(weight, floor), 1), else_=0)
    changed, below = session.execute(
        select(func.coalesce(func.sum(moves), 0), func.coalesce(func.sum(sinks), 0)).where(in_batch)
    ).one()
    return int(changed), int(below)


def _update_weights(
    session: Session, in_batch: ColumnElement[bool], weight: ColumnElement[Any]
) -> int:
    result = session.execute(
        update(Memory)
        .where(in_batch, func.abs(Memory.weight - weight) > WEIGHT_EPSILON)
        .values(weight=weight)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def _archivable(weight: ColumnElement[Any], floor: float) -> ColumnElement[bool]:
    # The weight computed from updated_at, not the stored column: a note rewritten a moment
    # ago (fresh updated_at, weight not yet decayed again) must not be archived.
    return and_(Memory.status == LIVE, ~Memory.pinned, weight < floor)


def _archive(
    session: Session, in_batch: ColumnElement[bool], weight: ColumnElement[Any], floor: float
) -> int:
    """Archive the batch's unpinned live notes under ``floor``, each with a new updated_seq.

    ``updated_at`` is left alone: it is the clock decay reads.
    """
    ids = session.execute(
        select(Memory.id).where(in_batch, _archivable(weight, floor)).order_by(Memory.id)
    ).scalars()
    archived = 0
    for note_id in list(ids):
        # The condition again: a writer may have refreshed the note since the SELECT.
        result = session.execute(
            update(Memory)
            .where(Memory.id == note_id, _archivable(weight, floor))
            .values(status=ARCHIVED, updated_seq=next_seq(session))
            .execution_options(synchronize_session=False)
        )
        archived += int(result.rowcount)  # type: ignore[attr-defined]
    return archived


# Dedupe -----------------------------------------------------------------------------------


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
    seq: int

    @property
    def rank(self) -> tuple[bool, datetime, float, int]:
        """Keeper order, best highest: pinned, then newer, then more confident, then higher id."""
        confidence = -1.0 if self.confidence is None else self.confidence
        return (self.pinned, self.updated_at, confidence, self.id)


@dataclass(frozen=True)
class Candidates:
    """Input positions grouped by identical term set, and the groups' duplicate edges.

    ``edges[g]`` lists ``(h, score)`` for each group ``h`` whose Jaccard score with ``g``
    reaches the threshold, sorted by ``h``; ``(g, 1.0)`` is there when ``g`` itself holds a
    changed note beside others. Edges are symmetric.
    """

    groups: list[list[int]]
    edges: dict[int, list[tuple[int, float]]]
    checked: int


def prefix_length(size: int, threshold: float) -> int:
    """How many of a set's rarest terms must be indexed so no pair at ``threshold`` is missed.

    ``J(A, B) >= t`` needs ``|A & B| >= ceil(t * |A|)``, so two such sets share a term within
    the first ``|A| - ceil(t * |A|) + 1`` of each, in any one global term order.
    """
    overlap = math.ceil(threshold * size - FLOAT_SLACK)
    return max(1, min(size, size - overlap + 1))


def _partners(size: int, threshold: float) -> list[tuple[int, int, int]]:
    """For a set of ``size`` terms: each set size that can reach ``threshold`` with it, the
    terms the two must share, and how many of the other's prefix positions can hold the
    first shared term (the positional filter)."""
    # J <= min(|A|, |B|) / max(|A|, |B|): sizes outside these bounds cannot reach it.
    low = max(1, math.ceil(threshold * size - FLOAT_SLACK))
    high = math.floor((size + FLOAT_SLACK) / threshold)
    # J(A, B) >= t  <=>  |A & B| >= t / (1 + t) * (|A| + |B|).
    share = threshold / (1 + threshold)
    found = []
    for other in range(low, high + 1):
        need = math.ceil(share * (size + other) - FLOAT_SLACK)
        positions = min(prefix_length(other, threshold), other - need + 1)
        if positions > 0:
            found.append((other, need, positions))
    return found


def _probe_plan(size: int, threshold: float) -> list[tuple[int, list[tuple[int, int]]]]:
    """What a set of ``size`` terms looks up: for each of its prefix positions ``i``, the
    index slots ``(other size, other position)`` a pair at the threshold can meet in.

    Positional filter (PPJoin): a pair meets first at its first shared term, and shares at
    most that one plus what follows it in each set: ``1 + min(size - i - 1, ...) >= need``.
    """
    partners = _partners(size, threshold)
    plan = []
    for i in range(prefix_length(size, threshold)):
        slots = [
            (other, j)
            for other, need, positions in partners
            if size - i >= need
            for j in range(positions)
        ]
        if slots:
            plan.append((i, slots))
    return plan


def _group(
    term_sets: Sequence[frozenset[str]], changed: Sequence[bool]
) -> tuple[list[frozenset[str]], list[list[int]], list[bool]]:
    """Distinct non-empty term sets, the input positions holding each, and whether any of
    those positions changed."""
    by_terms: defaultdict[frozenset[str], list[int]] = defaultdict(list)
    for position, terms in enumerate(term_sets):
        by_terms[terms].append(position)
    by_terms.pop(frozenset(), None)
    groups = list(by_terms.values())
    if all(changed):
        return list(by_terms), groups, [True] * len(groups)
    return list(by_terms), groups, [any(changed[p] for p in members) for members in groups]


def _rank(keys: Sequence[frozenset[str]]) -> tuple[list[list[int]], int]:
    """Each set's terms as ranks, rarest first (its first ``prefix_length`` are its prefix),
    and the rank from which terms belong to more than one set."""
    frequency = Counter(chain.from_iterable(keys))
    # Rarest first, ties in first-seen order (a stable sort): one order for the whole input.
    order = {term: n for n, term in enumerate(sorted(frequency, key=frequency.__getitem__))}
    rank = order.__getitem__
    # A term of one set only (they rank first) can pair nothing: never indexed nor probed.
    shared_from = sum(1 for count in frequency.values() if count == 1)
    return [sorted(map(rank, key)) for key in keys], shared_from


def similar_groups(
    term_sets: Sequence[frozenset[str]], changed: Sequence[bool], threshold: float
) -> Candidates:
    """Pairs of term sets with Jaccard >= ``threshold`` where one holds a changed note.

    Identical sets are grouped first (one group of many same-titled notes costs nothing).
    Terms are ordered rarest first within the input; each group indexes its prefix
    (``prefix_length``), and each changed group probes the index with its own, so only sets
    sharing a rare term, of a size that can reach the threshold and with enough terms after
    the first shared one (the positional filter), are scored. Empty sets match nothing.
    """
    keys, groups, touched = _group(term_sets, changed)
    prefixes, shared_from = _rank(keys)
    sizes = list(map(len, keys))
    lengths = {size: prefix_length(size, threshold) for size in set(sizes)}
    plans = {size: _probe_plan(size, threshold) for size in lengths}
    # index[term][(set size, position in its prefix)] -> groups: a probe looks up only the
    # sizes that can reach the threshold and the positions the positional filter allows, and
    # one miss on a term skips all of them.
    slots = {size: [(size, p) for p in range(n)] for size, n in lengths.items()}
    index: dict[int, dict[tuple[int, int], list[int]]] = {}

    def insert(group: int) -> None:
        for slot, token in zip(slots[sizes[group]], prefixes[group], strict=False):
            if token < shared_from:
                continue
            entries = index.get(token)
            if entries is None:
                index[token] = {slot: [group]}
            elif (members := entries.get(slot)) is None:
                entries[slot] = [group]
            else:
                members.append(group)

    # Probe, then insert: unchanged groups are indexed up front and each changed group joins
    # after probing, so every pair is met once and two unchanged groups never meet.
    for group, was_touched in enumerate(touched):
        if not was_touched:
            insert(group)
    edges: defaultdict[int, list[tuple[int, float]]] = defaultdict(list)
    checked = 0
    lookup = index.get
    for a, key in enumerate(keys):
        if not touched[a]:
            continue
        if len(groups[a]) > 1:
            edges[a].append((a, 1.0))
        size = sizes[a]
        prefix = prefixes[a]
        if prefix[lengths[size] - 1] < shared_from:
            continue  # no term of its prefix is in another set: it pairs with nothing
        candidates: set[int] | None = None
        for i, wanted in plans[size]:
            if prefix[i] < shared_from or (entries := lookup(prefix[i])) is None:
                continue
            for slot in wanted:
                if (members := entries.get(slot)) is not None:
                    if candidates is None:
                        candidates = set(members)
                    else:
                        candidates.update(members)
        for b in candidates or ():
            checked += 1
            # Exactly store.text.jaccard (|A | B| = |A| + |B| - |A & B|), without building
            # the union set: this is the hot loop.
            shared = len(key & keys[b])
            score = shared / (size + sizes[b] - shared)
            if score >= threshold:
                edges[a].append((b, score))
                edges[b].append((a, score))
        insert(a)
    return Candidates(
        groups=groups, edges={g: sorted(found) for g, found in edges.items()}, checked=checked
    )


def _choose_keepers(rows: Mapping[int, _Row], found: Candidates) -> list[tuple[int, int, float]]:
    """``(keeper, loser, score)`` positions: each duplicate paired with its best keeper.

    ``rows`` holds the positions that have an edge (one missing, deleted mid-run, is left
    out). Notes are visited best first (``_Row.rank``); one nobody has claimed is a keeper and
    claims every unclaimed, unpinned, lower-ranked note it is similar to. So a loser's keeper
    is the best surviving note similar to it (never one it only reaches through a third note),
    pinned notes are never claimed, and keepers outrank losers (no cycles).
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
                    and not rows[loser].pinned
                    and loser not in claimed
                ):
                    # The score says near-duplicate; only the same fact is superseded.
                    if disagreement(rows[keeper].text, rows[loser].text) is not None:
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
).where(Memory.id.in_(bindparam("ids", expanding=True)))


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
    """Whether ``_scans`` reads on a connection of its own (PostgreSQL, several scopes)."""
    return len(scopes) > 1 and session.get_bind().dialect.name == "postgresql"


def _scans(session: Session, scopes: Sequence[Scope]) -> Generator[tuple[Scope, _Scan], None, None]:
    """Each scope's live notes, in order.

    On PostgreSQL, with more than one scope, the next scopes are read on a second connection
    while the caller works on this one, so the database's time hides behind Python's; the
    reading thread only fetches (terms are extracted here), as it is the one waited on. Plain
    reads are enough: ``_supersede`` writes a pair only if both notes are still as read,
    whichever connection read them.
    """

    def read(conn: Connection, scope: Scope) -> Sequence[Row[int, str, str, int]]:
        return conn.execute(_LOAD, {"kind": scope.kind, "sid": scope.id}).all()

    def scan(rows: Sequence[Row[int, str, str, int]]) -> _Scan:
        ids, titles, topics, seqs = zip(*rows, strict=True) if rows else ((), (), (), ())
        return _Scan(list(ids), list(seqs), list(map(similarity_terms, titles, topics)))

    if not _reads_apart(session, scopes):
        for scope in scopes:
            # Straight through the connection: plain rows, none of the ORM's statement work.
            yield scope, scan(read(session.connection(), scope))
        return
    with session.get_bind().engine.connect() as reader, ThreadPoolExecutor(1) as ahead:
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


def _plan_pairs(session: Session, waiting: Sequence[_Found]) -> list[_Pair]:
    """Read the details of every waiting scope's notes (many scopes per statement) and pair
    each duplicate with its keeper. A note deleted since its scope was read is left out."""
    ids = sorted(note_id for found in waiting for note_id, _ in found.notes.values())
    details: dict[int, tuple[str, bool, datetime, float | None, FactText]] = {}
    for start in range(0, len(ids), ID_CHUNK):
        result = session.connection().execute(_DETAILS, {"ids": ids[start : start + ID_CHUNK]})
        details.update(
            {
                row[0]: (row[1], bool(row[2]), row[3], row[4], FactText(row[5], row[6], row[7]))
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


_SUPERSEDE_PG = text(
    "UPDATE memories SET status = :status, superseded_by_id = pair.keeper,"
    " updated_at = :now, updated_seq = nextval('memories_updated_seq_seq')"
    " FROM unnest(CAST(:losers AS bigint[]), CAST(:keepers AS bigint[])) AS pair(loser, keeper)"
    " WHERE memories.id = pair.loser"
)


def _supersede(session: Session, plan: Sequence[_Pair]) -> list[_Pair]:
    """Write the planned ``keeper supersedes loser`` links in bulk; return those written.

    ``store.links.link``'s rules hold because a pair is written only when both notes are as
    loaded (same ``updated_seq``, live, no superseder): the keeper then heads no chain, so no
    cycle can form, and the loser gets its first and only superseder. As in ``link``, the
    loser's ``updated_at`` and ``updated_seq`` move; on PostgreSQL the same per-scope locks
    are taken (in one order, so two bulk runs cannot deadlock) and the rows are locked
    before the check.
    """
    postgres = session.get_bind().dialect.name == "postgresql"
    if postgres:
        keys = sorted({scope_lock_key(scope, "supersedes") for scope, *_ in plan})
        session.execute(
            text("SELECT pg_advisory_xact_lock(key) FROM unnest(CAST(:keys AS bigint[])) key"),
            {"keys": keys},
        )
    loaded = {row.id: row.seq for _, keeper, loser, _ in plan for row in (keeper, loser)}
    ids = sorted(loaded)
    current: set[int] = set()
    for start in range(0, len(ids), ID_CHUNK):
        stmt = (
            select(Memory.id, Memory.updated_seq)
            .where(
                Memory.id.in_(ids[start : start + ID_CHUNK]),
                Memory.status == LIVE,
                Memory.superseded_by_id.is_(None),
            )
            .order_by(Memory.id)
        )
        if postgres:
            stmt = stmt.with_for_update()
        current.update(note_id for note_id, seq in session.execute(stmt) if seq == loaded[note_id])
    done = [pair for pair in plan if pair[1].id in current and pair[2].id in current]
    if not done:
        return done
    now = utcnow()
    if postgres:
        # One statement for every pair, each loser numbered from the sequence as it is set.
        session.execute(
            _SUPERSEDE_PG,
            {
                "losers": [loser.id for _, _, loser, _ in done],
                "keepers": [keeper.id for _, keeper, _, _ in done],
                "status": SUPERSEDED,
                "now": now,
            },
        )
    else:
        seqs = next_seqs(session, len(done))
        session.execute(
            update(Memory),
            [
                {
                    "id": loser.id,
                    "status": SUPERSEDED,
                    "superseded_by_id": keeper.id,
                    "updated_at": now,
                    "updated_seq": seq,
                }
                for (_, keeper, loser, _), seq in zip(done, seqs, strict=True)
            ],
        )
    session.execute(
        dialect_insert(session, Link).on_conflict_do_nothing(),
        [
            {"from_id": keeper.id, "to_id": loser.id, "rel": "supersedes", "created_at": now}
            for _, keeper, loser, _ in done
        ],
    )
    return done


class _Settler:
    """Turns found duplicates into superseded notes: reads their notes' details, pairs each
    duplicate with its keeper and writes the pairs, many scopes per statement.

    With ``apart`` (the scan reads on a connection of its own), this happens on a thread of
    its own, so the session's statements run while the next scopes are scanned; the session
    is then used by that thread alone until :meth:`finish` has returned.
    """

    def __init__(self, session: Session, *, dry_run: bool, apart: bool) -> None:
        self.session = session
        self.dry_run = dry_run
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
        if self._noted >= ID_CHUNK:
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
            self._plan.extend(_plan_pairs(self.session, batch))
            if last or len(self._plan) >= SUPERSEDE_BATCH:  # many scopes' pairs per statement
                self._write()
        except BaseException:
            self._failed = True
            raise

    def _write(self) -> None:
        plan = self._plan
        applied = plan if self.dry_run or not plan else _supersede(self.session, plan)
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


def dedupe(session: Session, settings: Settings, *, dry_run: bool = False) -> DedupeResult:
    """Supersede near-duplicates among live notes changed since the last run, scope by scope.

    One transaction, the caller's. On PostgreSQL it first tries an advisory lock and, when
    another run holds it, returns ``locked=True`` having done nothing; SQLite's
    ``BEGIN IMMEDIATE`` makes a second run wait instead. The watermark moves to the highest
    ``updated_seq`` seen at the start (not in a dry run, nor when a pair was skipped because
    its notes changed mid-run: the next run then looks again), so the next run sees only
    later changes; pairs of two unchanged notes are never rescanned.
    """
    started = time.perf_counter()
    if session.get_bind().dialect.name == "postgresql":
        acquired = session.execute(
            text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": _lock_key(DEDUPE)}
        ).scalar_one()
        if not acquired:
            return DedupeResult(dry_run=dry_run, locked=True, seconds=_since(started))
    since = _watermark(session, DEDUPE)
    top = int(session.execute(select(func.max(Memory.updated_seq))).scalar_one() or 0)
    scopes = session.execute(
        select(Memory.scope_kind, Memory.scope_id)
        .where(Memory.updated_seq > since, Memory.status == LIVE)
        .distinct()
        .order_by(Memory.scope_kind, Memory.scope_id)
    ).all()

    scanned = changed = checked = 0
    in_scopes = [Scope(kind=kind, id=sid) for kind, sid in scopes]
    settler = _Settler(session, dry_run=dry_run, apart=_reads_apart(session, in_scopes))
    # closing(): on an error the reading thread stops and its connection goes back at once,
    # not whenever the traceback holding this frame is let go.
    with closing(_scans(session, in_scopes)) as scans:
        try:
            for scope, scan in scans:
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
        pairs=settler.reported,
        since_seq=since,
        watermark=since if dry_run or skipped else max(since, top),
        seconds=_since(started),
    )
    if not dry_run:
        _record(session, DEDUPE, result, watermark=result.watermark)
    return result


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 3)
