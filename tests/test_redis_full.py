"""A full Redis and an evicting one, on a private redis-server with a small ``maxmemory``:
workers wait out a full Redis (noeviction) and every job finishes once memory is freed;
``enqueue`` says the broker refused; an evicted queue is re-sent by the next sweep, not after
GLEANER_REQUEUE_AFTER_SECONDS; ``gleaner health`` names the policy Gleaner requires.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import func, select, update

from gleaner.store import Store
from gleaner.store.schema.models import Job
from gleaner.workers.enqueue import redis_losses
from tests.cli_harness import Cli
from tests.conftest import test_settings
from tests.llm_server import LLMServer, llm_server, note, slow
from tests.reliability.services import Redis
from tests.samples import write_natives
from tests.workers_harness import Cluster, cluster_env, migrated_pg_database, wait_for

MiB = 1 << 20
FILLER = b"x" * 64 * 1024
# Room above what an empty Redis uses: a few hundred messages, many filler values.
ROOM = 2 * 1024 * 1024


@pytest.fixture
def broker() -> Iterator[Redis]:
    server = Redis()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def database(
    request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path, worker_id: str
) -> str:
    if request.param == "postgresql":
        return migrated_pg_database(f"gleaner_redis_full_{worker_id}")
    path = tmp_path / "gleaner.store.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture
def model() -> Iterator[LLMServer]:
    with llm_server(slow(0.5, [note("Prefers tea", type="preference")])) as server:
        yield server


@pytest.fixture
def cluster(tmp_path: Path, database: str, broker: Redis, model: LLMServer) -> Iterator[Cluster]:
    env = cluster_env(
        database,
        0,
        GLEANER_BROKER_URL=broker.url(),
        GLEANER_HARVEST_MODEL="openai/test-model",
        GLEANER_HARVEST_API_BASE=model.api_base,
        GLEANER_HARVEST_API_KEY="k",
        # The sweep runs every 6 s (a lease's length) and would wait 15 minutes for a lost
        # message without news of Redis's losses.
        GLEANER_JOB_LEASE_SECONDS="6",
        GLEANER_JOB_HEARTBEAT_SECONDS="2",
        GLEANER_REQUEUE_AFTER_SECONDS="900",
    )
    running = Cluster(env, tmp_path)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def store(database: str) -> Iterator[Store]:
    opened = Store(database, settings=test_settings())
    try:
        yield opened
    finally:
        opened.dispose()


def used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def limit_memory(client: redis.Redis, policy: str) -> None:
    client.config_set("maxmemory", used(client) + ROOM)
    client.config_set("maxmemory-policy", policy)


def fill(client: redis.Redis) -> None:
    """Fill a noeviction Redis past maxmemory, firmly: Redis counts its clients' buffers,
    which shrink a moment after a refused write, so writing up to the limit would leave it
    full only for a moment. Filler is written, then maxmemory lowered under it."""
    for written in range(ROOM // len(FILLER)):
        try:
            client.set(f"filler:{written}", FILLER)
        except redis.exceptions.OutOfMemoryError:
            break
    client.config_set("maxmemory", used(client) - ROOM // 4)


def free(client: redis.Redis) -> None:
    keys = list(client.scan_iter("filler:*", count=1000))
    if keys:
        client.delete(*keys)
    client.config_set("maxmemory", used(client) + ROOM)


def evict_queue(client: redis.Redis, queue: str) -> None:
    """Write filler under an evicting policy until Redis has evicted ``queue``."""
    for written in range(10_000):
        if not client.exists(queue):
            return
        client.set(f"filler:{written}", FILLER)
    raise AssertionError(f"Redis never evicted {queue!r}")


def job_states(store: Store) -> dict[str, int]:
    with store.transaction() as session:
        return dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_workers_wait_out_a_full_redis_and_every_job_finishes(
    cluster: Cluster, broker: Redis, store: Store, pool: str
) -> None:
    client = cluster.redis()
    limit_memory(client, "noeviction")
    files = write_natives(cluster.tmp / "in", 7)
    assert cluster.gleaner("enqueue", *map(str, files[:6])).returncode == 0

    # Full before the worker starts: it waits for room instead of crashing.
    fill(client)
    worker = cluster.start_worker(concurrency=1, pool=pool, wait=False)
    wait_for(lambda: "waits for room" in worker.text() or worker.proc.poll() is not None, 60)
    assert worker.proc.poll() is None, worker.text()

    refused = cluster.gleaner("enqueue", str(files[6]))
    assert refused.returncode != 0
    assert "refused them" in refused.stderr and "Redis is full" in refused.stderr
    health = cluster.gleaner("health")
    assert health.returncode == 1
    assert "broker memory: FAILED: Redis is full" in health.stdout
    assert job_states(store) == {"pending": 7}  # recorded, and not reported as sent

    cluster.start_beat()
    free(client)
    wait_for(lambda: job_states(store).get("done", 0) >= 1, 60)

    # Full again while it works: it stops taking messages and lets running ones finish.
    fill(client)
    wait_for(lambda: "stops taking messages" in worker.text(), 30)
    wait_for(lambda: job_states(store).get("running", 0) == 0, 60)
    waiting = job_states(store).get("pending", 0)
    assert waiting > 0, job_states(store)
    assert worker.proc.poll() is None, worker.text()

    free(client)
    wait_for(lambda: job_states(store) == {"done": 7}, 90)
    assert worker.proc.poll() is None, worker.text()
    log = worker.text()
    # One line as each episode starts, one as it ends; no crash, no restart loop.
    assert log.count("waits for room") == 1 and log.count("stops taking messages") == 1
    assert log.count("has room again") == 2
    assert "Unrecoverable error" not in log


@pytest.mark.slow
@pytest.mark.postgres
def test_an_evicted_queue_is_sent_again_by_the_next_sweep(
    cluster: Cluster, broker: Redis, store: Store
) -> None:
    client = cluster.redis()
    limit_memory(client, "allkeys-lru")
    health = cluster.gleaner("health")
    assert health.returncode == 1
    assert "broker memory: FAILED: Redis maxmemory-policy is allkeys-lru" in health.stdout
    assert "requires maxmemory-policy noeviction" in health.stdout

    files = write_natives(cluster.tmp / "in", 6)
    assert cluster.gleaner("enqueue", *map(str, files)).returncode == 0
    assert client.llen("harvest") == 6
    losses = redis_losses(broker.url())
    assert losses is not None
    losses.record()  # what the last sweep saw: nothing lost since
    unchanged = redis_losses(broker.url())
    assert unchanged is not None and not unchanged.changed

    evict_queue(client, "harvest")  # enqueue said yes; Redis threw the queue away
    evicted = redis_losses(broker.url())
    assert evicted is not None and evicted.changed
    assert job_states(store) == {"pending": 6}

    worker = cluster.start_worker(concurrency=2)
    assert "requires maxmemory-policy noeviction" in worker.text()
    beat = cluster.start_beat()
    # GLEANER_REQUEUE_AFTER_SECONDS is 900: only news of the eviction gets them sent now.
    wait_for(lambda: job_states(store) == {"done": 6}, 60)
    assert "re-sending 6 pending job(s)" in worker.text() + beat.text()


def test_health_passes_a_noeviction_redis_with_room(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    limit_memory(cluster.redis(), "noeviction")
    cli = Cli(monkeypatch, capsys)  # in this process: the command's answer is the promise
    cli.env(**{k: v for k, v in cluster.env.items() if k.startswith("GLEANER_")})
    health = cli("health")
    assert "broker memory: ok: " in health.out, health.out
    assert "maxmemory-policy noeviction" in health.out


def test_a_worker_waiting_for_room_backs_off_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from gleaner.workers.broker_memory import HEADROOM_BYTES, BrokerMemory
    from gleaner.workers.memory_gate import wait_for_room

    full = BrokerMemory(used=10 * MiB, maxmemory=10 * MiB, policy="noeviction")
    near = BrokerMemory(
        used=10 * MiB - HEADROOM_BYTES // 2, maxmemory=10 * MiB, policy="noeviction"
    )
    room = BrokerMemory(used=2 * MiB, maxmemory=10 * MiB, policy="noeviction")
    assert full.full and near.full and not room.full
    # An evicting policy makes room by itself (that is its danger), and 0 is no limit.
    assert not BrokerMemory(used=11 * MiB, maxmemory=10 * MiB, policy="allkeys-lru").full
    assert not BrokerMemory(used=11 * MiB, maxmemory=0, policy="noeviction").full
    assert room.policy_problem() is None
    problem = BrokerMemory(used=0, maxmemory=0, policy="volatile-lru").policy_problem()
    assert problem is not None and "requires maxmemory-policy noeviction" in problem

    answers = iter([full, near, full, full, full, room])
    slept: list[float] = []
    with caplog.at_level("WARNING"):
        assert wait_for_room(lambda: next(answers), sleep=slept.append, first=0.5, longest=2) == 5
    assert slept == [0.5, 1.0, 2.0, 2.0, 2.0]
    said = [r.getMessage() for r in caplog.records]
    assert sum("waits for room" in line for line in said) == 1
    assert sum("has room again" in line for line in said) == 1
    # Redis not answering is not a full Redis: the consumer's own reconnect deals with it.
    assert wait_for_room(lambda: None, sleep=slept.append) == 0


@pytest.mark.postgres
def test_after_losses_the_sweep_keeps_the_short_wait_until_every_lost_job_is_sent(
    database: str, broker: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Redis restart lost more than one sweep may send: the next sweeps go on sending the
    # rest at once, not GLEANER_REQUEUE_AFTER_SECONDS (15 minutes) later.
    from datetime import timedelta

    import gleaner.workers.enqueue
    from gleaner.harvest.queue import record_jobs
    from gleaner.harvest.queues import LIVE_QUEUE
    from gleaner.harvest.transcript import Transcript
    from gleaner.store.schema.models import utcnow
    from gleaner.workers.app import make_celery
    from gleaner.workers.enqueue import requeue_stale
    from tests.samples import native

    monkeypatch.setattr(gleaner.workers.enqueue, "SEND_LIMIT", 50)
    settings = test_settings(broker_url=broker.url(), requeue_after_seconds=900)
    make_celery(settings)
    opened = Store(database, settings=settings)
    try:
        transcripts = [Transcript.model_validate(native(i, facts=1)) for i in range(120)]
        ids = record_jobs(
            opened, transcripts, owner=None, provenance="compaction", queue=LIVE_QUEUE
        )
        with opened.transaction() as session:
            session.execute(
                update(Job)
                .where(Job.id.in_(ids))
                .values(enqueued_at=utcnow() - timedelta(seconds=60))
            )
        losses = redis_losses(broker.url())
        assert losses is not None
        losses.record()
        assert requeue_stale(opened) == 0  # sent a minute ago, nothing lost: they wait

        broker.restart()  # nothing persisted: every message is gone, and the run id changed
        assert [requeue_stale(opened) for _ in range(4)] == [50, 50, 20, 0]
        assert redis.Redis.from_url(broker.url()).llen(LIVE_QUEUE) == 120
    finally:
        opened.dispose()
