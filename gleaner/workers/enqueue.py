"""Putting recorded jobs on their queue (after the commit that recorded them), and the sweep
that recovers lost work.

The sweep (``requeue_stale``, run by beat every minute on the ``housekeeping`` queue):

1. A ``running`` job whose heartbeat is older than GLEANER_JOB_LEASE_SECONDS lost its worker;
   it goes back to ``pending`` and is sent again (or is failed with ``worker_lost`` once its
   workers were lost GLEANER_JOB_MAX_CRASHES times).
2. A ``pending`` job is sent again only when its message can be presumed lost: it was last
   sent more than GLEANER_REQUEUE_AFTER_SECONDS ago and its queue does not hold a message for
   it. Up to ``SCAN_LIMIT`` waiting messages the queue is read and exactly the jobs without
   one are sent; on a longer queue only the shortfall is sent (pending jobs minus waiting
   messages, oldest-sent first, since Redis hands out the oldest messages first). A backlog
   that is merely waiting is never duplicated.
3. When Redis lost or refused messages since the last sweep (it evicted keys, refused writes
   at maxmemory, or restarted: ``workers.broker_memory``), the wait in 2 drops to
   LOSS_GRACE_SECONDS: an evicted queue is sent again by the next sweep, not after
   GLEANER_REQUEUE_AFTER_SECONDS. Messages workers hold unacknowledged count as waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from gleaner.store import Settings, Store
from gleaner.store.jobs import leases as job_leases
from gleaner.workers.waiting import (
    REDIS_SCHEMES,
    SCAN_LIMIT,
    Waiting,
    held_job_ids,
    redis_client,
    waiting_messages,
)

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

# At most this many jobs re-sent per queue per sweep; the next sweep takes the rest.
SEND_LIMIT = 1_000
# Messages pushed to Redis in one pipeline (one round trip instead of one each).
SEND_BATCH = 500
# After Redis lost or refused messages, a pending job sent this long ago whose message is
# gone is sent again (a producer sends right after its commit; a duplicate is harmless).
LOSS_GRACE_SECONDS = 5


class BrokerUnavailable(Exception):
    """Raised when messages could not be handed to the broker. Their jobs stay recorded as
    pending: the lost-job sweep (or ``gleaner housekeep requeue``) sends them later."""

    reason = "broker_unavailable"

    def __init__(
        self, queue: str, sent: int, unsent: int, detail: str, *, full: bool = False
    ) -> None:
        super().__init__(
            f"the broker did not take {unsent} message(s) for queue {queue!r} "
            f"({sent} sent before): {detail}"
        )
        self.queue, self.sent, self.unsent, self.detail = queue, sent, unsent, detail
        # Redis answered but refused the write at maxmemory (noeviction): it is full, not down.
        self.full = full


def send_jobs(queue: str, job_ids: Iterable[str]) -> int:
    """Send one ``harvest`` message per job id to ``queue``; returns how many.

    Messages go in pipelined batches of SEND_BATCH (kombu's producer batch, where the
    transport has one). Raises BrokerUnavailable when the broker cannot be reached; the
    messages of the batch that failed may or may not have arrived (a duplicate is harmless).
    """
    from contextlib import nullcontext

    from kombu.exceptions import KombuError
    from redis.exceptions import RedisError

    from gleaner.workers.routing import WORKER_LIMITS
    from gleaner.workers.tasks import harvest

    ids = list(job_ids)
    sent = 0
    try:
        with harvest.app.producer_or_acquire() as producer:
            # The queue is declared once here, not by each send (Celery's default: about a
            # quarter of a send's CPU), and each message's args are shown as given, not
            # through Celery's saferepr (a job id holds nothing private): 0.19 -> 0.14 ms a
            # message.
            producer.maybe_declare(harvest.app.amqp.queues[queue])
            batch = getattr(producer, "batch", None)  # kombu >= 5.7
            for start in range(0, len(ids), SEND_BATCH):
                chunk = ids[start : start + SEND_BATCH]
                with batch(max_size=len(chunk)) if batch else nullcontext():
                    for job_id in chunk:
                        harvest.apply_async(
                            args=[job_id],
                            queue=queue,
                            producer=producer,
                            declare=[],
                            argsrepr=repr([job_id]),
                            kwargsrepr="{}",
                            **WORKER_LIMITS,
                        )
                sent += len(chunk)
    except (KombuError, RedisError, OSError) as exc:
        from gleaner.workers.broker_memory import is_out_of_memory

        cause = exc.__cause__ or exc
        detail = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        full = is_out_of_memory(exc)
        if full:
            detail = f"Redis is full (at maxmemory, it refuses writes): {detail}"
        raise BrokerUnavailable(queue, sent, len(ids) - sent, detail, full=full) from exc
    return sent


def requeue_stale(
    store: Store, *, scan_limit: int = SCAN_LIMIT, older_than: timedelta | None = None
) -> int:
    """Recover jobs whose worker was lost and re-send pending jobs whose message was lost
    (see the module's docstring for the rule); returns how many messages were sent.

    ``older_than`` (default GLEANER_REQUEUE_AFTER_SECONDS) is how long ago a pending job must
    have been sent. Beat keeps the default, so it never races a producer between its commit
    and its send; an operator (``gleaner housekeep requeue``) passes zero to send at once
    every pending job whose message does not wait on its queue.
    """
    recovered = _recover_lost_workers(store)
    sent = _send_by_queue(recovered.requeued)
    losses = None
    if older_than is None:
        older_than, losses = _sweep_wait(store.settings)
    with store.transaction() as session:
        queues = sorted(job_leases.pending_counts(session, older_than))
    if not queues:  # the usual case: nothing waited that long, Redis is not even asked
        if losses is not None:
            losses.record()
        return sent
    # A job recovered above was sent a moment ago: a worker may have taken that message
    # already, but it is not lost, so it is not sent twice.
    just_sent = frozenset(job_id for job_id, _ in recovered.requeued)
    lost, capped = _lost_messages(store, queues, older_than, just_sent, scan_limit)
    if losses is not None and losses.changed and lost:
        log.warning(
            "Redis lost or refused messages since the last sweep (evicted keys, writes refused "
            "at maxmemory, or a restart): re-sending %d pending job(s) whose message is gone",
            len(lost),
        )
    sent += _send_by_queue(lost)
    if losses is not None and not capped:
        # Only once every lost job was sent: a failed send, or more than SEND_LIMIT lost on
        # a queue, leaves the next sweep looking with the short wait again.
        losses.record()
    return sent


def _recover_lost_workers(store: Store) -> job_leases.Recovered:
    """Step 1 of the sweep: running jobs past their lease go back to pending (or fail)."""
    settings = store.settings
    with store.transaction() as session:
        recovered = job_leases.recover_lost(
            session,
            timedelta(seconds=settings.job_lease_seconds),
            settings.job_max_crashes,
        )
    if recovered.requeued or recovered.failed:
        from gleaner.workers.metrics import LEASE_RECOVERIES

        LEASE_RECOVERIES.inc(len(recovered.requeued) + len(recovered.failed))
    if recovered.failed:
        log.warning(
            "%d job(s) failed: their worker was lost %d times",
            len(recovered.failed),
            settings.job_max_crashes,
        )
    return recovered


def _sweep_wait(settings: Settings) -> tuple[timedelta, RedisLosses | None]:
    """How long ago beat's sweep wants a pending job sent before it is presumed lost:
    GLEANER_REQUEUE_AFTER_SECONDS, or LOSS_GRACE_SECONDS after Redis lost messages (step 3);
    and Redis's losses, to record once they are dealt with."""
    wait = timedelta(seconds=settings.requeue_after_seconds)
    losses = redis_losses(settings.broker_url)
    if losses is not None and losses.changed:
        wait = min(wait, timedelta(seconds=LOSS_GRACE_SECONDS))
    return wait, losses


def _lost_messages(
    store: Store,
    queues: list[str],
    older_than: timedelta,
    just_sent: frozenset[str],
    scan_limit: int,
) -> tuple[list[tuple[str, str]], bool]:
    """Step 2 of the sweep: the ``(job id, queue)`` of the pending jobs whose message is
    gone, marked sent; and whether a queue had more than SEND_LIMIT of them."""
    # Read the queues before the candidates: a message taken meanwhile belongs to a job that
    # is being claimed, so the worst case is one harmless duplicate, never a lost job.
    broker_url = store.settings.broker_url
    waiting = waiting_messages(broker_url, queues, scan_limit) if broker_url else None
    # A message a worker holds is not lost either.
    held = held_job_ids(broker_url) if broker_url and waiting is not None else frozenset()
    lost: list[tuple[str, str]] = []
    capped = False
    with store.transaction() as session:
        pending = job_leases.pending_counts(session)
        for queue in queues:
            found = None if waiting is None else waiting[queue]
            ids = _lost_on_queue(
                session,
                queue,
                older_than,
                skip=just_sent | held,
                found=found,
                pending=pending.get(queue, 0),
            )
            lost.extend((job_id, queue) for job_id in ids)
            capped = capped or len(ids) >= SEND_LIMIT
    return lost, capped


def _lost_on_queue(
    session: Session,
    queue: str,
    older_than: timedelta,
    *,
    skip: frozenset[str],
    found: Waiting | None,
    pending: int,
) -> list[str]:
    """The stale pending jobs of one queue that have no message waiting on it: compared id
    by id when the queue was read, by count (the shortfall, oldest-sent first) when it was
    too long to read, every one when the broker is not Redis."""
    if found is None:  # not Redis: nothing to compare with, every stale job is sent
        return job_leases.stale_pending(session, queue, older_than, skip=skip, most=SEND_LIMIT)
    if found.job_ids is not None:
        return job_leases.stale_pending(
            session, queue, older_than, skip=skip | found.job_ids, most=SEND_LIMIT
        )
    shortfall = pending - found.length
    return job_leases.stale_pending(
        session, queue, older_than, skip=skip, most=min(SEND_LIMIT, shortfall)
    )


@dataclass
class RedisLosses:
    """Whether Redis lost or refused messages since the sweep last looked, and how to
    record this look (see ``workers.broker_memory.changed_since_last_look``)."""

    broker_url: str
    changed: bool
    fingerprint: str

    def record(self) -> None:
        from gleaner.workers.broker_memory import record_look

        client = redis_client(self.broker_url, 10.0)
        try:
            record_look(client, self.fingerprint)
        finally:
            client.close()


def redis_losses(broker_url: str | None) -> RedisLosses | None:
    """What the sweep needs to know of Redis's losses; None when the broker is not Redis.
    Raises ``redis.RedisError`` when Redis cannot be reached."""
    if not broker_url or not broker_url.startswith(REDIS_SCHEMES):
        return None
    from gleaner.workers.broker_memory import changed_since_last_look

    client = redis_client(broker_url, 10.0)
    try:
        changed, fingerprint = changed_since_last_look(client)
    finally:
        client.close()
    return RedisLosses(broker_url, changed, fingerprint)


def _send_by_queue(found: Iterable[tuple[str, str]]) -> int:
    by_queue: dict[str, list[str]] = {}
    for job_id, queue in found:
        by_queue.setdefault(queue, []).append(job_id)
    return sum(send_jobs(queue, ids) for queue, ids in by_queue.items())
