"""Reports over the job records: counts by state and queue, running jobs with their
heartbeat, failures, an import's progress, its done jobs' results and what its jobs cost."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    func,
    select,
)
from sqlalchemy.orm import Session

from store.models import DONE, FAILED, JOB_STATES, PENDING, RUNNING, ImportBatch, Job, utcnow


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


def _aware(value: datetime) -> datetime:
    # SQLite hands timestamps back without their zone; they were written in UTC.
    return value if value.tzinfo else value.replace(tzinfo=utcnow().tzinfo)


def oldest_pending(session: Session) -> datetime | None:
    value = session.execute(select(func.min(Job.enqueued_at)).where(Job.state == PENDING)).scalar()
    return None if value is None else _aware(value)


def running(session: Session, lease: timedelta, limit: int = 20) -> list[dict[str, Any]]:
    """The longest-running jobs: id, queue, seconds since the claim, seconds since the last
    heartbeat, and whether the lease ran out (the sweep will recover it). No owner, no text."""
    now = utcnow()
    rows = session.execute(
        select(Job.id, Job.queue, Job.started_at, Job.heartbeat_at)
        .where(Job.state == RUNNING)
        .order_by(Job.started_at)
        .limit(limit)
    ).all()
    out = []
    for job_id, queue, started_at, heartbeat_at in rows:
        age = None if heartbeat_at is None else (now - _aware(heartbeat_at)).total_seconds()
        out.append(
            {
                "id": str(job_id),
                "queue": str(queue),
                "running_seconds": None
                if started_at is None
                else round((now - _aware(started_at)).total_seconds(), 1),
                "heartbeat_age_seconds": None if age is None else round(age, 1),
                "lease_expired": age is None or age > lease.total_seconds(),
            }
        )
    return out


def failures(session: Session, limit: int = 20) -> list[dict[str, Any]]:
    """The most recent failed jobs: id, queue, owner, conversation, attempts, error, and what
    their runs cost the model."""
    rows = session.execute(
        select(
            Job.id,
            Job.queue,
            Job.owner,
            Job.conversation_id,
            Job.attempts,
            Job.last_error,
            Job.finished_at,
            Job.model_calls,
            Job.prompt_tokens,
            Job.completion_tokens,
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
            "model_calls": int(r[7]),
            "prompt_tokens": int(r[8]),
            "completion_tokens": int(r[9]),
        }
        for r in rows
    ]


# The shortest id prefix taken for an import (the progress line shows 8 characters).
MIN_IMPORT_PREFIX = 4


def find_import(session: Session, id_or_prefix: str) -> list[str]:
    """The imports whose id is ``id_or_prefix`` or (at least MIN_IMPORT_PREFIX characters)
    starts with it: one id when it names one import, several when the prefix is ambiguous
    (at most two are read), none when nothing matches."""
    if session.get(ImportBatch, id_or_prefix) is not None:
        return [id_or_prefix]
    prefix = id_or_prefix.lower()
    if len(prefix) < MIN_IMPORT_PREFIX or not all(c in "0123456789abcdef" for c in prefix):
        return []
    rows = session.execute(
        select(ImportBatch.id)
        .where(ImportBatch.id.like(f"{prefix}%"))
        .order_by(ImportBatch.id)
        .limit(2)
    ).scalars()
    return [str(found) for found in rows]


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


def cost_by_state(session: Session) -> dict[str, dict[str, int]]:
    """Model calls and tokens every run of the jobs cost, by job state (failed runs too)."""
    rows = session.execute(
        select(
            Job.state,
            func.sum(Job.model_calls),
            func.sum(Job.prompt_tokens),
            func.sum(Job.completion_tokens),
        ).group_by(Job.state)
    )
    return {
        str(state): {
            "model_calls": int(calls or 0),
            "prompt_tokens": int(prompt or 0),
            "completion_tokens": int(completion or 0),
        }
        for state, calls, prompt, completion in rows
    }


def done_results(session: Session, import_id: str) -> Iterator[dict[str, Any]]:
    """The stored result (the harvest's outcome) of each done job of an import."""
    results = session.execute(
        select(Job.result).where(Job.import_id == import_id, Job.state == DONE)
    ).scalars()
    return (result or {} for result in results)


def import_usage(session: Session, import_id: str) -> dict[str, int]:
    """Model calls and tokens every run of an import's done and failed jobs cost."""
    calls, prompt, completion = session.execute(
        select(
            func.coalesce(func.sum(Job.model_calls), 0),
            func.coalesce(func.sum(Job.prompt_tokens), 0),
            func.coalesce(func.sum(Job.completion_tokens), 0),
        ).where(Job.import_id == import_id, Job.state.in_((DONE, FAILED)))
    ).one()
    return {
        "model_calls": int(calls),
        "prompt_tokens": int(prompt),
        "completion_tokens": int(completion),
    }
