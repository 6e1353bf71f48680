"""A worker that stops taking messages exits (gleaner/workers/watchdog.py), and only then.

The rule is checked on its own; then real workers: one whose consumer is cancelled while a
job waits (how the kombu reconnect race leaves a worker: up, never consuming) exits with
code 70 and loses nothing, while an idle worker and one whose every slot runs a slow harvest
stay up.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from gleaner.store import Settings, Store
from gleaner.store.schema.models import Job
from gleaner.workers.watchdog import EX_SOFTWARE, Stall
from tests.llm_server import LLMServer, answer, llm_server, note, slowly
from tests.samples import write_natives
from tests.workers_harness import Cluster, cluster_store, fresh_cluster, wait_for

# --- the rule -------------------------------------------------------------------------------


def test_waiting_messages_and_a_free_slot_for_the_whole_window_is_a_stall() -> None:
    stall = Stall(10, now=0)
    assert not stall.observe(waiting=3, reserved=0, capacity=2, now=1)
    assert not stall.observe(waiting=3, reserved=1, capacity=2, now=10)
    assert stall.observe(waiting=3, reserved=1, capacity=2, now=11)


@pytest.mark.parametrize(
    ("waiting", "reserved", "capacity"),
    [
        (0, 0, 2),  # idle: nothing waits
        (5, 2, 2),  # busy: every slot holds a task
    ],
)
def test_an_idle_or_busy_worker_never_stalls(waiting: int, reserved: int, capacity: int) -> None:
    stall = Stall(10, now=0)
    assert not any(
        stall.observe(waiting=waiting, reserved=reserved, capacity=capacity, now=t)
        for t in range(0, 100, 5)
    )


def test_a_break_or_a_received_task_starts_the_window_again() -> None:
    stall = Stall(10, now=0)
    stall.observe(waiting=1, reserved=0, capacity=1, now=1)
    assert not stall.observe(waiting=0, reserved=0, capacity=1, now=8)  # drained meanwhile
    assert not stall.observe(waiting=1, reserved=0, capacity=1, now=9)
    assert not stall.observe(waiting=1, reserved=0, capacity=1, now=18)
    stall.received(now=15)
    assert not stall.observe(waiting=1, reserved=0, capacity=1, now=24)
    assert stall.observe(waiting=1, reserved=0, capacity=1, now=25)


# --- real workers ---------------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path, worker_id: str) -> Iterator[Cluster]:
    yield from fresh_cluster("watchdog", worker_id, tmp_path)


@pytest.fixture
def store(cluster: Cluster) -> Iterator[Store]:
    yield from cluster_store(cluster)


@pytest.fixture
def model(cluster: Cluster) -> Iterator[LLMServer]:
    with llm_server(answer([note("Prefers vim", type="preference")])) as server:
        cluster.env.update(
            {
                "GLEANER_HARVEST_MODEL": "openai/test-model",
                "GLEANER_HARVEST_API_BASE": server.api_base,
                "GLEANER_HARVEST_API_KEY": "k",
            }
        )
        yield server


def done(store: Store) -> int:
    with store.transaction() as session:
        return int(
            session.execute(
                select(func.count()).select_from(Job).where(Job.state == "done")
            ).scalar_one()
        )


@pytest.mark.postgres
@pytest.mark.slow
def test_a_worker_that_stops_consuming_exits_and_loses_nothing(
    cluster: Cluster, store: Store, model: LLMServer
) -> None:
    from gleaner.workers.app import make_celery

    worker = cluster.start_worker("harvest", 1, GLEANER_WORKER_STALL_SECONDS="3")
    app = make_celery(Settings(broker_url=cluster.env["GLEANER_BROKER_URL"]))
    replies = app.control.cancel_consumer("harvest", reply=True, timeout=5)
    assert replies, "the worker did not answer the cancel"
    [transcript] = write_natives(cluster.tmp / "in", 1)
    assert cluster.gleaner("enqueue", str(transcript)).returncode == 0

    wait_for(lambda: worker.proc.poll() is not None, 30)
    assert worker.proc.returncode == EX_SOFTWARE
    assert "worker stopped taking messages: 1 wait on its queues" in worker.text()
    assert done(store) == 0 and model.calls == 0

    cluster.start_worker("harvest", 1)  # what a supervisor does: a fresh worker takes it
    wait_for(lambda: done(store) == 1, 60)


@pytest.mark.postgres
@pytest.mark.slow
def test_an_idle_worker_and_a_busy_one_stay_up(
    cluster: Cluster, store: Store, model: LLMServer
) -> None:
    worker = cluster.start_worker("harvest", 1, GLEANER_WORKER_STALL_SECONDS="2")
    # Idle past the window (2 s) twice over: what is tested is that nothing happens, and an
    # event that does not come cannot be awaited; the window is the setting made short.
    time.sleep(5)
    assert worker.proc.poll() is None, worker.text()
    model.default = slowly(4, answer([note("Prefers vim", type="preference")]))
    files = write_natives(cluster.tmp / "in", 2)
    assert cluster.gleaner("enqueue", *map(str, files)).returncode == 0
    # One slot: the first harvest holds it for 4 s while the second message waits.
    wait_for(lambda: done(store) == 2, 60)
    assert worker.proc.poll() is None, worker.text()
    assert "stopped taking messages" not in worker.text()


# --- the bootstep ------------------------------------------------------------------------------


def test_stall_seconds_zero_leaves_the_watchdog_out(monkeypatch: pytest.MonkeyPatch) -> None:
    from gleaner.workers.watchdog import Watchdog

    monkeypatch.setenv("GLEANER_WORKER_STALL_SECONDS", "0")
    assert not Watchdog(None).include_if(None)
    monkeypatch.setenv("GLEANER_WORKER_STALL_SECONDS", "30")
    assert Watchdog(None).include_if(None)


def test_a_broker_that_does_not_answer_never_ends_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The broker down is the consumer's to reconnect to: the check counts nothing (the window
    # starts over) and never exits, however long it lasts.
    from types import SimpleNamespace

    from gleaner.workers.watchdog import Watchdog

    monkeypatch.setenv("GLEANER_WORKER_STALL_SECONDS", "1")
    watchdog = Watchdog(None)
    watchdog.queues = ["harvest"]
    watchdog.stall.observe(waiting=1, reserved=0, capacity=1, now=time.monotonic() - 60)
    nowhere = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    worker = SimpleNamespace(
        app=SimpleNamespace(conf=SimpleNamespace(broker_url=nowhere)),
        consumer=SimpleNamespace(qos=SimpleNamespace(value=1)),
    )
    for _ in range(3):
        watchdog._check(worker)  # no SystemExit
    assert watchdog.stall.since is None
