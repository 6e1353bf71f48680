"""What Celery beat runs, and how often. Entries name the task objects, not strings."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from gleaner.store import Settings


def schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """The beat schedule: decay hourly, dedupe every 10 minutes, lost-job sweep each minute
    (more often when GLEANER_JOB_LEASE_SECONDS or GLEANER_REQUEUE_AFTER_SECONDS is shorter,
    so a lost job waits at most about one lease more); with GLEANER_EMBED_MODEL set, the
    embedding sweep every 5 minutes."""
    from gleaner.workers.housekeeping import decay, dedupe, requeue_stale
    from gleaner.workers.routing import WORKER_LIMITS
    from gleaner.workers.tasks import embed_sweep

    every = {
        "decay": {"task": decay.name, "schedule": timedelta(hours=1)},
        "dedupe": {"task": dedupe.name, "schedule": timedelta(minutes=10)},
        "requeue-stale-jobs": {
            "task": requeue_stale.name,
            "schedule": timedelta(
                seconds=min(60, settings.requeue_after_seconds, settings.job_lease_seconds)
            ),
        },
    }
    if settings.embed_model:
        every["embed-sweep"] = {"task": embed_sweep.name, "schedule": timedelta(minutes=5)}
    for entry in every.values():
        entry["options"] = dict(WORKER_LIMITS)  # the worker's limits, not beat's
    return every
