"""Where each task's messages go, and the options every message is sent with.

Apart from the app (``workers.app``) so that what sends or reads messages (the tasks, the
sweep, beat's schedule, the metrics) can know the queues without importing the app, which
imports them all to register the tasks.
"""

from __future__ import annotations

from gleaner.harvest.queues import EMBED_QUEUE, IMPORT_QUEUE, LIVE_QUEUE

HARVEST_TASK = "gleaner.harvest"
HOUSEKEEPING_QUEUE = "housekeeping"
# Order matters: with the priority strategy a worker polls them in this order. Housekeeping
# is first so the minute's sweep that recovers lost jobs never waits behind a harvest backlog.
QUEUES = (HOUSEKEEPING_QUEUE, LIVE_QUEUE, EMBED_QUEUE, IMPORT_QUEUE)
ROUTES = {
    HARVEST_TASK: {"queue": LIVE_QUEUE},
    "gleaner.embed": {"queue": EMBED_QUEUE},
    "gleaner.embed_sweep": {"queue": EMBED_QUEUE},
    "gleaner.decay": {"queue": HOUSEKEEPING_QUEUE},
    "gleaner.dedupe": {"queue": HOUSEKEEPING_QUEUE},
    "gleaner.requeue_stale": {"queue": HOUSEKEEPING_QUEUE},
}


# Sent with every message: no time limit travels with it, so each worker applies its own
# (Celery copies the sending app's task_*time_limit into each message, where it would
# override the worker's settings).
WORKER_LIMITS: dict[str, None] = {"time_limit": None, "soft_time_limit": None}


# kombu's failover options of a connection's default channel (what a producer sends on).
SEND_RETRIES = {"max_retries": 1, "interval_start": 0, "interval_step": 0.5, "interval_max": 0.5}
