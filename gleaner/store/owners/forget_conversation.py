"""Forgetting one conversation of an owner: what only it supports goes, what it changed goes
back to the text before.

``forget_conversation`` runs in the caller's transaction, after the owner's forget lock
(``forget.lock_out``: no harvest of the owner records notes meanwhile) and its scope's
supersede lock (no dedupe or link supersedes meanwhile):

- A note whose live text the conversation wrote (``memories.conversation_id``) gets back the
  latest of its earlier versions another writer wrote (another conversation, or a person or
  a program: conversation NULL), latest by when its fact was said (the version's
  ``occurred_at``, else when it was written), as ``store.notes.writer`` would have kept it:
  its content hash, term index and search postings follow the text, and its vector goes (it
  is embedded again). Without such a version the note is deleted, with its links, terms,
  postings, vector and history; a note it superseded is live again.
- Every history entry the conversation wrote goes, whoever wrote the note's live text.
  Entries holding another writer's text that the conversation replaced stay: that text is
  not the conversation's (the one restored as the live text leaves history).
- Its jobs (with their transcripts) and ledger rows go, each transcript leaving a tombstone,
  so the same transcript submitted again writes nothing; an import that held one of the jobs
  counts one job fewer. Housekeeping results drop their reported pairs.
- Its forget count grows (``forget.GENERATION``): a harvest of it planned before writes
  nothing when it ends. Other conversations of the owner, and other owners' conversations
  with the same id, are not touched.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, delete, exists, func, or_, select, update
from sqlalchemy.orm import Session

from gleaner.store.errors import NotFound
from gleaner.store.notes.fact_terms import similarity_terms
from gleaner.store.notes.supersede import lock_scopes
from gleaner.store.notes.term_index import insert_terms
from gleaner.store.owners.forget import (
    check_conversation_id,
    conversation_key,
    count,
    lock_out,
    owner_key,
    scrub_housekeeping,
    transcript_key,
)
from gleaner.store.recall.search_index import (
    Postings,
    delete_postings,
    insert_postings,
    postings_of,
)
from gleaner.store.schema.models import Link, Memory, MemoryTerm, MemoryVersion
from gleaner.store.schema.records import (
    ForgottenConversation,
    ForgottenTranscript,
    HarvestLedger,
    ImportBatch,
    Job,
)
from gleaner.store.schema.sql import ID_CHUNK, dialect_insert, next_seqs
from gleaner.store.schema.tables import LIVE, MEMORIES, MEMORY_VECTORS, SUPERSEDED, utcnow
from gleaner.store.schemas import Scope
from gleaner.store.text import content_hash, quoted

# The receipt's counts, in the order they are shown.
RECEIPT = (
    "notes_deleted",  # notes only the conversation supported
    "notes_restored",  # notes whose text went back to an earlier writer's
    "notes_revived",  # notes a deleted note superseded, live again
    "versions",  # history entries deleted
    "links",
    "vectors",
    "ledger",
    "jobs",
    "tombstones",
)
# Tables whose dead rows a PostgreSQL forget of a conversation vacuums after its commit.
VACUUMED = (
    "memories",
    "memory_versions",
    "memory_terms",
    "search_postings",
    "memory_vectors",
    "memory_links",
    "harvest_ledger",
    "jobs",
)


@dataclass(frozen=True)
class _Restore:
    """A note to give back an earlier text: the version row that holds it."""

    note_id: int
    version: MemoryVersion


def forget_conversation(session: Session, principal: str, conversation_id: str) -> dict[str, int]:
    """Forget one conversation of ``principal`` (see the module's docstring); the counts by
    ``RECEIPT``. NotFound, with nothing changed, when no note, history entry, job or ledger
    row of the owner names the conversation."""
    scope = Scope.owner(principal)
    conversation_id = check_conversation_id(conversation_id)
    lock_out(session, scope)
    # Dedupe and links check a pair under this lock before they supersede: none pairs a note
    # with one deleted here.
    lock_scopes(session, [scope])
    if not _known(session, scope, conversation_id):
        raise NotFound(
            f"owner {quoted(scope.id)} has no conversation {quoted(conversation_id)} "
            "(no note, history entry, job or ledger row names it)"
        )
    now = utcnow()
    counts = dict.fromkeys(RECEIPT, 0)
    counts["tombstones"] = _bury(session, scope, conversation_id, now)
    _count_forget(session, scope, conversation_id, now)

    restores, doomed = _plan(session, scope, conversation_id)
    _restore(session, scope, restores, now)
    counts["notes_restored"] = len(restores)
    counts["vectors"] = _delete_in(
        session, MEMORY_VECTORS, MEMORY_VECTORS.c.memory_id, [r.note_id for r in restores] + doomed
    )
    # Its own history entries, on any note, and the versions now live again.
    counts["versions"] = count(
        session,
        delete(MemoryVersion).where(
            MemoryVersion.scope_kind == scope.kind,
            MemoryVersion.scope_id == scope.id,
            MemoryVersion.written_conversation_id == conversation_id,
        ),
    ) + _delete_in(session, MemoryVersion, MemoryVersion.id, [r.version.id for r in restores])
    counts["notes_revived"] = _revive(session, doomed, now)
    counts["links"] = _delete_in(session, Link, Link.from_id, doomed) + _delete_in(
        session, Link, Link.to_id, doomed
    )
    counts["versions"] += _delete_in(session, MemoryVersion, MemoryVersion.memory_id, doomed)
    # No deleted row may point at another one deleted; terms and postings go with the notes
    # (ON DELETE CASCADE).
    for chunk in _chunks(sorted(doomed)):
        session.execute(update(Memory).where(Memory.id.in_(chunk)).values(superseded_by_id=None))
    counts["notes_deleted"] = _delete_in(session, Memory, Memory.id, doomed)

    counts["jobs"] = _delete_jobs(session, scope, conversation_id)
    counts["ledger"] = count(
        session,
        delete(HarvestLedger).where(
            *_in_ledger(scope), HarvestLedger.conversation_id == conversation_id
        ),
    )
    scrub_housekeeping(session)
    return counts


def _in_ledger(scope: Scope) -> tuple[Any, ...]:
    return (HarvestLedger.scope_kind == scope.kind, HarvestLedger.scope_id == scope.id)


def _known(session: Session, scope: Scope, conversation_id: str) -> bool:
    """Whether anything of the owner names the conversation."""
    wrote = exists().where(
        Memory.scope_kind == scope.kind,
        Memory.scope_id == scope.id,
        Memory.conversation_id == conversation_id,
    )
    kept = exists().where(
        MemoryVersion.scope_kind == scope.kind,
        MemoryVersion.scope_id == scope.id,
        or_(
            MemoryVersion.written_conversation_id == conversation_id,
            MemoryVersion.changed_conversation_id == conversation_id,
        ),
    )
    harvested = exists().where(*_in_ledger(scope), HarvestLedger.conversation_id == conversation_id)
    queued = exists().where(Job.owner == scope.id, Job.conversation_id == conversation_id)
    return bool(session.execute(select(or_(wrote, kept, harvested, queued))).scalar_one())


def _bury(session: Session, scope: Scope, conversation_id: str, now: datetime) -> int:
    """A tombstone for each transcript of the conversation, harvested (the ledger) or still
    waiting or running (jobs); how many."""
    harvested = session.execute(
        select(HarvestLedger.transcript_hash).where(
            *_in_ledger(scope), HarvestLedger.conversation_id == conversation_id
        )
    ).scalars()
    waiting = session.execute(
        select(Job.transcript_hash).where(
            Job.owner == scope.id,
            Job.conversation_id == conversation_id,
            Job.transcript_hash.is_not(None),
        )
    ).scalars()
    digests = sorted({str(d) for d in (*harvested, *waiting)})
    owner = owner_key(scope)
    rows = [
        {"key": transcript_key(scope, d), "owner_key": owner, "forgotten_at": now} for d in digests
    ]
    if rows:
        session.execute(dialect_insert(session, ForgottenTranscript).on_conflict_do_nothing(), rows)
    return len(rows)


def _count_forget(session: Session, scope: Scope, conversation_id: str, now: datetime) -> None:
    """One more forget of the conversation: a harvest of it planned before writes nothing."""
    session.execute(
        dialect_insert(session, ForgottenConversation)
        .values(key=conversation_key(scope, conversation_id), generation=1, forgotten_at=now)
        .on_conflict_do_update(
            index_elements=["key"],
            set_={"generation": ForgottenConversation.generation + 1, "forgotten_at": now},
        )
    )


def _plan(session: Session, scope: Scope, conversation_id: str) -> tuple[list[_Restore], list[int]]:
    """The notes whose live text the conversation wrote, locked: those that get an earlier
    writer's text back, and the ids of those to delete."""
    note_ids = (
        session.execute(
            select(Memory.id)
            .where(
                Memory.scope_kind == scope.kind,
                Memory.scope_id == scope.id,
                Memory.conversation_id == conversation_id,
            )
            .order_by(Memory.id)
            .with_for_update()
        )
        .scalars()
        .all()
    )
    others: dict[int, list[MemoryVersion]] = {}
    for chunk in _chunks(note_ids):
        rows = session.execute(
            select(MemoryVersion).where(
                MemoryVersion.memory_id.in_(chunk),
                # IS DISTINCT FROM: a person's or a program's text (NULL) is another writer's.
                MemoryVersion.written_conversation_id.is_distinct_from(conversation_id),
            )
        ).scalars()
        for version in rows:
            others.setdefault(version.memory_id, []).append(version)
    restores = [
        _Restore(note_id, max(others[note_id], key=_said))
        for note_id in note_ids
        if note_id in others
    ]
    doomed = [note_id for note_id in note_ids if note_id not in others]
    return restores, doomed


def _said(version: MemoryVersion) -> tuple[datetime, int]:
    """When a version's fact was said (else when it was written), then its order."""
    at = version.occurred_at or version.written_at
    return (at if at.tzinfo is not None else at.replace(tzinfo=UTC)), version.id


def _restore(session: Session, scope: Scope, restores: Sequence[_Restore], now: datetime) -> None:
    """Give each note its version's text back, with what the writer keeps in step with the
    text (content hash, term index, search postings); the note keeps its slug, topic key,
    status, pinning and source."""
    if not restores:
        return
    ids = [r.note_id for r in restores]
    topic_keys: dict[int, str | None] = {}
    for chunk in _chunks(ids):
        found = session.execute(select(Memory.id, Memory.topic_key).where(Memory.id.in_(chunk)))
        topic_keys.update((int(note_id), key) for note_id, key in found)
    _delete_in(session, MemoryTerm, MemoryTerm.memory_id, ids)
    delete_postings(session, ids)
    changes: list[dict[str, Any]] = []
    terms: list[tuple[int, str]] = []
    postings: list[tuple[int, Postings]] = []
    for restore, seq in zip(restores, next_seqs(session, len(restores)), strict=True):
        v = restore.version
        text = {
            "title": v.title,
            "body": v.body,
            "topics": v.topics,
            "keywords": v.keywords,
            "topic_key": topic_keys.get(restore.note_id),
        }
        indexed = postings_of(text)
        note_terms = sorted(similarity_terms(v.title, v.topics))
        changes.append(
            {
                "row_id": restore.note_id,
                "title": v.title,
                "body": v.body,
                "topics": v.topics,
                "keywords": v.keywords,
                "type": v.type,
                "confidence": v.confidence,
                "evidence": v.evidence,
                "provenance": v.written_provenance,
                "conversation_id": v.written_conversation_id,
                "occurred_at": v.occurred_at,
                "content_hash": content_hash(v.body),
                "term_count": len(note_terms),
                "search_length": indexed.length,
                "updated_at": now,
                "updated_seq": seq,
            }
        )
        terms.extend((restore.note_id, term) for term in note_terms)
        postings.append((restore.note_id, indexed))
    session.execute(_RESTORE, changes)
    insert_terms(session, scope, terms)
    insert_postings(session, scope, postings)


# The columns a restore sets: the version's text and who wrote it, and what the writer keeps
# in step with the text.
_RESTORED = (
    "title",
    "body",
    "topics",
    "keywords",
    "type",
    "confidence",
    "evidence",
    "provenance",
    "conversation_id",
    "occurred_at",
    "content_hash",
    "term_count",
    "search_length",
    "updated_at",
    "updated_seq",
)
_RESTORE = (
    update(MEMORIES)
    .where(MEMORIES.c.id == bindparam("row_id"))
    .values({key: bindparam(key, type_=MEMORIES.c[key].type) for key in _RESTORED})
)


def _revive(session: Session, doomed: Sequence[int], now: datetime) -> int:
    """Make live again the notes a deleted note superseded (nothing supersedes them now);
    how many."""
    gone = set(doomed)
    revived: list[int] = []
    for chunk in _chunks(sorted(gone)):
        found = session.execute(
            select(Memory.id).where(Memory.superseded_by_id.in_(chunk), Memory.status == SUPERSEDED)
        ).scalars()
        revived.extend(note_id for note_id in found if note_id not in gone)
    revived.sort()
    if revived:
        session.execute(
            update(MEMORIES).where(MEMORIES.c.id == bindparam("row_id")),
            [
                {
                    "row_id": note_id,
                    "status": LIVE,
                    "superseded_by_id": None,
                    "updated_at": now,
                    "updated_seq": seq,
                }
                for note_id, seq in zip(revived, next_seqs(session, len(revived)), strict=True)
            ],
        )
    return len(revived)


def _delete_jobs(session: Session, scope: Scope, conversation_id: str) -> int:
    """Delete the conversation's jobs (their transcripts with them); an import that held one
    counts one fewer, so it is still finished once its other jobs are."""
    mine = (Job.owner == scope.id, Job.conversation_id == conversation_id)
    held = session.execute(
        select(Job.import_id, func.count())
        .where(*mine, Job.import_id.is_not(None))
        .group_by(Job.import_id)
    )
    by_import = {str(import_id): int(n) for import_id, n in held}
    for import_id, n in by_import.items():
        session.execute(
            update(ImportBatch)
            .where(ImportBatch.id == import_id)
            .values(total=ImportBatch.total - n)
        )
    return count(session, delete(Job).where(*mine))


def _chunks(ids: Sequence[int]) -> Iterator[Sequence[int]]:
    for start in range(0, len(ids), ID_CHUNK):
        yield ids[start : start + ID_CHUNK]


def _delete_in(session: Session, table: Any, column: Any, ids: Iterable[int]) -> int:
    """Delete the rows of ``table`` whose ``column`` is one of ``ids``; how many."""
    found = sorted(set(ids))
    return sum(count(session, delete(table).where(column.in_(chunk))) for chunk in _chunks(found))
