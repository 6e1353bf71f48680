"""A worker that has stopped taking messages exits, so its supervisor starts a fresh one.

After a Redis restart, kombu's reconnect can race ("Error on stopping Hub: AttributeError:
'NoneType' object has no attribute 'hostname'", kombu #582 and celery #8030/#9054 for its
relatives): the worker stays up and answers nothing wrong, but never takes another message,
so every job behind it waits until someone notices. A bootstep in the worker's main process
watches for that state on the worker's event loop: messages wait on a queue the worker was
started for, the worker has a free slot (fewer reserved tasks than its prefetch allows), and
no task has reached it for GLEANER_WORKER_STALL_SECONDS. Then it logs why and asks Celery for
a warm shutdown with exit code 70 (EX_SOFTWARE). Nothing is lost: messages a stalled
worker holds are unacknowledged and come back (acks_late), and jobs have leases.

A busy worker (every slot taken by a long harvest) or an idle one (nothing waiting) is never
taken for a stalled one. Neither is a broker that cannot be reached: that is the consumer's
own reconnect loop, which the check leaves alone.
"""

from __future__ import annotations

import time
from typing import Any

from celery import bootsteps
from celery.signals import task_received
from celery.utils.log import get_logger

log = get_logger(__name__)  # under Celery's logger: the worker's log shows it

EX_SOFTWARE = 70
CHECK_TIMEOUT = 1.0  # a hung Redis holds the event loop 1.5 s at most (connect: half)
# Set when the watchdog ended the worker: `gleaner worker` exits with it (Celery's
# worker_main does not hand the worker's exit code back).
exit_code: int | None = None


class Stall:
    """The stalled-consumer rule, fed one observation at a time (kept apart from Celery so
    the rule reads on its own)."""

    def __init__(self, seconds: float, now: float) -> None:
        self.seconds = seconds
        self.last_received = now
        self.since: float | None = None  # when waiting messages and a free slot began

    def received(self, now: float) -> None:
        self.last_received = now

    def unknown(self) -> None:
        """Nothing could be observed (the broker did not answer): the window starts over."""
        self.since = None

    def observe(self, *, waiting: int, reserved: int, capacity: int, now: float) -> bool:
        """True when the worker has stalled: messages wait and a slot is free, without a
        break and without a task received, for ``seconds``."""
        starved = waiting > 0 and (capacity <= 0 or reserved < capacity)
        if not starved:
            self.since = None
            return False
        if self.since is None:
            self.since = now
        return now - max(self.since, self.last_received) >= self.seconds


class Watchdog(bootsteps.StartStopStep):  # type: ignore[misc]  # celery is untyped
    """The worker bootstep that runs :class:`Stall` on the worker's event loop.

    A timer of the loop, not a thread: a thread in the main process of a prefork pool can
    hold a lock at the moment a child is forked, and the child then hangs on it.
    """

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        from gleaner.store import load_settings

        self.seconds = float(load_settings().worker_stall_seconds)
        self.queues: list[str] = []
        self.stall = Stall(self.seconds, time.monotonic())
        self.entry: Any = None

    def include_if(self, worker: Any) -> bool:
        return self.seconds > 0

    def start(self, worker: Any) -> None:
        # The queues it was started for (-Q), not whatever it consumes when the check runs.
        self.queues = sorted(worker.app.amqp.queues.consume_from)
        stall = self.stall

        def on_received(**_: object) -> None:
            stall.received(time.monotonic())

        task_received.connect(on_received, weak=False)
        log.info(
            "watching %s: a stall of %.0f s ends this worker", ", ".join(self.queues), self.seconds
        )

    def register_with_event_loop(self, worker: Any, hub: Any) -> None:
        # Called each time the consumer (re)starts its loop: one timer, the newest.
        if self.entry is not None:
            self.entry.cancel()
        every = max(0.5, min(self.seconds / 4, 15.0))
        self.entry = hub.call_repeatedly(every, self._check, worker)

    def _check(self, worker: Any) -> None:
        from celery.worker import state

        from gleaner.workers.memory_gate import paused
        from gleaner.workers.waiting import waiting_messages

        if paused():  # messages wait on purpose while Redis is full
            self.stall.unknown()
            return
        try:
            # Short timeouts: this runs on the event loop, which waits while it does.
            found = waiting_messages(
                worker.app.conf.broker_url, self.queues, scan_limit=0, timeout=CHECK_TIMEOUT
            )
        except Exception:  # noqa: BLE001 - broker down: the consumer's reconnect handles it
            self.stall.unknown()
            return
        qos = getattr(getattr(worker, "consumer", None), "qos", None)
        if found is None or qos is None:
            return  # not Redis (whose reconnect race this guards against), or not up yet
        waiting = sum(w.length for w in found.values())
        reserved = len(state.reserved_requests)
        capacity = int(getattr(qos, "value", 0) or 0)
        if self.stall.observe(
            waiting=waiting, reserved=reserved, capacity=capacity, now=time.monotonic()
        ):
            self._exit(waiting, reserved, capacity)

    def _exit(self, waiting: int, reserved: int, capacity: int) -> None:
        from celery.worker import state

        log.critical(
            "worker stopped taking messages: %d wait on its queues, %d of %d slots in use, and "
            "no task arrived for %.0f s (GLEANER_WORKER_STALL_SECONDS); exiting with code %d so "
            "its supervisor starts a fresh one",
            waiting,
            reserved,
            capacity,
            self.seconds,
            EX_SOFTWARE,
        )
        from gleaner.workers.metrics import WATCHDOG_EXITS

        WATCHDOG_EXITS.inc()  # in the main process: its scrape shows it until the exit
        global exit_code  # noqa: PLW0603 - one worker per process
        exit_code = EX_SOFTWARE
        state.should_stop = EX_SOFTWARE  # Celery's warm shutdown, as SIGTERM asks for it
