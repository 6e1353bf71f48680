"""Putting recorded jobs on their queue (after the commit that recorded them)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from store import Store, jobs


def send_jobs(queue: str, job_ids: Iterable[str]) -> int:
    """Send one ``gleaner.harvest`` message per job id to ``queue``; returns how many."""
    from workers.tasks import harvest

    sent = 0
    for job_id in job_ids:
        harvest.apply_async(args=[job_id], queue=queue)
        sent += 1
    return sent


def requeue_stale(store: Store) -> int:
    """Send jobs pending longer than GLEANER_REQUEUE_AFTER_SECONDS to their queue again.

    Their message was lost (a Redis restart, a producer that died between commit and send);
    the job row says what to redo. Returns how many were sent.
    """
    with store.transaction() as session:
        stale = jobs.stale_pending(session, timedelta(seconds=store.settings.requeue_after_seconds))
    by_queue: dict[str, list[str]] = {}
    for job_id, queue in stale:
        by_queue.setdefault(queue, []).append(job_id)
    return sum(send_jobs(queue, ids) for queue, ids in by_queue.items())
