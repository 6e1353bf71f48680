"""Harvest as recorded jobs: turn transcripts into job rows, and run one job by its id.

Transcripts are redacted before they are recorded, so neither the jobs table nor any queue
message (which carries only a job id) ever holds ``<private>`` text.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from sqlalchemy.orm import Session

from harvest.errors import HarvestError
from harvest.job import (
    TranscriptReport,
    extract_notes,
    harvested_before,
    plan_harvest,
    recall_keys,
    record_harvest,
    resolve_owner,
)
from harvest.locks import locks_for, transcript_key
from harvest.redact import redact_transcript
from harvest.transcript import Transcript
from store import StorageFailure, Store, format_error
from store import jobs as job_records

LIVE_QUEUE, IMPORT_QUEUE = "harvest", "import"


def new_jobs(
    transcripts: Iterable[Transcript],
    *,
    owner: str | None,
    provenance: str,
    reassign_owner: bool = False,
) -> list[job_records.NewJob]:
    """Job records for transcripts: owner resolved (HarvestError when none), text redacted.

    Only the redacted transcript is used, so the record's conversation id and an owner
    error's message are redacted too.
    """
    out = []
    for transcript in transcripts:
        redacted = redact_transcript(transcript)
        out.append(
            job_records.NewJob(
                owner=resolve_owner(redacted, owner, reassign_owner=reassign_owner),
                provenance=provenance,
                conversation_id=redacted.conversation_id,
                transcript=redacted.model_dump(mode="json"),
            )
        )
    return out


def record_jobs(
    store: Store,
    transcripts: Iterable[Transcript],
    *,
    owner: str | None,
    provenance: str,
    queue: str,
    import_id: str | None = None,
    reassign_owner: bool = False,
) -> list[str]:
    """Record pending jobs in one transaction; enqueue the returned ids only after this.

    ``owner`` fills in transcripts that name none; ``reassign_owner`` overrides every one.
    """
    records = new_jobs(
        transcripts, owner=owner, provenance=provenance, reassign_owner=reassign_owner
    )
    with store.transaction() as session:
        return job_records.add_jobs(session, queue, records, import_id=import_id)


def run_job(store: Store, job_id: str) -> dict[str, Any] | None:
    """Harvest the transcript of one job and record the outcome; None when there is nothing
    to do (the job is done already or gone).

    A harvest failure (model error, bad transcript) marks the job failed with its reason; a
    database failure propagates so the queue can redeliver the message.

    Two transactions in the usual case: the claim with the ledger check (a transcript already
    harvested finishes right there, with no model call), then the notes, the ledger row and
    the job's outcome together, so a job is ``done`` exactly when its notes are committed.
    The (scope, transcript) lock is taken between them without a pooled connection (see
    ``harvest.locks``); only when another worker holds it does the check wait for it in a
    transaction of its own.
    """
    locks = locks_for(store.engine)
    key: int | None = None
    try:
        with store.transaction() as session:
            job = job_records.claim(session, job_id)
            if job is None:
                return None
            try:
                plan = plan_harvest(
                    store.settings,
                    Transcript.model_validate(job.transcript),
                    owner=job.owner,
                    provenance=job.provenance,
                    reassign_owner=True,  # the job's owner was settled when it was recorded
                )
            except (HarvestError, ValueError) as exc:
                job_records.fail(session, job_id, format_error(exc))
                return {"status": "failed", "error": format_error(exc)}
            wanted = transcript_key(plan.scope, plan.digest)
            if locks.try_acquire(wanted):
                key = wanted
                if harvested_before(session, plan):
                    return _record_outcome(session, job_id, plan.report)
        if key is None:  # another worker is harvesting the same transcript: wait, look again
            locks.acquire(wanted)
            key = wanted
            with store.transaction() as session:
                if harvested_before(session, plan):
                    return _record_outcome(session, job_id, plan.report)
        try:
            with store.transaction() as session:
                recall_keys(session, store.settings, plan)
            found = extract_notes(plan, store.settings)
            with store.transaction() as session:
                if found is not None:
                    record_harvest(session, store.settings, plan, found)
                return _record_outcome(session, job_id, plan.report)
        except StorageFailure:
            raise
        except (HarvestError, ValueError) as exc:
            with store.transaction() as session:
                job_records.fail(session, job_id, format_error(exc))
            return {"status": "failed", "error": format_error(exc)}
    finally:
        if key is not None:
            locks.release(key)


def _record_outcome(session: Session, job_id: str, report: TranscriptReport) -> dict[str, Any]:
    result = asdict(report)
    if report.status == "failed":
        job_records.fail(session, job_id, report.error or "failed")
    else:
        job_records.finish(session, job_id, result)
    return result
