"""Redis's memory as Gleaner needs it: the eviction policy it requires, whether Redis is full,
and whether it dropped or refused messages since the sweep last looked.

Gleaner needs ``maxmemory-policy noeviction``: under any evicting policy Redis may delete a
whole queue (and the messages workers hold) after ``enqueue`` reported success. Under
``noeviction`` a full Redis refuses writes instead (``OOM command not allowed``): ``enqueue``
then fails and says so, and workers stop taking messages until Redis has room (taking one
writes it to the unacked hash, which a full Redis refuses after the message was popped).
Everything here reads ``INFO``, which managed Redis services allow where ``CONFIG`` is not.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redis import Redis

REQUIRED_POLICY = "noeviction"
# Room a worker wants before it takes a message (which writes about 1 KB back to Redis): a
# worker stops taking messages this close to maxmemory, before Redis refuses the write.
HEADROOM_BYTES = 256 * 1024
# Where the sweep keeps what it last saw of Redis's losses (a few bytes, no expiry).
SEEN_KEY = "gleaner:broker-losses-seen"


@dataclass(frozen=True)
class BrokerMemory:
    """Redis's ``INFO memory``: bytes used, ``maxmemory`` (0: no limit) and its policy."""

    used: int
    maxmemory: int
    policy: str

    @property
    def full(self) -> bool:
        """Whether Redis refuses (or is about to refuse) writes for lack of memory: within
        HEADROOM_BYTES of maxmemory under a policy that cannot evict every key."""
        if self.maxmemory <= 0 or self.policy.startswith("allkeys"):
            return False
        return self.used + HEADROOM_BYTES >= self.maxmemory

    def policy_problem(self) -> str | None:
        """Why this policy loses work (one line naming the policy Gleaner requires), or None."""
        if self.policy == REQUIRED_POLICY:
            return None
        return (
            f"Redis maxmemory-policy is {self.policy}: at maxmemory Redis evicts keys, whole "
            f"queues of jobs among them; Gleaner requires maxmemory-policy {REQUIRED_POLICY} "
            f"(redis-server --maxmemory-policy {REQUIRED_POLICY}, or CONFIG SET)"
        )

    def describe(self) -> str:
        limit = f"{self.maxmemory / 2**20:.1f} MiB" if self.maxmemory else "no maxmemory"
        return f"{self.used / 2**20:.1f} MiB used of {limit}, maxmemory-policy {self.policy}"


def broker_memory(client: Redis) -> BrokerMemory:
    """Read Redis's memory figures (raises ``redis.RedisError`` when it does not answer)."""
    info: dict[str, Any] = client.info("memory")
    return BrokerMemory(
        used=int(info.get("used_memory", 0)),
        maxmemory=int(info.get("maxmemory", 0)),
        policy=str(info.get("maxmemory_policy", REQUIRED_POLICY)),
    )


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) is Redis refusing a write at maxmemory."""
    from redis.exceptions import OutOfMemoryError

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OutOfMemoryError) or "used memory > 'maxmemory'" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def losses(client: Redis) -> str:
    """A fingerprint of what Redis lost or refused since it started: its run id (a restart
    may lose every key), keys evicted, and writes refused at maxmemory. It changes whenever a
    message may have been lost on the way in (refused) or while waiting (evicted)."""
    server = client.info("server")
    stats = client.info("stats")
    try:
        errors: dict[str, Any] = client.info("errorstats")
    except Exception:  # noqa: BLE001 - Redis < 6.2 has no errorstats; evictions still count
        errors = {}
    refused = errors.get("errorstat_OOM", {})
    count = refused.get("count", 0) if isinstance(refused, dict) else 0
    return f"{server.get('run_id', '')}:{stats.get('evicted_keys', 0)}:{count}"


# Kombu's Redis transport keeps each message a worker took (and has not acknowledged) here.
UNACKED_KEY = "unacked"


def changed_since_last_look(client: Redis) -> tuple[bool, str]:
    """Whether Redis lost or refused anything since the sweep last recorded its fingerprint
    (no record: yes), and the fingerprint to record once the sweep has re-sent what was lost
    (:func:`record_look`)."""
    now = losses(client)
    seen = client.get(SEEN_KEY)
    if isinstance(seen, bytes):
        seen = seen.decode(errors="replace")
    return seen != now, now


def record_look(client: Redis, fingerprint: str) -> None:
    """Remember ``fingerprint`` (a full Redis refuses it: the next sweep looks again)."""
    from redis.exceptions import RedisError

    with contextlib.suppress(RedisError):
        client.set(SEEN_KEY, fingerprint)


def held_messages(client: Redis) -> list[bytes]:
    """The raw messages workers took and have not acknowledged (kombu's unacked hash: each
    value is ``[message, exchange, routing_key]`` as JSON), read in pieces."""
    import json

    out = []
    for _, value in client.hscan_iter(UNACKED_KEY, count=500):
        try:
            message = json.loads(value)[0]
        except (ValueError, IndexError, TypeError):
            continue
        out.append(json.dumps(message).encode())
    return out
