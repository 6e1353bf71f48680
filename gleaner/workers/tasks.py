"""Thin Celery tasks: each takes ids or small JSON and makes one call into harvest or store.

Here the work a message names (a harvest, its embeddings); beat's housekeeping tasks are in
``workers.housekeeping``."""

from __future__ import annotations

import random
from typing import Any

from celery import Task, shared_task
from celery.utils.log import get_task_logger

from gleaner.harvest.outcome import COUNTERS
from gleaner.store import DataRefused, StorageFailure
from gleaner.workers import runtime

log = get_task_logger(__name__)


# The database was unreachable: the retry (same task id) takes its own claim back. Its wait
# doubles from 5 s up to 120 s, jittered, but never reaches half the job's lease: the lease
# is not renewed between two tries, and a retry after it ran out would count a lost worker.
DB_RETRIES = 5
DB_RETRY_FIRST, DB_RETRY_MAX = 5.0, 120.0


# How a retry carrying a kept answer shows its arguments (Celery logs and the message's
# headers): never the notes' text.
KEPT_REPR = "{'answer': '<the model answer kept until written>'}"


def db_retry_delay(retries: int, lease_seconds: float) -> float:
    """Seconds before the ``retries``-th retry of a harvest whose database failed."""
    ceiling = min(DB_RETRY_FIRST * 2**retries, DB_RETRY_MAX, lease_seconds / 2)
    return random.uniform(ceiling / 2, ceiling)  # noqa: S311 - jitter, not a secret


@shared_task(bind=True, name="gleaner.harvest", max_retries=DB_RETRIES)
def harvest(self: Task, job_id: str, answer: dict[str, Any] | None = None) -> str | None:
    """Harvest the recorded job ``job_id`` (model retries happen inside, not here).

    The task id names the lease: a retry, or the message redelivered because its worker was
    lost, takes its own claim back at once; any other message for a running job is a no-op.
    ``answer`` is the model's answer an earlier try of this task could not write (the
    database failed after the model answered: ``harvest.kept``): written with no model call.
    """
    from celery.exceptions import SoftTimeLimitExceeded

    from gleaner.harvest.kept import KeptAnswer
    from gleaner.harvest.queue import fail_run, run_job
    from gleaner.store.jobs import queue as jobs

    request = self.request
    redelivered = bool((request.delivery_info or {}).get("redelivered"))
    store = runtime.store()
    kept = KeptAnswer.from_json(answer) if answer else None
    try:
        result = run_job(store, job_id, token=request.id, redelivered=redelivered, kept=kept)
    except StorageFailure as exc:
        if exc.reason == DataRefused.reason:
            # The database is up and refused a value this run sent: a retry would send it
            # again (and pay the model again). Failed now, with the reason; its calls were
            # added to the job before the error came here.
            fail_run(store, job_id, exc, request.id)
            log.warning("job %s failed: the database refused a value it sent", job_id)
            return f"failed error={exc.reason}"
        delay = db_retry_delay(request.retries, store.settings.job_lease_seconds)
        # The answer the model gave, kept for the retry to write (the earlier one, when this
        # try failed before it had one): the model is not asked again.
        answer = getattr(exc, "answer", None) or answer
        kept_answer = {"kwargs": {"answer": answer}, "kwargsrepr": KEPT_REPR} if answer else {}
        raise self.retry(exc=exc, countdown=delay, **kept_answer) from exc
    except SoftTimeLimitExceeded:
        # Over the time limit: running it again would end the same way.
        limit = store.settings.task_soft_time_limit
        with store.transaction() as session:
            failed = jobs.fail(
                session,
                job_id,
                f"time_limit: the harvest ran past GLEANER_TASK_SOFT_TIME_LIMIT ({limit} s); "
                "it is not run again until `gleaner retry`",
                request.id,
            )
        if not failed:  # its outcome was committed before the limit fired: it stands
            log.warning("job %s reached the soft time limit after its outcome was recorded", job_id)
            return None
        log.warning("job %s stopped at the soft time limit: failed", job_id)
        return "failed error=time_limit"
    except Exception as exc:
        # A defect, not a fault of the database or the model (those are handled above and
        # inside): a run again would end the same way and pay for the model again, and the
        # lease would call it a lost worker. Failed at once with its type; Celery logs the
        # traceback.
        fail_run(store, job_id, exc, request.id)
        raise
    if result is None:
        log.info("job %s is finished, gone or running elsewhere: nothing to do", job_id)
        return None
    wrote = result.get("notes_written") or result.get("notes_updated")
    if wrote and store.settings.embed_model:
        # After the commit that wrote the notes: their vectors follow on the embed queue.
        embed.delay(str(result.get("owner") or ""))
    return logged_result(result)


def logged_result(result: dict[str, Any]) -> str:
    """What a harvest task returns, for the line Celery logs at its end: the status and the
    counts (``harvested notes_written=2 ...``), never an owner, conversation, slug or error
    text. A string, not a dict: Celery's ``saferepr`` of a dict of eight entries costs about
    60 µs (2% of a harvest's CPU in a pool child's profile); of a string, 3 µs."""
    counts = (f"{key}={result[key]}" for key in COUNTERS if key in result)
    return " ".join((str(result.get("status")), *counts))


# An embedding run takes at most this many notes; the rest waits for the next run.
EMBED_RUN_NOTES = 2_000


@shared_task(name="gleaner.embed")
def embed(owner: str) -> str:
    """Give the owner's notes that lack one a vector of GLEANER_EMBED_MODEL (``""``: every
    owner's). A failure leaves them pending for the sweep; it is logged, not retried here."""
    from gleaner.harvest.embed_notes import embed_pending
    from gleaner.harvest.embedding import embedder_for
    from gleaner.store import Scope

    store = runtime.store()
    embedder = embedder_for(store.settings)
    if embedder is None:
        return "off"
    scope = Scope.owner(owner) if owner else None
    lock = store.transcript_lock(scope or Scope.global_(), "embed")
    with lock:  # one run per owner at a time: a second finds nothing left to embed
        try:
            report = embed_pending(store, embedder, scope=scope, most=EMBED_RUN_NOTES)
        except Exception as exc:  # noqa: BLE001 - the notes stay pending for the sweep
            log.warning("embedding failed, the sweep retries: %s", exc)
            return f"failed error={type(exc).__name__}"
    return f"embedded notes={report.notes} calls={report.calls} tokens={report.tokens}"


@shared_task(name="gleaner.embed_sweep")
def embed_sweep() -> str:
    """Embed what the per-harvest runs left (a failed call, notes written by hand)."""
    return str(embed(""))


@shared_task(name="gleaner.noop")
def noop() -> None:
    """Do nothing: benches time the broker and worker-pool overhead alone with it."""
