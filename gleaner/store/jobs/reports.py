"""Reports over the job records: counts by state and queue, running jobs with their
heartbeat, failures, an import's progress, its done jobs' results, what its jobs cost, and
the harvest ledger's totals.

Core reads of ``store.schema.tables`` (no ORM: ``gleaner status`` imports this module); each takes a
Core connection or a session.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, func, select

from gleaner.store.schema.sql import lease_now
from gleaner.store.schema.tables import (
    DONE,
    FAILED,
    HARVEST_LEDGER,
    IMPORTS,
    JOB_STATES,
    JOBS,
    PENDING,
    RUNNING,
    utcnow,
)

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


def counts(conn: Connection | Session, import_id: str | None = None) -> dict[str, int]:
    """Jobs by state (every state present, zero when none)."""
    stmt = select(JOBS.c.state, func.count()).group_by(JOBS.c.state)
    if import_id is not None:
        stmt = stmt.where(JOBS.c.import_id == import_id)
    found = {str(state): int(n) for state, n in conn.execute(stmt).all()}
    return {state: found.get(state, 0) for state in JOB_STATES}


def counts_by_queue(conn: Connection | Session) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for queue, state, n in conn.execute(
        select(JOBS.c.queue, JOBS.c.state, func.count()).group_by(JOBS.c.queue, JOBS.c.state)
    ).all():
        out.setdefault(str(queue), dict.fromkeys(JOB_STATES, 0))[str(state)] = int(n)
    return out


def _aware(value: datetime) -> datetime:
    # SQLite hands timestamps back without their zone; they were written in UTC.
    return value if value.tzinfo else value.replace(tzinfo=utcnow().tzinfo)


def oldest_pending(conn: Connection | Session) -> datetime | None:
    value = conn.execute(
        select(func.min(JOBS.c.enqueued_at)).where(JOBS.c.state == PENDING)
    ).scalar()
    return None if value is None else _aware(value)


def running(conn: Connection | Session, lease: timedelta, limit: int = 20) -> list[dict[str, Any]]:
    """The longest-running jobs: id, queue, seconds since the claim, seconds since the last
    heartbeat, and whether the lease ran out (the sweep will recover it), by the clock leases
    are measured by (``store.schema.sql.lease_now``). No owner, no text."""
    rows = conn.execute(
        select(
            JOBS.c.id,
            JOBS.c.queue,
            JOBS.c.started_at,
            JOBS.c.heartbeat_at,
            lease_now(conn).label("now"),
        )
        .where(JOBS.c.state == RUNNING)
        .order_by(JOBS.c.started_at)
        .limit(limit)
    ).all()
    out = []
    for job_id, queue, started_at, heartbeat_at, clock in rows:
        now = _aware(clock)
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


def failures(conn: Connection | Session, limit: int = 20) -> list[dict[str, Any]]:
    """The most recent failed jobs: id, queue, owner, conversation, attempts, error, and what
    their runs cost the model."""
    rows = conn.execute(
        select(
            JOBS.c.id,
            JOBS.c.queue,
            JOBS.c.owner,
            JOBS.c.conversation_id,
            JOBS.c.attempts,
            JOBS.c.last_error,
            JOBS.c.finished_at,
            JOBS.c.model_calls,
            JOBS.c.prompt_tokens,
            JOBS.c.completion_tokens,
        )
        .where(JOBS.c.state == FAILED)
        .order_by(JOBS.c.finished_at.desc())
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


def find_import(conn: Connection | Session, id_or_prefix: str) -> list[str]:
    """The imports whose id is ``id_or_prefix`` or (at least MIN_IMPORT_PREFIX characters)
    starts with it: one id when it names one import, several when the prefix is ambiguous
    (at most two are read), none when nothing matches."""
    if conn.execute(select(IMPORTS.c.id).where(IMPORTS.c.id == id_or_prefix)).first() is not None:
        return [id_or_prefix]
    prefix = id_or_prefix.lower()
    if len(prefix) < MIN_IMPORT_PREFIX or not all(c in "0123456789abcdef" for c in prefix):
        return []
    rows = conn.execute(
        select(IMPORTS.c.id).where(IMPORTS.c.id.like(f"{prefix}%")).order_by(IMPORTS.c.id).limit(2)
    ).scalars()
    return [str(found) for found in rows]


def import_progress(conn: Connection | Session, import_id: str) -> dict[str, Any]:
    batch = conn.execute(select(IMPORTS).where(IMPORTS.c.id == import_id)).first()
    if batch is None:
        return {}
    by_state = counts(conn, import_id)
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


def recent_imports(conn: Connection | Session, limit: int = 20) -> list[dict[str, Any]]:
    """The newest imports first: each with its source, owner, totals and jobs by state."""
    batches = conn.execute(
        select(IMPORTS).order_by(IMPORTS.c.created_at.desc(), IMPORTS.c.id).limit(limit)
    ).all()
    ids = [batch.id for batch in batches]
    states: dict[str, dict[str, int]] = {i: dict.fromkeys(JOB_STATES, 0) for i in ids}
    if ids:
        rows = conn.execute(
            select(JOBS.c.import_id, JOBS.c.state, func.count())
            .where(JOBS.c.import_id.in_(ids))
            .group_by(JOBS.c.import_id, JOBS.c.state)
        )
        for import_id, state, n in rows:
            states[str(import_id)][str(state)] = int(n)
    return [
        {
            "import_id": batch.id,
            "created_at": _aware(batch.created_at).isoformat(),
            "owner": batch.owner,
            "provenance": batch.provenance,
            "source": batch.source,
            "total": batch.total,
            "unreadable": batch.unreadable,
            "jobs": states[batch.id],
        }
        for batch in batches
    ]


def cost_by_state(conn: Connection | Session) -> dict[str, dict[str, int]]:
    """Model calls and tokens every run of the jobs cost, by job state (failed runs too)."""
    rows = conn.execute(
        select(
            JOBS.c.state,
            func.sum(JOBS.c.model_calls),
            func.sum(JOBS.c.prompt_tokens),
            func.sum(JOBS.c.completion_tokens),
        ).group_by(JOBS.c.state)
    )
    return {
        str(state): {
            "model_calls": int(calls or 0),
            "prompt_tokens": int(prompt or 0),
            "completion_tokens": int(completion or 0),
        }
        for state, calls, prompt, completion in rows
    }


def done_results(conn: Connection | Session, import_id: str) -> Iterator[dict[str, Any]]:
    """The stored result (the harvest's outcome) of each done job of an import."""
    results = conn.execute(
        select(JOBS.c.result).where(JOBS.c.import_id == import_id, JOBS.c.state == DONE)
    ).scalars()
    return (result or {} for result in results)


def import_usage(conn: Connection | Session, import_id: str) -> dict[str, int]:
    """Model calls and tokens every run of an import's done and failed jobs cost."""
    calls, prompt, completion = conn.execute(
        select(
            func.coalesce(func.sum(JOBS.c.model_calls), 0),
            func.coalesce(func.sum(JOBS.c.prompt_tokens), 0),
            func.coalesce(func.sum(JOBS.c.completion_tokens), 0),
        ).where(JOBS.c.import_id == import_id, JOBS.c.state.in_((DONE, FAILED)))
    ).one()
    return {
        "model_calls": int(calls),
        "prompt_tokens": int(prompt),
        "completion_tokens": int(completion),
    }


def harvested(conn: Connection | Session) -> dict[str, int]:
    """Harvest totals over the whole ledger (for status displays)."""
    ledger = HARVEST_LEDGER.c
    row = conn.execute(
        select(
            func.count(),
            func.coalesce(func.sum(ledger.model_calls), 0),
            func.coalesce(func.sum(ledger.prompt_tokens), 0),
            func.coalesce(func.sum(ledger.completion_tokens), 0),
        )
    ).one()
    return {
        "transcripts": int(row[0]),
        "model_calls": int(row[1]),
        "prompt_tokens": int(row[2]),
        "completion_tokens": int(row[3]),
    }
