"""The job records: every queued transcript's state lives here, not in the broker.

States: ``pending`` (recorded, maybe on a queue) -> ``running`` -> ``done`` | ``failed``.
A worker that dies mid-job leaves it ``running``; the redelivered message claims it again
(harvesting is idempotent through the ledger). ``failed`` keeps the transcript and the reason
until ``reset`` puts it back to ``pending``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from store.models import DONE, FAILED, JOB_STATES, PENDING, RUNNING, ImportBatch, Job, utcnow


@dataclass(frozen=True)
class NewJob:
    """A transcript to record as a job; ``transcript`` is its redacted JSON form."""

    owner: str
    provenance: str
    conversation_id: str
    transcript: dict[str, Any]


@dataclass(frozen=True)
class ClaimedJob:
    id: str
    owner: str
    provenance: str
    transcript: dict[str, Any]
    attempts: int


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
    session: Session, queue: str, jobs: Sequence[NewJob], *, import_id: str | None = None
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
            "import_id": import_id,
            "attempts": 0,
            "created_at": now,
            "enqueued_at": now,
        }
        for job in jobs
    ]
    if rows:
        session.execute(insert(Job), rows)
    if import_id is not None:
        session.execute(
            update(ImportBatch)
            .where(ImportBatch.id == import_id)
            .values(total=ImportBatch.total + len(rows))
        )
    return [str(row["id"]) for row in rows]


_JOBS = cast(Table, Job.__table__)
# Built once: only the parameters change from job to job.
_CLAIM = (
    update(_JOBS)
    .where(_JOBS.c.id == bindparam("job_id"), _JOBS.c.state != DONE)
    .values(state=RUNNING, started_at=bindparam("now"), attempts=_JOBS.c.attempts + 1)
    .returning(_JOBS.c.id, _JOBS.c.owner, _JOBS.c.provenance, _JOBS.c.transcript, _JOBS.c.attempts)
)
_FINISH = (
    update(_JOBS)
    .where(_JOBS.c.id == bindparam("job_id"))
    .values(state=DONE, result=bindparam("outcome"), last_error=None, finished_at=bindparam("now"))
)


def claim(session: Session, job_id: str) -> ClaimedJob | None:
    """Mark a job running and count the attempt; None when it is done or gone (a no-op).

    A ``running`` job is claimed again: its worker died and the broker redelivered it. One
    statement: the row lock the UPDATE takes keeps a concurrent claim waiting until commit.
    """
    row = session.execute(_CLAIM, {"job_id": job_id, "now": utcnow()}).first()
    if row is None:
        return None
    found_id, owner, provenance, transcript, attempts = row
    return ClaimedJob(str(found_id), owner, provenance, dict(transcript), int(attempts))


def finish(session: Session, job_id: str, result: dict[str, Any]) -> None:
    session.execute(_FINISH, {"job_id": job_id, "outcome": result, "now": utcnow()})


def fail(session: Session, job_id: str, error: str) -> None:
    """Mark a job failed for good, keeping its transcript and the reason."""
    session.execute(
        update(Job)
        .where(Job.id == job_id)
        .values(state=FAILED, last_error=error[:4000], finished_at=utcnow())
    )


def reset(session: Session, job_ids: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """Put failed jobs (these, or all) back to pending; returns ``(id, queue)`` to enqueue."""
    stmt = select(Job.id, Job.queue).where(Job.state == FAILED)
    if job_ids is not None:
        stmt = stmt.where(Job.id.in_(list(job_ids)))
    found = [(str(i), str(q)) for i, q in session.execute(stmt).all()]
    if found:
        session.execute(
            update(Job)
            .where(Job.id.in_([i for i, _ in found]))
            .values(state=PENDING, enqueued_at=utcnow(), finished_at=None)
        )
    return found


def stale_pending(
    session: Session, older_than: timedelta, limit: int = 1_000
) -> list[tuple[str, str]]:
    """Pending jobs enqueued longer ago than ``older_than`` (their message may be lost);
    their ``enqueued_at`` is renewed so the next sweep does not send them twice."""
    cutoff = utcnow() - older_than
    found = [
        (str(i), str(q))
        for i, q in session.execute(
            select(Job.id, Job.queue)
            .where(Job.state == PENDING, Job.enqueued_at < cutoff)
            .order_by(Job.enqueued_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        ).all()
    ]
    if found:
        session.execute(
            update(Job).where(Job.id.in_([i for i, _ in found])).values(enqueued_at=utcnow())
        )
    return found


def counts(session: Session, import_id: str | None = None) -> dict[str, int]:
    """Jobs by state (every state present, zero when none)."""
    stmt = select(Job.state, func.count()).group_by(Job.state)
    if import_id is not None:
        stmt = stmt.where(Job.import_id == import_id)
    found = {str(state): int(n) for state, n in session.execute(stmt).all()}
    return {state: found.get(state, 0) for state in JOB_STATES}


def counts_by_queue(session: Session) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for queue, state, n in session.execute(
        select(Job.queue, Job.state, func.count()).group_by(Job.queue, Job.state)
    ).all():
        out.setdefault(str(queue), dict.fromkeys(JOB_STATES, 0))[str(state)] = int(n)
    return out


def oldest_pending(session: Session) -> datetime | None:
    value = session.execute(select(func.min(Job.enqueued_at)).where(Job.state == PENDING)).scalar()
    return value if value is None or value.tzinfo else value.replace(tzinfo=utcnow().tzinfo)


def failures(session: Session, limit: int = 20) -> list[dict[str, Any]]:
    """The most recent failed jobs: id, queue, owner, conversation, attempts, error."""
    rows = session.execute(
        select(
            Job.id,
            Job.queue,
            Job.owner,
            Job.conversation_id,
            Job.attempts,
            Job.last_error,
            Job.finished_at,
        )
        .where(Job.state == FAILED)
        .order_by(Job.finished_at.desc())
        .limit(limit)
    ).all()
    return [
        {
            "id": r[0],
            "queue": r[1],
            "owner": r[2],
            "conversation_id": r[3],
            "attempts": r[4],
            "error": r[5],
            "finished_at": r[6].isoformat() if r[6] else None,
        }
        for r in rows
    ]


def import_progress(session: Session, import_id: str) -> dict[str, Any]:
    batch = session.get(ImportBatch, import_id)
    if batch is None:
        return {}
    by_state = counts(session, import_id)
    finished = by_state[DONE] + by_state[FAILED]
    return {
        "import_id": import_id,
        "source": batch.source,
        "total": batch.total,
        "unreadable": batch.unreadable,
        **by_state,
        "finished": finished,
        "percent": 100.0 if batch.total == 0 else round(100.0 * finished / batch.total, 1),
    }


def import_totals(session: Session, import_id: str) -> dict[str, int]:
    """Sums over the finished jobs of an import: notes, model usage, transcripts skipped."""
    keys = (
        "notes_written",
        "notes_updated",
        "notes_skipped",
        "model_calls",
        "prompt_tokens",
        "completion_tokens",
    )
    totals = dict.fromkeys((*keys, "skipped"), 0)
    results = session.execute(
        select(Job.result).where(Job.import_id == import_id, Job.state == DONE)
    ).scalars()
    for result in results:
        found = result or {}
        for key in keys:
            totals[key] += int(found.get(key, 0))
        totals["skipped"] += found.get("status") == "skipped"
    return totals
