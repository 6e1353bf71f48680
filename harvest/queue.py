"""Harvest as recorded jobs: turn transcripts into job rows, and run one job by its id.

Transcripts are redacted before they are recorded, so neither the jobs table nor any queue
message (which carries only a job id) ever holds ``<private>`` text.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

from harvest.errors import HarvestError
from harvest.job import harvest_transcript, resolve_owner
from harvest.redact import redact_transcript
from harvest.transcript import Transcript
from store import StorageFailure, Store, format_error
from store import jobs as job_records

LIVE_QUEUE, IMPORT_QUEUE = "harvest", "import"


def new_jobs(
    transcripts: Iterable[Transcript], *, owner: str | None, provenance: str
) -> list[job_records.NewJob]:
    """Job records for transcripts: owner resolved (HarvestError when none), text redacted."""
    out = []
    for transcript in transcripts:
        redacted = redact_transcript(transcript)
        out.append(
            job_records.NewJob(
                owner=resolve_owner(transcript, owner),
                provenance=provenance,
                conversation_id=transcript.conversation_id,
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
) -> list[str]:
    """Record pending jobs in one transaction; enqueue the returned ids only after this."""
    records = new_jobs(transcripts, owner=owner, provenance=provenance)
    with store.transaction() as session:
        return job_records.add_jobs(session, queue, records, import_id=import_id)


def run_job(store: Store, job_id: str) -> dict[str, Any] | None:
    """Harvest the transcript of one job and record the outcome; None when there is nothing
    to do (the job is done already or gone).

    A harvest failure (model error, bad transcript) marks the job failed with its reason; a
    database failure propagates so the queue can redeliver the message.
    """
    with store.transaction() as session:
        job = job_records.claim(session, job_id)
    if job is None:
        return None
    try:
        transcript = Transcript.model_validate(job.transcript)
        report = harvest_transcript(store, transcript, owner=job.owner, provenance=job.provenance)
    except StorageFailure:
        raise
    except (HarvestError, ValueError) as exc:
        with store.transaction() as session:
            job_records.fail(session, job_id, format_error(exc))
        return {"status": "failed", "error": format_error(exc)}
    result = asdict(report)
    with store.transaction() as session:
        if report.status == "failed":
            job_records.fail(session, job_id, report.error or "failed")
        else:
            job_records.finish(session, job_id, result)
    return result
