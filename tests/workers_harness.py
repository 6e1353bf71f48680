"""Real worker processes for tests: started with `gleaner worker`, stopped by pid.

Each test gets its own Redis database (flushed) and a clean PostgreSQL database; a worker's
log goes to a file the test can read when something fails.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import redis

if TYPE_CHECKING:
    from gleaner.store import Store

REDIS_URL = os.environ.get("GLEANER_TEST_REDIS_URL", "redis://127.0.0.1:6379")
READY_TIMEOUT = 60.0


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    log: Path
    # What started it (None for beat): replace_stalled starts the same worker again.
    started_as: tuple[str, int | None, str, dict[str, str]] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def children(self) -> list[int]:
        out = subprocess.run(
            ["pgrep", "-P", str(self.pid)], capture_output=True, text=True, check=False
        )
        return [int(p) for p in out.stdout.split()]

    def kill(self) -> None:
        """kill -9 of the whole worker: its main process and every child, no clean-up."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def terminate(self, timeout: float = 60) -> float:
        """SIGTERM to the main process (Celery's warm shutdown: running tasks finish, no new
        ones start); returns the seconds it took to exit. Killed if it outlasts ``timeout``."""
        started = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise
        return time.monotonic() - started

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@dataclass
class Cluster:
    """Environment of one test's workers: database, Redis database, settings."""

    env: dict[str, str]
    tmp: Path
    workers: list[Worker] = field(default_factory=list)

    def start_worker(
        self,
        queues: str = "harvest,housekeeping,import",
        concurrency: int | None = 2,
        *,
        pool: str = "prefork",
        wait: bool = True,
        extra: Sequence[str] = (),
        **env: str,
    ) -> Worker:
        """Start `gleaner worker` (``concurrency`` None: its default); with ``wait`` (the
        default) return once it is ready (else call :meth:`wait_ready`, so several processes
        can start at once)."""
        log = self.tmp / f"worker-{len(self.workers)}.log"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gleaner.cli",
                "worker",
                "--queues",
                queues,
                *([] if concurrency is None else ["--concurrency", str(concurrency)]),
                "--pool",
                pool,
                "--loglevel",
                "INFO",
                *extra,
            ],
            env={**self.env, **env},
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() can kill the children too
        )
        worker = Worker(proc, log, (queues, concurrency, pool, env))
        self.workers.append(worker)
        if wait:
            wait_ready(worker)
        return worker

    def replace_stalled(self) -> int:
        """Start again each worker that exited stalled (code 70, gleaner/workers/watchdog.py), as a
        supervisor (compose's ``restart:``) would; returns how many were replaced."""
        from gleaner.workers.watchdog import EX_SOFTWARE

        stalled = [w for w in self.workers if w.started_as and w.proc.poll() == EX_SOFTWARE]
        for worker in stalled:
            assert worker.started_as is not None
            queues, concurrency, pool, env = worker.started_as
            worker.started_as = None  # replaced once
            self.start_worker(queues, concurrency, pool=pool, wait=False, **env)
        return len(stalled)

    def start_beat(self, *, wait: bool = True, **env: str) -> Worker:
        """`gleaner beat` for this cluster (stopped with the workers); its log names each send."""
        log = self.tmp / f"beat-{len(self.workers)}.log"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gleaner.cli",
                "beat",
                "--loglevel",
                "INFO",
                "--schedule-file",
                str(self.tmp / f"beat-schedule-{len(self.workers)}"),
            ],
            env={**self.env, **env},
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        beat = Worker(proc, log)
        self.workers.append(beat)
        if wait:
            wait_ready(beat)
        return beat

    def gleaner(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gleaner.cli", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.env["GLEANER_BROKER_URL"])

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()


def wait_ready(process: Worker) -> None:
    """Wait until a worker says ``ready.`` (or beat ``beat: Starting``); fail if it exits."""
    wait_for(
        lambda: (
            any(mark in process.text() for mark in ("ready.", "beat: Starting"))
            or process.proc.poll() is not None
        ),
        READY_TIMEOUT,
    )
    assert process.proc.poll() is None, process.text()


def wait_for(condition: Callable[[], bool], timeout: float, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(every)
    raise TimeoutError(f"condition not met within {timeout} s")


def cluster_env(database_url: str, redis_db: int, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GLEANER_")}
    return {
        **base,
        "GLEANER_DATABASE_URL": database_url,
        "GLEANER_BROKER_URL": f"{REDIS_URL}/{redis_db}",
        "GLEANER_DB_POOL_SIZE": "2",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        **extra,
    }


def redis_db_for(worker_id: str) -> int:
    """The Redis database of one pytest-xdist worker, for every test it runs (they run one
    after another, each cluster flushing it before and after): database 1 + (N + c) % 11
    for worker ``gwN`` (a run without xdist: N = 0) of the checkout whose hash is c
    (``conftest.worker_id``). The workers of one run never share one (a hash of the whole
    id, as before, gave two workers of three the same); two checkouts at once may. On a
    Redis the suite started (``conftest.OWN_REDIS``, one per worker) any number of workers
    run; on a shared one eleven at most (the bench keeps 12 to 14)."""
    from tests.conftest import OWN_REDIS

    worker, _, checkout = worker_id.partition("_")
    index = int(worker[2:]) if worker.startswith("gw") else 0
    if index >= 11 and OWN_REDIS is None:
        raise RuntimeError(
            f"pytest-xdist worker {worker}: at most 11 share one Redis (GLEANER_TEST_REDIS_URL); "
            "unset it and the suite starts a Redis of each worker's own"
        )
    return 1 + (index + int(hashlib.sha256(checkout.encode()).hexdigest(), 16)) % 11


def migrated_pg_database(name: str) -> str:
    """A fresh PostgreSQL database ``name``, migrated to the newest revision; its URL."""
    from tests import conftest

    return conftest.migrated_pg_database(name)


def cluster_on(database_url: str, redis_db: int, tmp: Path) -> Iterator[Cluster]:
    """A fixture's body: a cluster on these services, its Redis database emptied before and
    after and its workers stopped at the end (``yield from cluster_on(...)``)."""
    cluster = Cluster(cluster_env(database_url, redis_db), tmp)
    cluster.redis().flushdb()
    try:
        yield cluster
    finally:
        cluster.stop()
        cluster.redis().flushdb()


def fresh_cluster(database: str, worker_id: str, tmp: Path) -> Iterator[Cluster]:
    """A fixture's body: a cluster on a fresh, migrated PostgreSQL database
    ``gleaner_<database>_<worker_id>`` and the pytest-xdist worker's Redis database
    (``redis_db_for``; ``yield from fresh_cluster(...)``)."""
    url = migrated_pg_database(f"gleaner_{database}_{worker_id}")
    yield from cluster_on(url, redis_db_for(worker_id), tmp)


def cluster_store(cluster: Cluster) -> Iterator[Store]:
    """A fixture's body: a store on the cluster's database, disposed of at the end."""
    from gleaner.store import Store
    from tests.conftest import test_settings

    opened = Store(cluster.env["GLEANER_DATABASE_URL"], settings=test_settings())
    try:
        yield opened
    finally:
        opened.dispose()


def running(cluster: Cluster) -> Iterator[Cluster]:
    try:
        yield cluster
    finally:
        cluster.stop()
