"""Recording new work: an import batch, and its transcripts as pending jobs in one statement.
``store.jobs.queue`` (the records' life after) re-exports these names."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Insert,
    bindparam,
    insert,
    update,
)
from sqlalchemy.orm import Session

from gleaner.store.schema.records import ImportBatch, Job
from gleaner.store.schema.tables import JOBS, PENDING, utcnow

if TYPE_CHECKING:
    from gleaner.store.schema.sql import Executor


@dataclass(frozen=True)
class NewJob:
    """A transcript to record as a job; ``transcript`` is its redacted JSON form."""

    owner: str
    provenance: str
    conversation_id: str
    transcript: dict[str, Any]
    transcript_hash: str | None = None


def new_id() -> str:
    return uuid.uuid4().hex


def create_import(
    session: Session, *, source: str, owner: str, provenance: str, unreadable: int = 0
) -> str:
    """Record a bulk import; its jobs are added with ``add_jobs(import_id=...)``."""
    import_id = new_id()
    session.add(
        ImportBatch(
            id=import_id,
            source=source,
            owner=owner,
            provenance=provenance,
            total=0,
            unreadable=unreadable,
            created_at=utcnow(),
        )
    )
    session.flush()
    return import_id


def add_jobs(
    session: Executor, queue: str, jobs: Sequence[NewJob], *, import_id: str | None = None
) -> list[str]:
    """Record pending jobs in one statement; returns their ids (to enqueue after commit)."""
    now = utcnow()
    rows = [
        {
            "id": new_id(),
            "queue": queue,
            "state": PENDING,
            "owner": job.owner,
            "provenance": job.provenance,
            "conversation_id": job.conversation_id[:255],
            "transcript": job.transcript,
            "transcript_hash": job.transcript_hash,
            "import_id": import_id,
            "attempts": 0,
            # Given, not left to the column defaults: the one-row INSERT binds every column.
            "crashes": 0,
            "model_calls": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "created_at": now,
            "enqueued_at": now,
        }
        for job in jobs
    ]
    if len(rows) == 1:  # a conversation posted to the service: built once
        session.execute(_insert_one(tuple(rows[0])), rows[0])
    elif rows:
        session.execute(insert(Job), rows)
    if import_id is not None:
        session.execute(
            update(ImportBatch)
            .where(ImportBatch.id == import_id)
            .values(total=ImportBatch.total + len(rows))
        )
    return [str(row["id"]) for row in rows]


@functools.cache
def _insert_one(columns: tuple[str, ...]) -> Insert:
    """One job row with exactly these ``columns``, each bound with its column's type (the
    transcript's JSON): add_jobs gives every column that has a Python default, which the
    statement built once binds explicitly."""
    return insert(JOBS).values({name: bindparam(name, type_=JOBS.c[name].type) for name in columns})
