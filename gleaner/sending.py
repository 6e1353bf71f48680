"""Sending a recorded job to its queue, on the Celery app of one ``Gleaner``."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from gleaner.errors import Unavailable

if TYPE_CHECKING:
    from gleaner.store import Settings


class JobSender:
    """Sends harvest messages on a Celery app of its own, made on the first send: two
    Gleaners on two brokers in one process stay apart."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._celery: Any = None
        self._celery_lock = threading.Lock()

    def send(self, queue: str, job_id: str) -> None:
        """Put the job on its queue. A broker that cannot be reached leaves the job pending
        (Unavailable, ``broker_unavailable``); the sweep (``gleaner beat``) sends it again
        once the broker is back."""
        from gleaner.workers.routing import HARVEST_TASK, WORKER_LIMITS

        with self._celery_lock:
            if self._celery is None:
                from gleaner.workers.app import make_celery

                self._celery = make_celery(self.settings)
        try:
            # The task as bound to this object's app (as workers.enqueue.send_jobs sends it
            # on the current app).
            self._celery.tasks[HARVEST_TASK].apply_async(
                args=[job_id], queue=queue, **WORKER_LIMITS
            )
        except Exception as exc:
            # kombu and redis raise their own trees; the job itself is safe in the database.
            raise Unavailable(
                f"job {job_id} is recorded but the broker could not be reached "
                f"({type(exc).__name__}); it will be sent again by the sweep",
                reason="broker_unavailable",
            ) from exc
