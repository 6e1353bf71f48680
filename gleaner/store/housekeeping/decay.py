"""Recency decay: every note's ``weight`` brought up to ``0.5 ** (age_days / half_life_days)``.

Walks ``memories`` in id-ordered batches, one short transaction each, so writes go on
meanwhile; with ``archive_below_weight`` set, unpinned live notes under it are archived."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import (
    ColumnElement,
    and_,
    case,
    func,
    select,
    update,
)
from sqlalchemy.orm import Session

from gleaner.config.store import StoreSettings
from gleaner.store.housekeeping.state import DECAY, Transactions, elapsed, record
from gleaner.store.schema.models import Memory
from gleaner.store.schema.sql import (
    decayed_weight,
    dialect_name,
    next_seq,
)
from gleaner.store.schema.tables import ARCHIVED, LIVE, utcnow
from gleaner.store.schemas import Frozen

# A weight moving by less than this is not worth a row write (a fresh note moves ~3e-7 a
# second at a 30-day half-life).
WEIGHT_EPSILON = 1e-6


class DecayResult(Frozen):
    """What a decay run changed (with ``dry_run``: would change)."""

    dry_run: bool
    updated: int  # rows whose weight moved
    archived: int
    batches: int
    seconds: float


def decay(
    transaction: Transactions, settings: StoreSettings, *, dry_run: bool = False
) -> DecayResult:
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
        dialect = dialect_name(session)
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
        seconds=elapsed(started),
    )
    if not dry_run:
        with transaction() as session:
            record(session, DECAY, result)
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
