"""The Celery app, made by a factory from the settings: queues, routing, reliability.

Reliability choices (see README, "Running workers"):

- ``task_acks_late`` + ``task_reject_on_worker_lost``: a message is acknowledged only after
  its task finished, so a worker killed mid-task leaves it on Redis to be redelivered.
- ``broker_transport_options.visibility_timeout`` (GLEANER_BROKER_VISIBILITY_TIMEOUT) is
  longer than the hard time limit, so Redis never redelivers a task that is still running.
- ``worker_prefetch_multiplier = 1``: harvests are long; a child reserves one at a time.
- ``queue_order_strategy = "priority"``: a worker serving several queues polls them in
  ``QUEUES`` order: ``housekeeping`` first (a few short tasks an hour, among them the
  lost-job sweep, which must not wait behind a backlog), then ``harvest``, then ``embed``
  (new notes' vectors, when GLEANER_EMBED_MODEL is set: cheap, and wanted soon) before
  ``import``, so a bulk import never starves live conversations.
- Time limits are the worker's: messages are sent with ``WORKER_LIMITS``.
- JSON only, no pickle: messages carry job ids and small dicts.
- A full Redis (``noeviction`` at maxmemory) is waited out, not crashed on
  (``workers.memory_gate``); Redis must not evict (``workers.broker_memory``).
- Task events (what Flower shows) follow GLEANER_TASK_EVENTS; ``gleaner worker -E`` turns
  them on for one worker.

``workers.celery_app`` holds an app made from the environment, for Celery's own command line
(``celery -A gleaner.workers.celery_app inspect ping``) and Flower.
"""

from __future__ import annotations

from celery import Celery
from kombu.entity import Queue

from gleaner.harvest.queues import LIVE_QUEUE
from gleaner.store import Settings, load_settings
from gleaner.workers.routing import QUEUES, ROUTES, SEND_RETRIES


def make_celery(settings: Settings | None = None) -> Celery:
    """A configured Celery app; nothing connects until a task is sent or a worker starts."""
    from gleaner.workers import redis_transport

    settings = settings or load_settings()
    app = Celery("gleaner", set_as_current=True)
    redis_url = (settings.broker_url or "").startswith(redis_transport.SCHEMES)
    app.conf.update(
        broker_url=settings.broker_url or "memory://",
        # Kombu's Redis transport with acknowledgements a full Redis still takes.
        broker_transport=redis_transport.TRANSPORT if redis_url else None,
        broker_connection_retry_on_startup=True,
        # A write Redis refuses (a full Redis under noeviction answers OutOfMemoryError, a
        # channel error) restarts the consumer instead of ending the worker; the memory
        # gate (gleaner/workers/memory_gate.py) keeps the worker from taking messages meanwhile.
        broker_channel_error_retry=True,
        broker_transport_options={
            "visibility_timeout": settings.broker_visibility_timeout,
            "queue_order_strategy": "priority",
            # A send that cannot connect retries once, at once (a pooled connection Redis
            # dropped reconnects), then fails: kombu's default of three retries 2 s apart
            # kept `enqueue` waiting 6 s on a broker that refused it, and a job is recorded
            # pending before its send, so the sweep sends what failed here.
            **SEND_RETRIES,
        },
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        task_soft_time_limit=settings.task_soft_time_limit,
        task_time_limit=settings.task_time_limit,
        worker_prefetch_multiplier=1,
        # Memory, not a task count, decides when a child is replaced: each replacement
        # forks a child, and a message the pool handed the old one as it exited waits for
        # the pool's next check (up to 5 s). Celery counts this limit in KiB.
        worker_max_tasks_per_child=settings.worker_max_tasks_per_child,
        worker_max_memory_per_child=settings.worker_max_memory_per_child * 1024 or None,
        worker_hijack_root_logger=False,
        worker_send_task_events=settings.task_events,
        task_send_sent_event=settings.task_events,
        task_queues=[Queue(name) for name in QUEUES],
        task_default_queue=LIVE_QUEUE,
        task_routes=ROUTES,
        timezone="UTC",
        enable_utc=True,
    )
    # Importing the tasks registers them on this app (they are shared tasks).
    import gleaner.workers.housekeeping
    import gleaner.workers.tasks  # noqa: F401
    from gleaner import beat_schedule

    app.conf.beat_schedule = beat_schedule.schedule(settings)
    from gleaner.workers.memory_gate import MemoryGate
    from gleaner.workers.watchdog import Watchdog

    app.steps["worker"].add(Watchdog)  # a worker that stops taking messages exits
    app.steps["worker"].add(MemoryGate)  # ... unless Redis is full: then it waits
    return app
