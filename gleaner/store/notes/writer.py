"""The one note writer: validated drafts in, rows + terms + history out, in the caller's
transaction. A single write is a batch of one.

Items are written as if one at a time, in order: a derived slug takes the next free ``-N``
(skipping earlier items' slugs), an explicit slug or a topic key upserts (an earlier item's
note, or one stored before), and with a session and no topic key, content already saved
under that session is ``deduped``. An update that changes a note's title or body keeps the
text it replaces (``store.notes.history``). Lookups, inserts, updates and the term index take a
handful of statements whatever the batch size.

One note's way from draft to row: ``write_items`` asks the planner (``store.notes.write_plan``)
for the rows to write, each an ``Op``: the note's columns, and the versions of its text it
replaces. ``_apply`` then writes them: ``_update`` the stored notes, ``_insert`` the new
ones (one multi-row INSERT ... RETURNING per chunk), ``_index`` their term and search rows,
then their history.

A unique key a concurrent writer took between the lookup and the insert is not an error:
those items are planned again against what is stored now (on PostgreSQL the conflicting
insert is waited for, so the winner's row is visible), the lost derived slugs counted as
taken.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, bindparam, delete, update

from gleaner.store.errors import StorageFailure
from gleaner.store.notes.history import keep
from gleaner.store.notes.term_index import insert_terms
from gleaner.store.notes.terms import similarity_terms
from gleaner.store.notes.write_item import Item, Outcome, Written
from gleaner.store.notes.write_plan import Context, Op, plan
from gleaner.store.recall.search_index import delete_postings, insert_postings, postings_of
from gleaner.store.schema.models import LIVE, Memory, MemoryTerm, utcnow
from gleaner.store.schema.sql import (
    Executor,
    dialect_insert,
    dialect_name,
    next_seqs,
    seq_expression,
)
from gleaner.store.schemas import Scope

# Rows per multi-row INSERT: well under SQLite's bound-parameter limit (25 columns a row).
BATCH_CHUNK = 400
# More passes than this over items that keep losing races means something is wrong.
MAX_WRITE_ATTEMPTS = 100


def write_items(
    session: Executor,
    scope: Scope,
    items: Sequence[Item],
    *,
    conversation_id: str | None = None,
    occurred_at: datetime | None = None,
    session_id: str | None = None,
    rows: bool = False,
) -> list[Written]:
    """Write ``items`` in order (see the module's docstring); one ``Written`` per item, with
    the note's row as written when ``rows`` (a single write shows it to its caller)."""
    context = Context(scope, conversation_id, occurred_at, session_id)
    results: dict[int, Written] = {}
    pending = list(range(len(items)))
    lost: set[str] = set()
    for attempt in range(MAX_WRITE_ATTEMPTS):
        if not pending:
            return [results[n] for n in range(len(items))]
        planned = plan(
            session,
            context,
            [(n, items[n]) for n in pending],
            lost=lost,
            # One item: insert first and list its slug's -N forms only if that conflicts
            # (most derived slugs are free: a lookup saved on nearly every single write).
            optimistic=attempt == 0 and len(pending) == 1,
        )
        results.update(planned.deduped)
        _number(session, planned.ops)
        retry = _apply(session, scope, planned.ops, rows=rows)
        results.update(_written([op for op in planned.ops if op not in retry]))
        lost.update(op.slug for op in retry)
        pending = sorted(n for op in retry for n in op.items)
    raise StorageFailure(
        f"could not write {len(pending)} note(s) after {MAX_WRITE_ATTEMPTS} attempts: "
        "their slugs kept being taken",
        reason="slug_exhausted",
    )


def _number(session: Executor, ops: Sequence[Op]) -> None:
    """Give the ops their ``updated_seq``, in order. An INSERT computes its own (no round
    trip) on PostgreSQL, and on SQLite when it is the only row (max + 1 would repeat across
    the rows of one statement)."""
    inline = dialect_name(session) == "postgresql" or sum(op.inserted for op in ops) == 1
    numbered = [op for op in ops if not (inline and op.inserted)]
    for op, seq in zip(numbered, next_seqs(session, len(numbered)), strict=True):
        op.values["updated_seq"] = seq


def _written(ops: Sequence[Op]) -> dict[int, Written]:
    """What became of the items folded into ``ops`` (written), by position."""
    results: dict[int, Written] = {}
    for op in ops:
        for position, n in enumerate(op.items):
            outcome: Outcome = "created" if position == 0 and op.inserted else "updated"
            results[n] = Written(outcome, int(op.row_id or 0), op.slug, op.row)
    return results


def _apply(session: Executor, scope: Scope, ops: list[Op], *, rows: bool) -> list[Op]:
    """Write the planned rows, their terms, search rows and history; return the inserts a
    concurrent writer beat (nothing of them written). With ``rows`` each op gets its row as
    written (RETURNING every column)."""
    for op in ops:
        # The note's text as this write leaves it (an update keeps what it does not set).
        op.postings = postings_of({**(op.current or {}), **op.values})
        op.values["search_length"] = op.postings.length
    _update(session, [op for op in ops if not op.inserted], rows=rows)
    retry = _insert(session, scope, [op for op in ops if op.inserted], rows=rows)
    written = [op for op in ops if op not in retry]
    _index(session, scope, written)
    # The texts the batch replaced (an inserted note's id is known only now).
    keep(
        session, [{**version, "memory_id": op.row_id} for op in written for version in op.versions]
    )
    return retry


def _update(session: Executor, ops: Sequence[Op], *, rows: bool) -> None:
    """Write the updates of stored notes, and drop their term and search rows (``_index``
    writes them anew)."""
    if not ops:
        return
    changes = [
        {"id": op.row_id, **op.values, **({"status": LIVE} if op.revive and op.rewritten else {})}
        for op in ops
    ]
    if rows:
        for op, change in zip(ops, changes, strict=True):
            columns = {k: v for k, v in change.items() if k != "id"}
            op.row = _detached(
                session.execute(
                    update(_MEMORIES)
                    .where(_MEMORIES.c.id == op.row_id)
                    .values(columns)
                    .returning(*_MEMORIES.c)
                ).one()
            )
    else:
        _update_by_id(session, changes)
    ids = [int(op.row_id or 0) for op in ops]
    session.execute(delete(MemoryTerm).where(MemoryTerm.memory_id.in_(ids)))
    delete_postings(session, ids)


def _insert(session: Executor, scope: Scope, ops: Sequence[Op], *, rows: bool) -> list[Op]:
    """Insert the new notes, ``BATCH_CHUNK`` a statement (SQLAlchemy's executemany with
    RETURNING: one multi-row INSERT); give each its id, and return the ops whose slug (or
    topic key) a concurrent writer took meanwhile, which are skipped."""
    retry: list[Op] = []
    now = utcnow()
    dialect = dialect_name(session)
    for start in range(0, len(ops), BATCH_CHUNK):
        chunk = ops[start : start + BATCH_CHUNK]
        values = [
            {
                **op.values,
                "scope_kind": scope.kind,
                "scope_id": scope.id,
                "slug": op.slug,
                "superseded_by_id": None,
                "created_at": now,
                "status": LIVE,
                "weight": 1.0,
            }
            for op in chunk
        ]
        stmt = _insert_statement(dialect, "updated_seq" in values[0], rows)
        returned = {row.slug: row for row in session.execute(stmt, values)}
        for op in chunk:
            found = returned.get(op.slug)
            if found is None:
                retry.append(op)
                continue
            op.row_id = int(found.id)
            op.row = _detached(found) if rows else None
    return retry


def _index(session: Executor, scope: Scope, ops: Sequence[Op]) -> None:
    """Add the term-index and search rows of the notes ``ops`` wrote."""
    insert_terms(session, scope, [(int(op.row_id or 0), term) for op in ops for term in _terms(op)])
    insert_postings(
        session,
        scope,
        [(int(op.row_id or 0), op.postings) for op in ops if op.postings is not None],
    )


def _update_by_id(session: Executor, changes: list[dict[str, Any]]) -> None:
    """Update rows by their ``id``, one executemany a set of columns: Core's statement, so it
    runs on a connection as on a session (the ORM's bulk UPDATE by primary key needs a
    session, and a Core UPDATE given the same rows without its WHERE would update every
    note). Core sets the columns each row names."""
    by_columns: dict[frozenset[str], list[dict[str, Any]]] = {}
    for change in changes:
        row = {key: value for key, value in change.items() if key != "id"}
        by_columns.setdefault(frozenset(row), []).append({**row, "row_id": change["id"]})
    for found in by_columns.values():
        session.execute(_UPDATE_BY_ID, found)


def _terms(op: Op) -> list[str]:
    """The term-index rows of the note ``op`` writes (an update keeps what it does not set)."""
    text = {**(op.current or {}), **op.values}
    return sorted(similarity_terms(text["title"], text["topics"] or ""))


_MEMORIES = cast(Table, Memory.__table__)
_UPDATE_BY_ID = update(_MEMORIES).where(_MEMORIES.c.id == bindparam("row_id"))


@functools.cache
def _insert_statement(dialect: str, seq_given: bool, rows: bool) -> Any:
    """The batch INSERT of new notes (skipping a slug taken meanwhile), built once per
    shape: a statement built per call costs its construction and cache key every time."""
    stmt = dialect_insert(dialect, _MEMORIES)
    if not seq_given:
        stmt = stmt.values(updated_seq=seq_expression(dialect))
    returning = _MEMORIES.c if rows else (_MEMORIES.c.id, _MEMORIES.c.slug)
    return stmt.on_conflict_do_nothing().returning(*returning)


def _detached(row: Any) -> Memory:
    """A ``Memory`` built from a returned row: callers only read it, and loading it through
    the ORM costs as much as the write."""
    return Memory(**row._mapping)
