"""Kombu's Redis transport, with acknowledgements a full Redis still takes.

Kombu acknowledges a message (late acks) by removing it from its unacked index and hash in
one MULTI/EXEC. A Redis at maxmemory under ``noeviction`` refuses every command queued
inside MULTI, even the deletes it takes outside one, so each task that finished while Redis
was full failed its acknowledgement and restarted the worker's consumer. Here the same two
commands go in a plain pipeline (one round trip, no MULTI): Redis takes deletes when it is
full, and a message whose two entries were not both removed is one kombu's restore already
handles (an index entry without its message is dropped). Everything else is kombu's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis


class QoS(kombu_redis.QoS):
    @contextmanager
    def pipe_or_acquire(self, pipe: Any = None, client: Any = None) -> Iterator[Any]:
        if pipe:
            yield pipe
        else:
            with self.channel.conn_or_acquire(client) as acquired:
                yield acquired.pipeline(transaction=False)


class Channel(kombu_redis.Channel):
    QoS = QoS


class Transport(kombu_redis.Transport):
    Channel = Channel


# What GLEANER_BROKER_URL's scheme selects (celery's broker_transport); unix:// and the
# other schemes keep kombu's own choice.
TRANSPORT = "gleaner.workers.redis_transport:Transport"
SCHEMES = ("redis://", "rediss://")
