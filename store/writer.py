"""The one note writer: validated drafts in, rows + terms + history out, in the caller's
transaction. A single write is a batch of one.

Items are written as if one at a time, in order: a derived slug takes the next free ``-N``
(skipping earlier items' slugs), an explicit slug or a topic key upserts (an earlier item's
note, or one stored before), and with a session and no topic key, content already saved
under that session is ``deduped``. An update that changes a note's title or body keeps the
text it replaces (``store.history``). Lookups, inserts, updates and the term index take a
handful of statements whatever the batch size.

A unique key a concurrent writer took between the lookup and the insert is not an error:
those items are planned again against what is stored now (on PostgreSQL the conflicting
insert is waited for, so the winner's row is visible), the lost derived slugs counted as
taken.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, cast

from sqlalchemy import Table, bindparam, delete, update

from store import history, prepared
from store.drafts import Draft, base_slug_of, draft_columns
from store.errors import NoteChanged, StorageFailure
from store.models import ARCHIVED, LIVE, SUPERSEDED, Memory, MemoryTerm, utcnow
from store.pg_insert import insert_notes, insert_notes_at_commit
from store.schemas import Scope
from store.search_index import Postings, delete_postings, insert_postings, postings_of
from store.sql import Executor, dialect_insert, dialect_name, next_seqs, seq_expression
from store.term_index import insert_terms
from store.terms import similarity_terms
from store.write_lookup import SUPERSEDED_HOLDER, free_slug, lookup, session_twin

# Rows per multi-row INSERT: well under SQLite's bound-parameter limit (25 columns a row).
BATCH_CHUNK = 400
# More passes than this over items that keep losing races means something is wrong.
MAX_WRITE_ATTEMPTS = 100

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


@dataclass(eq=False)
class _Op:
    """One row the batch writes: an update of ``row_id`` or, without one, an insert."""

    slug: str
    values: dict[str, Any]
    items: list[int]  # positions of the items folded into this row, in order
    row_id: int | None = None
    status: str = LIVE  # the stored note's, when this op updates one
    revive: bool = False  # an archived note rewritten is live again
    rewritten: bool = False  # some write changes its live text (not only its history)
    inserted: bool = False
    # The note's text as the last write left it (``history.VERSIONED`` columns), and the
    # versions its writes replace (``memory_id`` filled in once an inserted row has an id).
    current: dict[str, Any] | None = None
    versions: list[dict[str, Any]] = field(default_factory=list)
    row: Memory | None = None  # with ``rows``: the row as written
    postings: Postings | None = None  # the note's search index rows, set by ``_apply``


@dataclass
class _Plan:
    ops: list[_Op]
    deduped: dict[int, Written]


def write_items(
    session: Executor,
    scope: Scope,
    items: Sequence[Item],
    *,
    conversation_id: str | None = None,
    occurred_at: datetime | None = None,
    session_id: str | None = None,
    rows: bool = False,
    at_commit: bool = False,
) -> list[Written]:
    """Write ``items`` in order (see the module's docstring); one ``Written`` per item, with
    the note's row as written when ``rows`` (a single write shows it to its caller).

    ``at_commit``: the caller reads nothing in its transaction after this, nor the ids of
    new notes. On PostgreSQL, in a transaction ``store.prepared.begin`` opened, new notes are
    then inserted with its COMMIT, in the same round trip (``pg_insert.insert_notes_at_commit``):
    their ``Written.id`` is 0, and a slug or topic key another writer took meanwhile rolls
    the transaction back there (``SlugTaken``), where a write at once would have taken the
    next free slug."""
    results: dict[int, Written] = {}
    pending = list(range(len(items)))
    lost: set[str] = set()
    for attempt in range(MAX_WRITE_ATTEMPTS):
        if not pending:
            return [results[n] for n in range(len(items))]
        plan = _plan(
            session,
            scope,
            [(n, items[n]) for n in pending],
            conversation_id=conversation_id,
            occurred_at=occurred_at,
            session_id=session_id,
            lost=lost,
            # One item: insert first and list its slug's -N forms only if that conflicts
            # (most derived slugs are free: a lookup saved on nearly every single write).
            optimistic=attempt == 0 and len(pending) == 1,
        )
        results.update(plan.deduped)
        inserts = sum(op.inserted for op in plan.ops)
        # An INSERT computes its own updated_seq (no round trip) on PostgreSQL, and on SQLite
        # when it is the only row (max + 1 would repeat across the rows of one statement).
        inline = dialect_name(session) == "postgresql" or inserts == 1
        numbered = [op for op in plan.ops if not (inline and op.inserted)]
        for op, seq in zip(numbered, next_seqs(session, len(numbered)), strict=True):
            op.values["updated_seq"] = seq
        retry = _apply(session, scope, plan.ops, rows=rows, at_commit=at_commit)
        for op in plan.ops:
            if op in retry:
                continue
            for position, n in enumerate(op.items):
                outcome: Outcome = "created" if position == 0 and op.inserted else "updated"
                results[n] = Written(outcome, int(op.row_id or 0), op.slug, op.row)
        lost.update(op.slug for op in retry)
        pending = sorted(n for op in retry for n in op.items)
    raise StorageFailure(
        f"could not write {len(pending)} note(s) after {MAX_WRITE_ATTEMPTS} attempts: "
        "their slugs kept being taken",
        reason="slug_exhausted",
    )


def _plan(
    session: Executor,
    scope: Scope,
    pending: Sequence[tuple[int, Item]],
    *,
    conversation_id: str | None,
    occurred_at: datetime | None,
    session_id: str | None,
    lost: set[str],
    optimistic: bool,
) -> _Plan:
    """The rows to write, simulating the items' single writes in order."""
    by_slug_row, by_topic_row, taken = lookup(
        session, scope, [item for _, item in pending], bases=not optimistic
    )
    taken |= lost
    now = utcnow()
    ops: list[_Op] = []
    deduped: dict[int, Written] = {}
    by_slug: dict[str, _Op] = {}
    by_topic: dict[str, _Op] = {}
    by_row: dict[int, _Op] = {}

    def update_op(row: dict[str, Any]) -> _Op:
        row_id = int(row["id"])
        if row_id not in by_row:
            by_row[row_id] = _Op(
                row["slug"],
                {},
                [],
                row_id=row_id,
                status=row["status"],
                # A superseded note whose superseder is gone replaces nothing any more.
                revive=row["status"] == ARCHIVED
                or (row["status"] == SUPERSEDED and row["superseded_by_id"] is None),
                current={c.key: row[c.key] for c in history.VERSIONED},
            )
            ops.append(by_row[row_id])
        return by_row[row_id]

    given = {
        name: value
        for name, value in (
            ("conversation_id", conversation_id),
            ("occurred_at", occurred_at),
            ("session_id", session_id),
        )
        if value is not None
    }
    for n, item in pending:
        draft = item.draft
        terms = similarity_terms(draft.title, draft.topics)
        values = {**draft_columns(draft, item.provenance, now, len(terms)), **given}
        if item.note_type is not None:
            values["type"] = item.note_type
        target: _Op | None = None
        if draft.slug is not None:
            target = by_slug.get(draft.slug)
            if target is None and draft.slug in by_slug_row:
                target = update_op(by_slug_row[draft.slug])
                by_slug[draft.slug] = target
        elif item.topic_key is not None:
            target = by_topic.get(item.topic_key)
            if target is None and item.topic_key in by_topic_row:
                target = update_op(by_topic_row[item.topic_key])
                by_topic[item.topic_key] = by_slug[target.slug] = target
        _check_expected(
            item.expect,
            target,
            draft.slug or item.topic_key,
            # A key whose note is superseded: the target is the note that replaced it.
            replaced=draft.slug is None
            and SUPERSEDED_HOLDER in by_topic_row.get(item.topic_key or "", {}),
        )
        if target is not None:
            _write_over(target, scope, item, values, conversation_id=conversation_id, now=now)
            target.items.append(n)
            continue
        base = draft.slug or base_slug_of(draft.title, item.topic_key)
        if session_id is not None and item.topic_key is None and base in taken:
            twin = session_twin(session, scope, session_id, values["content_hash"])
            if twin is not None:
                deduped[n] = Written("deduped", *twin)
                continue
        slug = draft.slug or free_slug(base, taken)
        taken.add(slug)
        op = _Op(
            slug,
            {
                **values,
                "type": item.note_type,
                "topic_key": item.topic_key,
                "conversation_id": conversation_id,
                "occurred_at": occurred_at,
                "session_id": session_id,
            },
            [n],
            inserted=True,
        )
        _write_over(op, scope, item, {}, conversation_id=conversation_id, now=now)
        ops.append(op)
        by_slug[slug] = op
        if item.topic_key is not None:
            by_topic.setdefault(item.topic_key, op)
    return _Plan(ops, deduped)


def _check_expected(
    expect: Expect | None, target: _Op | None, name: str | None, *, replaced: bool = False
) -> None:
    """Raise ``NoteChanged`` unless the note ``target`` writes over (as locked, or as this
    batch left it) is what the harvest that decided to write over it read. ``replaced``: the
    note holding the key is superseded, ``target`` the note that replaced it."""
    if expect is None:
        return
    current = None if target is None else target.current
    if target is None or current is None:
        if expect.text is None:
            return  # a topic key no note holds any more: the note is written anew
        why = "it is gone"
    elif (
        replaced
        or current["pinned"]
        or current["provenance"] == "user"
        or target.status == SUPERSEDED
    ):
        why = "it was pinned, written by a person or superseded since"
    elif expect.text is not None and (
        target.status != LIVE
        or (current["title"], current["body"], current["topics"] or "") != expect.text
    ):
        why = "it holds other text since, or is no longer live"
    else:
        return
    raise NoteChanged(f"the note {name!r} was not rewritten: {why}; nothing was written")


def _said(row: Mapping[str, Any]) -> datetime | None:
    """When a note's (or a write's) fact was said: its conversation's time, else when its
    text was written; UTC (SQLite hands back naive times)."""
    when = row.get("occurred_at") or row.get("updated_at")
    if isinstance(when, datetime) and when.tzinfo is None:
        return when.replace(tzinfo=UTC)
    return when if isinstance(when, datetime) else None


def _write_over(
    op: _Op,
    scope: Scope,
    item: Item,
    values: dict[str, Any],
    *,
    conversation_id: str | None,
    now: datetime,
) -> None:
    """Fold a later write of the same note into ``op``, keeping the text it replaces.

    Time order: a write whose fact was said before the note's current one (an old export
    imported after live use) does not replace the live text; its text goes into history at
    its place in time (reason ``older_fact``), the live text stays."""
    draft = item.draft
    said, held = _said(values) if "occurred_at" in values else None, None
    if op.current is not None and said is not None:
        held = _said(op.current)
    if held is not None and said is not None and said < held:
        if history.changes_text(op.current or {}, draft.title, draft.body):
            older = {
                **(op.current or {}),
                **{key: values[key] for key in _TEXT_KEYS if key in values},
                "updated_at": said,
            }
            change = history.Change("older_fact", str(values["provenance"]), conversation_id, now)
            op.versions.append(history.version_values(older, change))
        return
    op.rewritten = True
    if op.current is not None and history.changes_text(op.current, draft.title, draft.body):
        reason = history.upsert_reason(item.reason, explicit_slug=draft.slug is not None)
        change = history.Change(reason, str(values["provenance"]), conversation_id, now)
        op.versions.append(history.version_values(op.current, change))
    op.values.update(values)  # the later write wins, as in sequence
    op.current = {
        **(op.current or {}),
        **{key: op.values[key] for key in _TEXT_KEYS if key in op.values},
        "id": op.row_id,
        "scope_kind": scope.kind,
        "scope_id": scope.id,
        "slug": op.slug,
        "updated_at": now,
    }


# What a version needs of a planned write besides the note's identity.
_TEXT_KEYS = (
    "title",
    "body",
    "topics",
    "keywords",
    "topic_key",
    "type",
    "pinned",
    "confidence",
    "evidence",
    "provenance",
    "conversation_id",
    "occurred_at",
)


def _apply(
    session: Executor, scope: Scope, ops: list[_Op], *, rows: bool, at_commit: bool = False
) -> list[_Op]:
    """Write the planned rows and their terms; return the inserts a concurrent writer beat.

    With ``rows`` each op gets its row as written (RETURNING every column); with
    ``at_commit`` (``write_items``) the inserts may go with the COMMIT.
    """
    now = utcnow()
    for op in ops:
        # The note's text as this write leaves it (an update keeps what it does not set).
        op.postings = postings_of({**(op.current or {}), **op.values})
        op.values["search_length"] = op.postings.length
    updates = [op for op in ops if not op.inserted]
    changes = [
        {"id": op.row_id, **op.values, **({"status": LIVE} if op.revive and op.rewritten else {})}
        for op in updates
    ]
    if rows:
        for op, change in zip(updates, changes, strict=True):
            columns = {k: v for k, v in change.items() if k != "id"}
            op.row = _detached(
                session.execute(
                    update(_MEMORIES)
                    .where(_MEMORIES.c.id == op.row_id)
                    .values(columns)
                    .returning(*_MEMORIES.c)
                ).one()
            )
    elif updates:
        _update_by_id(session, changes)
    if updates:
        session.execute(
            delete(MemoryTerm).where(MemoryTerm.memory_id.in_([op.row_id for op in updates]))
        )
        delete_postings(session, [int(op.row_id or 0) for op in updates])
    inserts = [op for op in ops if op.inserted]
    retry: list[_Op] = []
    dialect = dialect_name(session)
    # PostgreSQL, rows not wanted (a harvest's batch): notes and terms in one statement.
    lean = not rows and dialect == "postgresql"
    # ... and sent with the COMMIT, saving their round trip, unless a version of a new note
    # needs its id now.
    late = (
        at_commit
        and lean
        and prepared.deferring(session)
        and not any(op.versions for op in inserts)
    )
    for start in range(0, len(inserts), BATCH_CHUNK):
        chunk = inserts[start : start + BATCH_CHUNK]
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
        if late:
            insert_notes_at_commit(
                session, scope, values, {op.slug: _terms(op) for op in chunk}, _postings(chunk)
            )
            continue
        if lean:
            terms = {op.slug: _terms(op) for op in chunk}
            returned = insert_notes(session, scope, values, terms, _postings(chunk))
        else:
            # executemany with RETURNING: one compiled statement, sent as multi-row INSERTs.
            stmt = _insert_statement(dialect, "updated_seq" in values[0], rows)
            returned = {row.slug: row for row in session.execute(stmt, values)}
        for op in chunk:
            if op.slug in returned:
                op.row_id = int(returned[op.slug].id)
                op.row = _detached(returned[op.slug]) if rows else None
            else:
                retry.append(op)
    insert_terms(
        session,
        scope,
        [
            (int(op.row_id), term)
            for op in ops
            if op not in retry and op.row_id is not None and not (lean and op.inserted)
            for term in _terms(op)
        ],
    )
    insert_postings(
        session,
        scope,
        [
            (int(op.row_id), op.postings)
            for op in ops
            if op not in retry
            and op.row_id is not None
            and op.postings is not None
            and not (lean and op.inserted)
        ],
    )
    # The texts the batch replaced (an inserted note's id is known only now).
    history.keep(
        session,
        [{**v, "memory_id": op.row_id} for op in ops if op not in retry for v in op.versions],
    )
    return retry


def _update_by_id(session: Executor, changes: list[dict[str, Any]]) -> None:
    """Update rows by their ``id``, one executemany a set of columns: Core's statement, so it
    runs on a connection as on a session (the ORM's bulk UPDATE by primary key needs a
    session, and a Core UPDATE given the same rows without its WHERE would update every
    note). Core sets the columns each row names."""
    by_columns: dict[frozenset[str], list[dict[str, Any]]] = {}
    for change in changes:
        row = {key: value for key, value in change.items() if key != "id"}
        by_columns.setdefault(frozenset(row), []).append({**row, "row_id": change["id"]})
    for rows in by_columns.values():
        session.execute(_UPDATE_BY_ID, rows)


def _postings(ops: Sequence[_Op]) -> dict[str, Postings]:
    """The search postings of inserted notes, by slug."""
    return {op.slug: op.postings for op in ops if op.postings is not None}


def _terms(op: _Op) -> list[str]:
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
