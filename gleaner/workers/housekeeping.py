"""Beat's housekeeping tasks, on the ``housekeeping`` queue: decay, dedupe and the lost-job
sweep. Thin, like ``workers.tasks``.

Apart from the harvest task because the sweep sends harvest messages (``workers.enqueue``
imports that task): here, the task that sweeps sits above what it sends.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from celery.utils.log import get_task_logger

from gleaner.workers import runtime
from gleaner.workers.enqueue import BrokerUnavailable
from gleaner.workers.enqueue import requeue_stale as sweep

log = get_task_logger(__name__)


@shared_task(name="gleaner.decay")
def decay() -> dict[str, Any]:
    """Recompute every note's decayed weight (and archive below the floor, if set)."""
    return runtime.store().decay().model_dump(mode="json")


@shared_task(name="gleaner.dedupe")
def dedupe() -> dict[str, Any]:
    """Supersede near-duplicate notes; yields at once if another run holds the lock."""
    # Counts only (Celery logs the return value): the pairs name scopes and slugs.
    return runtime.store().dedupe().model_dump(mode="json", exclude={"pairs"})


@shared_task(name="gleaner.requeue_stale")
def requeue_stale() -> int:
    """Recover jobs whose worker was lost and re-send pending jobs whose message was lost."""
    try:
        sent = sweep(runtime.store())
    except BrokerUnavailable as exc:
        if not exc.full:
            raise
        # Not a defect: the jobs stay pending and the next sweep, once Redis has room,
        # sends them (Redis's refusals mark the losses, so without the usual wait).
        log.warning("lost-job sweep: %s; the next sweep tries again", exc)
        return exc.sent
    if sent:
        log.warning("re-enqueued %d lost job(s)", sent)
    return sent
