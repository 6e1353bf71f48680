"""Health checks for operators and container healthchecks: database, broker, workers.

Each check answers with a :class:`Check` (one line to print) and never raises for the
failure it is there to find; every network step has a timeout, so a healthcheck ends in
seconds whatever is down.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gleaner.store import Settings


@dataclass(frozen=True)
class Check:
    """The outcome of one check: what was checked, whether it passed, and why."""

    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{self.name}: {'ok' if self.ok else 'FAILED'}: {self.detail}"


def safe_broker_url(url: str) -> str:
    """The broker URL with any password masked, fit for a log line."""
    from kombu.utils.url import maybe_sanitize_url

    return str(maybe_sanitize_url(url))


def check_database(settings: Settings, timeout: float = 5.0) -> Check:
    """The database answers and its schema is at this Gleaner's newest migration."""
    from alembic.script import ScriptDirectory
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from gleaner.store.db import MIGRATIONS, current_revision, make_engine

    url = make_url(settings.database_url)
    shown = url.render_as_string(hide_password=True)
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:" and not Path(url.database).exists():
            return Check(
                "database", False, f"no database file {url.database}: run `gleaner db upgrade`"
            )
    else:
        # A host that drops packets would otherwise hold the check for minutes.
        url = url.update_query_dict({"connect_timeout": str(max(1, round(timeout)))})
    engine = make_engine(url.render_as_string(hide_password=False), pool_size=1)
    try:
        current = current_revision(engine)
    except SQLAlchemyError as exc:
        first = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        return Check("database", False, f"cannot reach {shown}: {first}")
    finally:
        engine.dispose()
    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    if current != head:
        return Check(
            "database",
            False,
            f"{shown} is at revision {current or 'none'}, this Gleaner needs {head}: "
            "run `gleaner db upgrade`",
        )
    return Check("database", True, f"{shown} at revision {head}")


def broker_problem(broker_url: str, timeout: float = 3.0) -> str | None:
    """Why the Redis broker cannot be used (one line), or None when it answers a PING."""
    import redis

    try:
        client = redis.Redis.from_url(
            broker_url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
    except ValueError as exc:
        return f"GLEANER_BROKER_URL is not a Redis URL ({exc})"
    try:
        client.ping()
    except redis.RedisError as exc:
        return f"cannot reach the broker at {safe_broker_url(broker_url)}: {str(exc).rstrip('.')}"
    finally:
        client.close()
    return None


def check_broker(settings: Settings, timeout: float = 3.0) -> Check:
    if not settings.broker_url:
        return Check("broker", True, "none configured (tasks run in process)")
    problem = broker_problem(settings.broker_url, timeout)
    if problem:
        return Check("broker", False, problem)
    return Check("broker", True, f"{safe_broker_url(settings.broker_url)} answers")


def check_broker_memory(settings: Settings, timeout: float = 3.0) -> Check:
    """Redis's eviction policy is the required ``noeviction`` and Redis is not full (a full
    Redis refuses every enqueue and workers wait for room)."""
    import redis

    from gleaner.workers.broker_memory import broker_memory

    if not settings.broker_url:
        return Check("broker memory", True, "no broker configured")
    try:
        client = redis.Redis.from_url(
            settings.broker_url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        try:
            memory = broker_memory(client)
        finally:
            client.close()
    except (ValueError, redis.RedisError) as exc:
        return Check("broker memory", False, f"cannot read Redis's INFO memory: {exc}")
    problem = memory.policy_problem()
    if problem:
        return Check("broker memory", False, problem)
    if memory.full:
        return Check(
            "broker memory",
            False,
            f"Redis is full ({memory.describe()}): enqueue is refused and workers wait until "
            "memory is freed (raise maxmemory, or delete what else fills it)",
        )
    return Check("broker memory", True, memory.describe())


def local_hostname() -> str:
    """The host part Celery gives this machine's node names (``%h``)."""
    return socket.gethostname()


def check_workers(settings: Settings, node: str | None, timeout: float = 3.0) -> Check:
    """``node`` (a node name, ``%h`` allowed) answers a ping; with no node, at least one
    worker on this host does (a container's own worker: its hostname is its own)."""
    from celery.utils.nodenames import host_format

    from gleaner.workers.app import make_celery

    if not settings.broker_url:
        return Check("worker", False, "no broker configured (GLEANER_BROKER_URL): no worker")
    app = make_celery(settings)
    wanted = host_format(node) if node else None
    try:
        replies = app.control.ping(destination=[wanted] if wanted else None, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - any failure to ask is a failed check
        return Check("worker", False, f"could not ping workers: {type(exc).__name__}: {exc}")
    finally:
        app.close()
    answered = sorted(name for reply in replies for name in reply)
    if wanted:
        if wanted in answered:
            return Check("worker", True, f"{wanted} answers")
        return Check("worker", False, f"{wanted} did not answer a ping within {timeout:g} s")
    host = local_hostname()
    here = [name for name in answered if name.rpartition("@")[2] == host]
    if here:
        return Check("worker", True, f"{', '.join(here)} answer")
    return Check(
        "worker", False, f"no worker on this host ({host}) answered a ping within {timeout:g} s"
    )
