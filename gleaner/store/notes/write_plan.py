"""The writer's plan: the rows a batch writes, as the items' single writes in order would
leave them (``store.notes.writer`` runs the plan).

Each item either lands on a note (an explicit slug or a topic key already held, stored or
written earlier in the batch: an update, ``Op.row_id`` set) or becomes a new note under its
slug (explicit, or derived and made free: ``base``, ``base-2``, ...). A later write of the
same note is folded into its ``Op``, keeping the text it replaces as a history version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gleaner.store.errors import NoteChanged
from gleaner.store.notes.drafts import base_slug_of, draft_columns
from gleaner.store.notes.history import (
    VERSIONED,
    Change,
    changes_text,
    upsert_reason,
    version_values,
)
from gleaner.store.notes.terms import similarity_terms
from gleaner.store.notes.write_item import Expect, Item, Written
from gleaner.store.notes.write_lookup import (
    SUPERSEDED_HOLDER,
    Found,
    free_slug,
    lookup,
    session_twin,
)
from gleaner.store.recall.search_index import Postings
from gleaner.store.schema.models import ARCHIVED, LIVE, SUPERSEDED, utcnow
from gleaner.store.schema.sql import Executor
from gleaner.store.schemas import Scope


@dataclass(eq=False)
class Op:
    """One row the batch writes: an update of ``row_id`` or, without one, an insert."""

    slug: str
    values: dict[str, Any]
    items: list[int]  # positions of the items folded into this row, in order
    row_id: int | None = None
    status: str = LIVE  # the stored note's, when this op updates one
    revive: bool = False  # an archived note rewritten is live again
    rewritten: bool = False  # some write changes its live text (not only its history)
    inserted: bool = False
    # The note's text as the last write left it (``VERSIONED`` columns), and the
    # versions its writes replace (``memory_id`` filled in once an inserted row has an id).
    current: dict[str, Any] | None = None
    versions: list[dict[str, Any]] = field(default_factory=list)
    row: Any = None  # with ``rows``: the row as written (a detached ``Memory``)
    postings: Postings | None = None  # the note's search index rows, set by the writer


@dataclass
class Plan:
    ops: list[Op]
    deduped: dict[int, Written]


@dataclass(frozen=True)
class Context:
    """What every item of one batch is written with."""

    scope: Scope
    conversation_id: str | None = None
    occurred_at: datetime | None = None
    session_id: str | None = None


def plan(
    session: Executor,
    context: Context,
    pending: Sequence[tuple[int, Item]],
    *,
    lost: set[str],
    optimistic: bool,
) -> Plan:
    """The rows to write for ``pending`` (``(position, item)``), simulating the items'
    single writes in order. ``lost``: slugs a concurrent writer took since an earlier
    attempt; ``optimistic``: derived slugs are not looked up (a single write inserts first)."""
    found = lookup(session, context.scope, [item for _, item in pending], bases=not optimistic)
    planner = _Planner(session, context, found, lost)
    for n, item in pending:
        planner.add(n, item)
    return Plan(planner.ops, planner.deduped)


class _Planner:
    """The batch's notes as its items, taken in order, leave them."""

    def __init__(self, session: Executor, context: Context, found: Found, lost: set[str]) -> None:
        self.session, self.context = session, context
        self.stored_by_slug, self.stored_by_topic, taken = found
        self.taken = taken | lost
        self.now = utcnow()
        self.ops: list[Op] = []
        self.deduped: dict[int, Written] = {}
        self.by_slug: dict[str, Op] = {}
        self.by_topic: dict[str, Op] = {}
        self.by_row: dict[int, Op] = {}
        self.given = {
            name: value
            for name, value in (
                ("conversation_id", context.conversation_id),
                ("occurred_at", context.occurred_at),
                ("session_id", context.session_id),
            )
            if value is not None
        }

    def add(self, n: int, item: Item) -> None:
        """Plan item ``n``: over the note it lands on, else as a new note."""
        draft = item.draft
        terms = similarity_terms(draft.title, draft.topics)
        values = {**draft_columns(draft, item.provenance, self.now, len(terms)), **self.given}
        if item.note_type is not None:
            values["type"] = item.note_type
        target = self._target(item)
        # A key whose note is superseded: the target is the note that replaced it.
        replaced = draft.slug is None and SUPERSEDED_HOLDER in self.stored_by_topic.get(
            item.topic_key or "", {}
        )
        check_expected(item.expect, target, draft.slug or item.topic_key, replaced=replaced)
        if target is None:
            self._create(n, item, values)
            return
        self._write_over(target, item, values)
        target.items.append(n)

    def _target(self, item: Item) -> Op | None:
        """The op of the note ``item`` lands on (written earlier in the batch, or stored)."""
        slug, key = item.draft.slug, item.topic_key
        if slug is not None:
            if slug not in self.by_slug and slug in self.stored_by_slug:
                self.by_slug[slug] = self._update_op(self.stored_by_slug[slug])
            return self.by_slug.get(slug)
        if key is None:
            return None
        if key not in self.by_topic and key in self.stored_by_topic:
            target = self._update_op(self.stored_by_topic[key])
            self.by_topic[key] = self.by_slug[target.slug] = target
        return self.by_topic.get(key)

    def _update_op(self, row: dict[str, Any]) -> Op:
        """The op updating the stored note ``row`` (one per note, however many items)."""
        row_id = int(row["id"])
        if row_id not in self.by_row:
            self.by_row[row_id] = op = Op(
                row["slug"],
                {},
                [],
                row_id=row_id,
                status=row["status"],
                # A superseded note whose superseder is gone replaces nothing any more.
                revive=row["status"] == ARCHIVED
                or (row["status"] == SUPERSEDED and row["superseded_by_id"] is None),
                current={c.key: row[c.key] for c in VERSIONED},
            )
            self.ops.append(op)
        return self.by_row[row_id]

    def _create(self, n: int, item: Item, values: dict[str, Any]) -> None:
        """Plan item ``n`` as a new note under a free slug, unless a twin of its session
        holds the same content (``deduped``)."""
        context, draft = self.context, item.draft
        base = draft.slug or base_slug_of(draft.title, item.topic_key)
        if context.session_id is not None and item.topic_key is None and base in self.taken:
            twin = session_twin(
                self.session, context.scope, context.session_id, values["content_hash"]
            )
            if twin is not None:
                self.deduped[n] = Written("deduped", *twin)
                return
        slug = draft.slug or free_slug(base, self.taken)
        self.taken.add(slug)
        row = {
            **values,
            "type": item.note_type,
            "topic_key": item.topic_key,
            "conversation_id": context.conversation_id,
            "occurred_at": context.occurred_at,
            "session_id": context.session_id,
        }
        op = Op(slug, row, [n], inserted=True)
        self._write_over(op, item, {})
        self.ops.append(op)
        self.by_slug[slug] = op
        if item.topic_key is not None:
            self.by_topic.setdefault(item.topic_key, op)

    def _write_over(self, op: Op, item: Item, values: dict[str, Any]) -> None:
        """Fold a later write of the same note into ``op``, keeping the text it replaces.

        Time order: a write whose fact was said before the note's current one (an old
        export imported after live use) does not replace the live text; its text goes into
        history at its place in time (reason ``older_fact``), the live text stays."""
        draft, conversation_id = item.draft, self.context.conversation_id
        said = _said(values) if "occurred_at" in values else None
        held = _said(op.current) if op.current is not None and said is not None else None
        if held is not None and said is not None and said < held:
            self._keep_older(op, item, values, said)
            return
        op.rewritten = True
        if op.current is not None and changes_text(op.current, draft.title, draft.body):
            reason = upsert_reason(item.reason, explicit_slug=draft.slug is not None)
            change = Change(reason, str(values["provenance"]), conversation_id, self.now)
            op.versions.append(version_values(op.current, change))
        op.values.update(values)  # the later write wins, as in sequence
        op.current = {
            **(op.current or {}),
            **_text_of(op.values),
            "id": op.row_id,
            "scope_kind": self.context.scope.kind,
            "scope_id": self.context.scope.id,
            "slug": op.slug,
            "updated_at": self.now,
        }

    def _keep_older(self, op: Op, item: Item, values: dict[str, Any], said: datetime) -> None:
        """Keep a write of a fact said ``said``, before the note's, as a history version of
        ``op``'s note at its place in time."""
        current = op.current or {}
        if changes_text(current, item.draft.title, item.draft.body):
            older = {**current, **_text_of(values), "updated_at": said}
            change = Change(
                "older_fact", str(values["provenance"]), self.context.conversation_id, self.now
            )
            op.versions.append(version_values(older, change))


def check_expected(
    expect: Expect | None, target: Op | None, name: str | None, *, replaced: bool = False
) -> None:
    """Raise ``NoteChanged`` unless the note ``target`` writes over (as locked, or as this
    batch left it) is what the harvest that decided to write over it read. ``replaced``: the
    note holding the key is superseded, ``target`` the note that replaced it."""
    if expect is None:
        return
    why = _changed(expect, target, replaced=replaced)
    if why is not None:
        raise NoteChanged(f"the note {name!r} was not rewritten: {why}; nothing was written")


def _changed(expect: Expect, target: Op | None, *, replaced: bool) -> str | None:
    """Why the note ``target`` is not the one ``expect`` describes, or None when it is."""
    current = None if target is None else target.current
    if target is None or current is None:
        # A topic key no note holds any more: the note is written anew.
        return None if expect.text is None else "it is gone"
    if (
        replaced
        or current["pinned"]
        or current["provenance"] == "user"
        or target.status == SUPERSEDED
    ):
        return "it was pinned, written by a person or superseded since"
    if expect.text is not None and (
        target.status != LIVE
        or (current["title"], current["body"], current["topics"] or "") != expect.text
    ):
        return "it holds other text since, or is no longer live"
    return None


def _said(row: Mapping[str, Any]) -> datetime | None:
    """When a note's (or a write's) fact was said: its conversation's time, else when its
    text was written; UTC (SQLite hands back naive times)."""
    when = row.get("occurred_at") or row.get("updated_at")
    if isinstance(when, datetime) and when.tzinfo is None:
        return when.replace(tzinfo=UTC)
    return when if isinstance(when, datetime) else None


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


def _text_of(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: values[key] for key in _TEXT_KEYS if key in values}
