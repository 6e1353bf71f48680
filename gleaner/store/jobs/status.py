"""One job's state as a caller sees it: where it is, what it did, what it cost.

The transcript and the lease are left out: a status is what a producer polls for, and it
never carries the conversation's text.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import field_validator
from sqlalchemy.orm import Session

from gleaner.store.schema.records import Job
from gleaner.store.schemas import Frozen


class JobStatus(Frozen):
    """A job's state (``pending``, ``running``, ``done``, ``failed``) and outcome.

    ``notes_*``, ``slugs`` and ``secrets_redacted`` (secrets replaced with ``[REDACTED]`` in
    the transcript and the model's answer) come from the run that ended it (zero before);
    ``model_calls`` and the token counts are summed over every run, failed ones included.
    ``error`` is the reason a failed job failed.
    """

    id: str
    state: str
    owner: str
    queue: str
    provenance: str
    conversation_id: str
    attempts: int
    error: str | None
    harvest_status: str | None
    notes_written: int
    notes_updated: int
    notes_skipped: int
    slugs: list[str]
    secrets_redacted: int = 0
    model_calls: int
    prompt_tokens: int
    completion_tokens: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @field_validator("created_at", "started_at", "finished_at")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        # SQLite hands back naive datetimes; everything stored is UTC.
        return value.replace(tzinfo=UTC) if value is not None and not value.tzinfo else value


def job_status(session: Session, job_id: str) -> JobStatus | None:
    """The job with this id, or None."""
    row = session.get(Job, job_id)
    if row is None:
        return None
    result: dict[str, Any] = row.result or {}
    return JobStatus(
        id=row.id,
        state=row.state,
        owner=row.owner,
        queue=row.queue,
        provenance=row.provenance,
        conversation_id=row.conversation_id,
        attempts=row.attempts,
        error=row.last_error,
        harvest_status=result.get("status"),
        notes_written=int(result.get("notes_written", 0)),
        notes_updated=int(result.get("notes_updated", 0)),
        notes_skipped=int(result.get("notes_skipped", 0)),
        slugs=[str(slug) for slug in result.get("slugs", [])],
        secrets_redacted=int(result.get("secrets_redacted", 0)),
        model_calls=row.model_calls,
        prompt_tokens=row.prompt_tokens,
        completion_tokens=row.completion_tokens,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )
