"""Harvest as recorded jobs: turn transcripts into job rows, and run one job by its id.

Transcripts are redacted before they are recorded, so neither the jobs table nor any queue
message (which carries only a job id) ever holds ``<private>`` text.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from dataclasses import asdict
from datetime import timedelta
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
from harvest.redact import redact_transcript, transcript_hash
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
                transcript_hash=transcript_hash(redacted),
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


def run_job(
    store: Store, job_id: str, *, token: str | None = None, redelivered: bool = False
) -> dict[str, Any] | None:
    """Harvest the transcript of one job and record the outcome; None when there is nothing
    to do (the job is done, failed, gone, or running elsewhere under a live lease).

    ``token`` names the delivery (the Celery task id; a fresh one when None) and
    ``redelivered`` is the broker's flag on it. The job is leased to that delivery and its
    heartbeat renewed every GLEANER_JOB_HEARTBEAT_SECONDS while it runs, so a worker that dies
    is noticed within GLEANER_JOB_LEASE_SECONDS whatever became of its message. A job whose
    worker was lost GLEANER_JOB_MAX_CRASHES times is failed (``worker_lost``), not run again.

    A harvest failure (model error, bad transcript) marks the job failed with its reason; a
    database failure propagates so the queue can redeliver the message.

    Two transactions in the usual case: the claim with the ledger check (a transcript already
    harvested finishes right there, with no model call), then the notes, the ledger row and
    the job's outcome together, so a job is ``done`` exactly when its notes are committed.
    The (scope, transcript) lock is taken between them without a pooled connection (see
    ``harvest.locks``); only when another worker holds it does the check wait for it in a
    transaction of its own.
    """
    settings = store.settings
    locks = locks_for(store.engine)
    heartbeats = job_records.heartbeats_for(store.engine, settings.job_heartbeat_seconds)
    key: int | None = None
    held = False
    try:
        with store.transaction() as session:
            job = job_records.claim(
                session,
                job_id,
                lease=timedelta(seconds=settings.job_lease_seconds),
                token=token,
                worker=_this_process(),
                redelivered=redelivered,
            )
            if job is None:
                return None
            token = job.token
            if job.crashes >= settings.job_max_crashes:
                error = job_records.worker_lost_error(job.crashes)
                job_records.fail(session, job_id, error, token)
                return {"status": "failed", "error": error}
            try:
                plan = plan_harvest(
                    settings,
                    Transcript.model_validate(job.transcript),
                    owner=job.owner,
                    provenance=job.provenance,
                    reassign_owner=True,  # the job's owner was settled when it was recorded
                )
            except (HarvestError, ValueError) as exc:
                job_records.fail(session, job_id, format_error(exc), token)
                return {"status": "failed", "error": format_error(exc)}
            wanted = transcript_key(plan.scope, plan.digest)
            if locks.try_acquire(wanted):
                key = wanted
                if harvested_before(session, plan):
                    return _record_outcome(session, job_id, plan.report, token)
                recall_keys(session, settings, plan)  # in the claim's transaction: no extra one
        heartbeats.hold(job_id, token)  # the claim is committed: keep its lease alive
        held = True
        if key is None:  # another worker is harvesting the same transcript: wait, look again
            locks.acquire(wanted)
            key = wanted
            with store.transaction() as session:
                if harvested_before(session, plan):
                    return _record_outcome(session, job_id, plan.report, token)
                recall_keys(session, settings, plan)
        try:
            found = extract_notes(plan, settings)
            with store.transaction() as session:
                if found is not None:
                    record_harvest(session, settings, plan, found)
                return _record_outcome(session, job_id, plan.report, token)
        except StorageFailure:
            raise
        except (HarvestError, ValueError) as exc:
            with store.transaction() as session:
                job_records.fail(session, job_id, format_error(exc), token)
            return {"status": "failed", "error": format_error(exc)}
    finally:
        if held:
            heartbeats.release(job_id)
        if key is not None:
            locks.release(key)


def _this_process() -> str:
    """Who holds a claim: ``host:pid`` (kept on the job for operators, never in output)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _record_outcome(
    session: Session, job_id: str, report: TranscriptReport, token: str
) -> dict[str, Any]:
    # Recorded only while this delivery holds the job: a run presumed lost that comes back
    # leaves the outcome to the run that took over (the ledger kept the notes single).
    result = asdict(report)
    if report.status == "failed":
        job_records.fail(session, job_id, report.error or "failed", token, result)
    else:
        job_records.finish(session, job_id, result, token)
    return result
