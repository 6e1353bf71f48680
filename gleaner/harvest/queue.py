"""Harvest as recorded jobs: turn transcripts into job rows, and run one job by its id.

Transcripts are taken in (``harvest.intake``: redacted, their owner settled) before they are
recorded, so neither the jobs table nor any queue message (which carries only a job id)
ever holds ``<private>`` text.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gleaner.harvest import metrics
from gleaner.harvest.errors import HarvestError
from gleaner.harvest.intake import Settled, settle
from gleaner.harvest.job import run_harvest
from gleaner.harvest.kept import KeptAnswer
from gleaner.harvest.model import Usage
from gleaner.harvest.outcome import Counts, HarvestOutcome
from gleaner.harvest.plan import Plan, plan_harvest
from gleaner.harvest.steps import failed_after
from gleaner.harvest.transcript import Transcript
from gleaner.store import StorageFailure, Store, format_error
from gleaner.store.jobs import leases as job_leases
from gleaner.store.jobs import queue as job_records

if TYPE_CHECKING:
    from gleaner.store import Executor

log = logging.getLogger(__name__)


def new_jobs(settled: Iterable[Settled], *, provenance: str) -> list[job_records.NewJob]:
    """Job records for transcripts taken in (``harvest.intake.settle``): nothing is
    redacted or settled again, so the record's conversation id is the redacted one."""
    return [
        job_records.NewJob(
            owner=item.owner,
            provenance=provenance,
            conversation_id=item.conversation_id,
            transcript=item.transcript.model_dump(mode="json"),
            transcript_hash=item.digest,
        )
        for item in settled
    ]


def record_settled(
    store: Store,
    settled: Sequence[Settled],
    *,
    provenance: str,
    queue: str,
    import_id: str | None = None,
) -> list[str]:
    """Record pending jobs for transcripts taken in, in one transaction; enqueue the
    returned ids only after this."""
    records = new_jobs(settled, provenance=provenance)
    # One job (a conversation posted to the service) is one INSERT, atomic by itself: on
    # PostgreSQL it commits on its own, without a BEGIN and a COMMIT round trip.
    single = len(records) == 1 and import_id is None
    with store.statements() if single else store.transaction() as session:
        return job_records.add_jobs(session, queue, records, import_id=import_id)


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
    """Take each transcript in (``harvest.intake.settle``: HarvestError when one is bad,
    before anything is recorded) and ``record_settled`` them. ``owner`` fills in
    transcripts that name none; ``reassign_owner`` overrides every one. The entry points
    settle as they read (a batch refuses a bad transcript alone) and record the result."""
    settled = [settle(t, owner, reassign_owner=reassign_owner) for t in transcripts]
    return record_settled(store, settled, provenance=provenance, queue=queue, import_id=import_id)


def run_job(
    store: Store,
    job_id: str,
    *,
    token: str | None = None,
    redelivered: bool = False,
    kept: KeptAnswer | None = None,
) -> dict[str, Any] | None:
    """Harvest the transcript of one job and record the outcome; returns the outcome as
    stored on the job (``HarvestOutcome.as_dict``), or None when there is nothing to do (the
    job is done, failed, gone, or running elsewhere under a live lease).

    ``token`` names the delivery (the Celery task id; a fresh one when None) and
    ``redelivered`` is the broker's flag on it. The job is leased to that delivery and its
    heartbeat renewed every GLEANER_JOB_HEARTBEAT_SECONDS while it runs, so a worker that dies
    is noticed within GLEANER_JOB_LEASE_SECONDS whatever became of its message. A job whose
    worker was lost GLEANER_JOB_MAX_CRASHES times is failed (``worker_lost``), not run again.

    A harvest failure (model error, bad transcript) marks the job failed with its reason; a
    database failure propagates so the queue can redeliver the message. One that came after
    the model answered is an ``UnrecordedHarvest`` carrying the answer: given back as
    ``kept`` (``harvest.kept.KeptAnswer``), the next run writes it with no model call.

    The steps are ``harvest.job.run_harvest``'s: the claim goes into the first, with the
    ledger check (a transcript already harvested finishes right there, with no model call);
    the job's outcome into the transaction that writes the notes and the ledger row, so a
    job is ``done`` exactly when its notes are committed.
    """
    run = _JobRun(store, job_id, token=token, redelivered=redelivered)
    started = time.monotonic()
    try:
        outcome = run_harvest(store, run, kept=kept)
    finally:
        run.close()
    if outcome is None:
        return None
    metrics.JOBS_FINISHED.labels(outcome.status).inc()
    metrics.JOB_SECONDS.observe(time.monotonic() - started)
    return outcome.as_dict()


def run_job_here(store: Store, job_id: str) -> dict[str, Any] | None:
    """``run_job`` in this process, where nothing retries or recovers it (no queue, no
    lease sweep): a run that raises (the database failed, a defect, an interrupt) marks the
    job failed with the reason, so it is never left running and ``gleaner retry`` runs it
    again; the error is raised on. With the database still unreachable the mark fails too
    and the job stays ``running`` until a retry of the whole call."""
    token = job_records.new_id()
    try:
        return run_job(store, job_id, token=token)
    except BaseException as exc:
        fail_run(store, job_id, exc, token)
        raise


def fail_run(store: Store, job_id: str, exc: BaseException, token: str | None) -> None:
    """Fail the job whose run under ``token`` raised ``exc`` (or which it left pending,
    its claim rolled back with the error), with the reason: ``format_error``'s for an
    exception, ``interrupted`` for an interrupt. With the database unreachable nothing is
    marked; a worker's lease recovers its job later."""
    if isinstance(exc, Exception):
        error = format_error(exc)
    else:
        error = f"interrupted: the run was stopped ({type(exc).__name__})"
    try:
        with store.transaction() as session:
            job_records.fail(
                session,
                job_id,
                f"{error}; not run again until `gleaner retry`",
                token,
                unclaimed_too=True,
            )
    except StorageFailure:
        log.warning("job %s: could not record why its run ended", job_id)


class _JobRun:
    """``run_job``'s steps of the harvest: the claim, the lease and the job's outcome."""

    def __init__(self, store: Store, job_id: str, *, token: str | None, redelivered: bool) -> None:
        self.store, self.job_id = store, job_id
        # The delivery's lease token (claim would make the same fresh one).
        self.token, self.redelivered = token or job_records.new_id(), redelivered
        self.heartbeats = job_leases.heartbeats_for(
            store.engine, store.settings.job_heartbeat_seconds
        )
        self.held = False

    def begin(self, session: Executor) -> Plan | HarvestOutcome | None:
        settings = self.store.settings
        lease = timedelta(seconds=settings.job_lease_seconds)
        if self.redelivered and _still_running_here(session, self.job_id, self.token, lease):
            log.warning(
                "job %s: its message came back while its run goes on in this host's process "
                "that holds it (the broker gave it back: a connection lost, say); left to it",
                self.job_id,
            )
            return None
        job = job_records.claim(
            session,
            self.job_id,
            lease=lease,
            token=self.token,
            worker=_this_process(),
            redelivered=self.redelivered,
        )
        if job is None:
            return None
        if job.crashes >= settings.job_max_crashes:
            error = job_records.worker_lost_error(job.crashes)
            job_records.fail(session, self.job_id, error, job.token)
            return HarvestOutcome(status="failed", owner=job.owner, error=error)
        try:
            return plan_harvest(
                settings,
                Transcript.model_validate(job.transcript),
                owner=job.owner,
                provenance=job.provenance,
                reassign_owner=True,  # the job's owner was settled when it was recorded
                import_id=job.import_id,
            )
        except (HarvestError, ValueError) as exc:
            job_records.fail(session, self.job_id, format_error(exc), job.token)
            return HarvestOutcome(status="failed", owner=job.owner, error=format_error(exc))

    def begun(self) -> None:
        self.heartbeats.hold(self.job_id, self.token)  # the claim is committed: keep it alive
        self.held = True

    def end(self, session: Executor, outcome: HarvestOutcome) -> None:
        # Recorded only while this delivery holds the job: a run presumed lost that comes
        # back leaves the outcome to the run that took over (the ledger kept the notes single).
        result = outcome.as_dict()
        if outcome.status == "failed":
            marked = job_records.fail(
                session, self.job_id, outcome.error or "failed", self.token, result
            )
        else:
            marked = job_records.finish(session, self.job_id, result, self.token)
        if not marked:  # its calls are counted whichever: by the finish or fail, else here
            job_records.add_cost_if_not_held(session, self.job_id, result, self.token)

    def broke(self, plan: Plan, error: HarvestError | ValueError, paid: Usage) -> HarvestOutcome:
        outcome = failed_after(plan, error, paid, self.store.settings)
        result = outcome.as_dict()
        with self.store.transaction() as session:
            if not job_records.fail(session, self.job_id, format_error(error), self.token, result):
                job_records.add_cost_if_not_held(session, self.job_id, result, self.token)
        return outcome

    def unrecorded(self, plan: Plan, paid: Counts) -> bool:
        try:
            with self.store.transaction() as session:
                job_records.add_cost(session, self.job_id, paid.counts(), self.token)
        except StorageFailure:  # the database is still away: the log keeps the count
            log.warning(
                "job %s: %d model call(s), %d prompt and %d completion tokens, made before "
                "the run failed, are not on the job",
                self.job_id,
                paid.model_calls,
                paid.prompt_tokens,
                paid.completion_tokens,
            )
            return False
        return True

    def close(self) -> None:
        if self.held:
            self.heartbeats.release(self.job_id)


def _this_process() -> str:
    """Who holds a claim: ``host:pid`` (kept on the job for operators, never in output)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _still_running_here(session: Executor, job_id: str, token: str, lease: timedelta) -> bool:
    """Whether the job's run under this very delivery goes on in a live process of this
    host. The broker gives a message back when its worker is lost (then the claim is taken
    back at once), but also when the connection that took it broke while its run went on,
    which a second run of the same delivery must not take over. Only a process of this
    host can be seen alive; a claim held on another host is taken over as before."""
    held = job_records.holder(session, job_id, lease)
    if held is None or held.token != token or held.claimed_by is None:
        return False
    if not held.leased:
        return False  # its lease ran out: lost, whatever process holds it
    host, _, pid = held.claimed_by.rpartition(":")
    return host == socket.gethostname() and pid.isdigit() and _alive(int(pid))


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, killed and not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive, and not ours to judge
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return True  # no /proc: kill(0) said it exists
