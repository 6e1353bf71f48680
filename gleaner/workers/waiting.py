"""What waits on the broker: the messages on each Redis queue, the ones workers hold
unacknowledged, and the job ids the harvest messages carry.

Read by the lost-job sweep (``workers.enqueue``), the metrics and the watchdog; it sends
nothing, so it sits below all three.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gleaner.workers.routing import HARVEST_TASK

if TYPE_CHECKING:
    from redis import Redis

# Messages read per queue to tell which pending jobs have one (~1 KB each); beyond this the
# sweep compares counts instead.
SCAN_LIMIT = 10_000
# Kombu's Redis transport keeps a queue's messages of priority p > 0 under "<queue>\x06\x16p".
_PRIORITY_SEP, _PRIORITY_STEPS = "\x06\x16", (3, 6, 9)
_READ_CHUNK = 500
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


@dataclass(frozen=True)
class Waiting:
    """What waits on one queue: how many messages, and (when read) the job ids they carry."""

    length: int
    job_ids: frozenset[str] | None


def waiting_messages(
    broker_url: str, queues: Sequence[str], scan_limit: int = SCAN_LIMIT, timeout: float = 10.0
) -> dict[str, Waiting] | None:
    """The messages waiting on each Redis queue (not those a worker has taken); None when the
    broker is not Redis. Raises ``redis.RedisError`` when Redis cannot be reached (a connect
    waits at most half of ``timeout``, a reply ``timeout``)."""
    if not broker_url.startswith(REDIS_SCHEMES):
        return None
    client = redis_client(broker_url, timeout)
    try:
        out = {}
        for queue in queues:
            keys = [queue, *(f"{queue}{_PRIORITY_SEP}{p}" for p in _PRIORITY_STEPS)]
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.llen(key)
            length = sum(int(n) for n in pipe.execute())
            ids = _job_ids(client, keys) if length <= scan_limit else None
            out[queue] = Waiting(length, ids)
        return out
    finally:
        client.close()


def _job_ids(client: Redis, keys: Sequence[str]) -> frozenset[str]:
    """The job ids of the harvest messages under ``keys``, read in chunks.

    Workers pop from the tail while this reads from the head, and new messages are pushed at
    the head: a message can be read twice but one still waiting is never skipped.
    """
    found: set[str] = set()
    for key in keys:
        start = 0
        while True:
            chunk = client.lrange(key, start, start + _READ_CHUNK - 1)
            for raw in chunk:
                job_id = job_id_of(raw)
                if job_id is not None:
                    found.add(job_id)
            if len(chunk) < _READ_CHUNK:
                break
            start += _READ_CHUNK
    return frozenset(found)


def job_id_of(raw: bytes | str) -> str | None:
    """The job id a kombu message (JSON, body base64-encoded JSON ``[args, kwargs, embed]``)
    carries; None for any other task or a body that cannot be read."""
    try:
        message = json.loads(raw)
        if message.get("headers", {}).get("task") != HARVEST_TASK:
            return None
        body = message["body"]
        if message.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return str(args[0]) if args else None
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None


def held_job_ids(broker_url: str) -> frozenset[str]:
    """The job ids of the harvest messages workers took and have not acknowledged."""
    from gleaner.workers.broker_memory import held_messages

    client = redis_client(broker_url, 10.0)
    try:
        found = (job_id_of(raw) for raw in held_messages(client))
        return frozenset(job_id for job_id in found if job_id is not None)
    finally:
        client.close()


def redis_client(broker_url: str, timeout: float) -> Redis:
    """A client of the broker's Redis: a connect waits at most half of ``timeout``, a reply
    ``timeout``."""
    import redis

    return redis.Redis.from_url(
        broker_url, socket_timeout=timeout, socket_connect_timeout=timeout / 2
    )
