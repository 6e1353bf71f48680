"""A worker waits out a full Redis instead of dying on it.

Taking a message (with late acks) writes it to kombu's unacked hash; a Redis at maxmemory
under ``noeviction`` refuses that write after the message was popped, and the worker used to
crash (``OutOfMemoryError``) and crash-loop. This worker step, in the worker's main process:

- at start, before the consumer connects, says (once) when Redis's ``maxmemory-policy`` is
  not the required ``noeviction``, and waits while Redis is full, retrying with backoff;
- then, on the worker's event loop (or its timer, for a pool without one), checks Redis's
  memory every CHECK_EVERY seconds and stops taking messages while Redis is full (running
  tasks go on, and are acknowledged: ``workers.redis_transport``), taking them again once
  it has room. Each episode logs one line as it starts and one as it ends.

Should a message slip through between two checks, ``broker_channel_error_retry`` (set in
``workers.app``) makes the refusal a consumer restart, not the worker's end; the message's
job stays pending in the database and the lost-job sweep re-sends it at its next run (the
refusal marks Redis's losses, ``workers.broker_memory``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from celery import bootsteps
from celery.utils.log import get_logger

from gleaner.workers.broker_memory import BrokerMemory, broker_memory

log = get_logger(__name__)  # under Celery's logger: the worker's log shows it

CHECK_EVERY = 1.0
CHECK_TIMEOUT = 1.0  # a hung Redis holds the event loop this long at most
# Backoff of the wait at start: doubling from the first to the longest pause.
WAIT_FIRST, WAIT_LONGEST = 0.5, 15.0

_paused = False


def paused() -> bool:
    """Whether this worker stopped taking messages because Redis is full (the stall
    watchdog then leaves it alone: messages wait on purpose)."""
    return _paused


def _memory(broker_url: str, timeout: float = CHECK_TIMEOUT) -> BrokerMemory | None:
    """Redis's memory figures, or None when it does not answer (the consumer's own
    reconnect deals with that)."""
    import redis

    client = redis.Redis.from_url(
        broker_url, socket_timeout=timeout, socket_connect_timeout=timeout
    )
    try:
        return broker_memory(client)
    except redis.RedisError:
        return None
    finally:
        client.close()


def wait_for_room(
    read: Callable[[], BrokerMemory | None],
    *,
    sleep: Callable[[float], None] = time.sleep,
    first: float = WAIT_FIRST,
    longest: float = WAIT_LONGEST,
) -> int:
    """Return once ``read`` says Redis is not full (or cannot say), sleeping with doubling
    pauses meanwhile; logs once when the wait begins and once when it ends. Returns how many
    times it slept."""
    pause, slept = first, 0
    while (memory := read()) is not None and memory.full:
        if slept == 0:
            log.warning(
                "Redis is full (%s): this worker waits for room before it takes messages",
                memory.describe(),
            )
        sleep(pause)
        slept += 1
        pause = min(pause * 2, longest)
    if slept:
        log.warning("Redis has room again: this worker starts taking messages")
    return slept


class MemoryGate(bootsteps.StartStopStep):  # type: ignore[misc]  # celery is untyped
    """The worker step described in the module's docstring (a timer of the event loop, not a
    thread, as for the stall watchdog)."""

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        self.broker_url = str(worker.app.conf.broker_url or "")
        self.queues: list[str] = []
        self.entry: Any = None
        self.switching = False  # a switch waits for the consumer's loop (no event loop)

    def include_if(self, worker: Any) -> bool:
        return self.broker_url.startswith(("redis://", "rediss://", "unix://"))

    def start(self, worker: Any) -> None:
        self.queues = sorted(worker.app.amqp.queues.consume_from)
        memory = _memory(self.broker_url, timeout=5.0)
        problem = memory.policy_problem() if memory is not None else None
        if problem:
            log.error("%s", problem)
        # Worker steps start before the consumer (the last step): nothing was taken yet.
        wait_for_room(lambda: _memory(self.broker_url))
        if getattr(worker, "hub", None) is None:
            # No event loop (--pool threads, solo): the worker's timer thread checks, and
            # the consumer's own loop stops or starts taking messages (call_soon).
            self.entry = worker.timer.call_repeatedly(CHECK_EVERY, self._check, (worker,))

    def register_with_event_loop(self, worker: Any, hub: Any) -> None:
        # Called each time the consumer (re)starts its loop: one timer, the newest.
        if self.entry is not None:
            self.entry.cancel()
        self.entry = hub.call_repeatedly(CHECK_EVERY, self._check, worker)

    def _check(self, worker: Any) -> None:
        memory = _memory(self.broker_url)
        consumer = getattr(worker, "consumer", None)
        if memory is None or consumer is None or getattr(consumer, "task_consumer", None) is None:
            return
        if memory.full == _paused or self.switching:
            return
        if getattr(worker, "hub", None) is not None:
            self._switch(consumer, memory)
        else:
            self.switching = True
            consumer.call_soon(self._switch, consumer, memory)

    def _switch(self, consumer: Any, memory: BrokerMemory) -> None:
        """Stop taking messages (Redis is full) or take them again (it has room)."""
        global _paused  # noqa: PLW0603 - one worker per process
        self.switching = False
        if memory.full and not _paused:
            log.warning(
                "Redis is full (%s): this worker stops taking messages until it has room; "
                "running tasks go on",
                memory.describe(),
            )
            for queue in self.queues:
                consumer.cancel_task_queue(queue)
            _paused = True
        elif not memory.full and _paused:
            for queue in self.queues:
                consumer.add_task_queue(queue)
            _paused = False
            log.warning("Redis has room again (%s): taking messages", memory.describe())
