"""Celery conventions with real parts: `celery -A gleaner.workers.celery_app`, node names, options
passed through `gleaner worker`, `gleaner health` and `gleaner status` with the broker down.

Workers here talk to a private redis-server on a spare port, so stopping the broker stops
nobody else's.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_harness import Cli
from tests.conftest import migrated_pg_database, recreate_pg_database
from tests.reliability.services import Redis, free_port
from tests.workers_harness import Cluster, Worker, cluster_env, wait_ready

pytestmark = pytest.mark.postgres

HOST = socket.gethostname()


@pytest.fixture
def broker() -> Iterator[Redis]:
    server = Redis()
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def database(worker_id: str) -> str:
    """A migrated database the module's tests only read (no test here runs a task)."""
    return migrated_pg_database(f"gleaner_conventions_{worker_id}")


@pytest.fixture
def cluster(tmp_path: Path, database: str, broker: Redis) -> Iterator[Cluster]:
    running = Cluster(cluster_env(database, 0, GLEANER_BROKER_URL=broker.url()), tmp_path)
    try:
        yield running
    finally:
        running.stop()


def start_worker(cluster: Cluster, *argv: str, **env: str) -> Worker:
    """`gleaner worker ARGV...` (no harness defaults: the test says every option)."""
    log = cluster.tmp / f"worker-{len(cluster.workers)}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gleaner.cli", "worker", *argv],
        env={**cluster.env, **env},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    worker = Worker(proc, log)
    cluster.workers.append(worker)
    return worker


def celery(cluster: Cluster, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "gleaner.workers.celery_app", *argv],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def replies(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    """`celery inspect ... --json` prints one JSON object keyed by node name."""
    assert done.returncode == 0, done.stdout + done.stderr
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.slow
def test_two_workers_on_one_host_are_two_nodes_that_celery_and_health_see(
    cluster: Cluster, broker: Redis
) -> None:
    first = start_worker(cluster, "--queues", "harvest", "--concurrency", "1", "--pool", "solo")
    second = start_worker(cluster, "--queues", "harvest", "--concurrency", "1", "--pool", "solo")
    wait_ready(first)
    wait_ready(second)
    names = {f"gleaner-harvest-{worker.pid}@{HOST}" for worker in (first, second)}

    ping = replies(celery(cluster, "inspect", "ping", "--timeout", "5", "--json"))
    assert set(ping) == names
    stats = replies(celery(cluster, "inspect", "stats", "--timeout", "5", "--json"))
    assert set(stats) == names
    for worker in (first, second):
        assert "DuplicateNodenameWarning" not in worker.text()

    healthy = cluster.gleaner("health", "--local-worker")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    lines = healthy.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "database",
        "broker",
        "broker memory",
        "worker",
    ]
    assert all(": ok: " in line for line in lines)
    one = cluster.gleaner("health", "--worker", f"gleaner-harvest-{first.pid}@%h")
    assert one.returncode == 0, one.stdout + one.stderr

    broker.kill()
    down = cluster.gleaner("health", "--local-worker", timeout=60)
    assert down.returncode == 1
    assert down.stdout.splitlines() == [
        lines[0],
        f"broker: FAILED: cannot reach the broker at {broker.url()}: Error 111 connecting to "
        f"127.0.0.1:{broker.port}. Connection refused",
        "worker: FAILED: not pinged: the broker cannot be reached",
    ]
    assert down.stderr == ""
    status = cluster.gleaner("status", timeout=60)
    assert status.returncode == 1
    assert status.stdout == ""
    assert status.stderr.splitlines() == [
        f"gleaner: cannot reach the broker at {broker.url()}: Error 111 connecting to "
        f"127.0.0.1:{broker.port}. Connection refused: start Redis or fix GLEANER_BROKER_URL"
    ]


@pytest.mark.slow
def test_worker_passes_unknown_options_to_celery(cluster: Cluster) -> None:
    # -E (task events) and -n (the node name) are Celery's; --queues is gleaner's own.
    named = start_worker(
        cluster, "--queues", "housekeeping", "--pool", "solo", "-E", "-n", "probe@%h"
    )
    # Task events from the setting, and `--` before a Celery option.
    plain = start_worker(
        cluster,
        "--queues",
        "import",
        "--pool",
        "solo",
        "--",
        "--without-mingle",
        GLEANER_TASK_EVENTS="true",
    )
    wait_ready(named)
    wait_ready(plain)
    assert "task events: ON" in named.text()
    assert "task events: ON" in plain.text()
    ping = replies(celery(cluster, "inspect", "ping", "--timeout", "5", "--json"))
    assert set(ping) == {f"probe@{HOST}", f"gleaner-import-{plain.pid}@{HOST}"}
    conf = replies(celery(cluster, "inspect", "conf", "--timeout", "5", "--json"))
    assert conf[f"gleaner-import-{plain.pid}@{HOST}"]["worker_send_task_events"] is True  # type: ignore[index]
    health = cluster.gleaner("health", "--worker", "probe@%h")
    assert health.returncode == 0, health.stdout
    missing = cluster.gleaner("health", "--worker", "nobody@%h", "--timeout", "1")
    assert missing.returncode == 1
    assert missing.stdout.splitlines()[-1] == (
        f"worker: FAILED: nobody@{HOST} did not answer a ping within 1 s"
    )


@pytest.mark.slow
def test_no_local_worker_fails_the_health_check(cluster: Cluster) -> None:
    done = cluster.gleaner("health", "--local-worker", "--timeout", "1")
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == (
        f"worker: FAILED: no worker on this host ({HOST}) answered a ping within 1 s"
    )


@pytest.mark.slow
def test_health_fails_on_a_database_that_is_not_migrated(worker_id: str, tmp_path: Path) -> None:
    url = recreate_pg_database(f"gleaner_conventions_empty_{worker_id}")
    cluster = Cluster(cluster_env(url, 0), tmp_path)
    cluster.env.pop("GLEANER_BROKER_URL")
    done = cluster.gleaner("health")
    assert done.returncode == 1
    assert done.stdout.splitlines()[0].startswith("database: FAILED: ")
    assert done.stdout.splitlines()[0].endswith(
        f"is at revision none, this Gleaner needs {_head()}: run `gleaner db upgrade`"
    )
    assert done.stdout.splitlines()[1] == "broker: ok: none configured (tasks run in process)"
    unreachable = Cluster(
        cluster_env(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x", 0), tmp_path
    )
    unreachable.env.pop("GLEANER_BROKER_URL")
    down = unreachable.gleaner("health")
    assert down.returncode == 1
    assert down.stdout.splitlines()[0].startswith("database: FAILED: cannot reach ")


def test_health_passes_on_a_migrated_database_without_a_broker(
    database: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(monkeypatch, capsys)  # in this process: the command's answer is the promise
    cli.env(GLEANER_DATABASE_URL=database)
    done = cli("health")
    assert done.code == 0, done.out
    assert done.out.splitlines()[0].endswith(f"at revision {_head()}")


def test_status_with_the_broker_set_but_down_is_one_line(database: str, tmp_path: Path) -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    cluster = Cluster(cluster_env(database, 0, GLEANER_BROKER_URL=url), tmp_path)
    done = cluster.gleaner("status")
    assert done.returncode == 1
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("gleaner: cannot reach the broker at redis://:**@127.0.0.1:")
    assert "hunter2" not in line
    assert line.endswith("start Redis or fix GLEANER_BROKER_URL")


def test_unknown_options_are_refused_outside_worker(
    database: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = Cli(monkeypatch, capsys)
    cli.env(GLEANER_DATABASE_URL=database)
    done = cli("status", "-E")
    assert done.code == 2
    assert done.err.splitlines()[-1] == "gleaner: error: unrecognized arguments: -E"


def _head() -> str:
    from tests.conftest import head_revision

    return head_revision()


@pytest.mark.parametrize(
    ("argv", "passed", "named"),
    [
        (["-E"], ["-E"], False),
        (["-E", "--", "-n", "x@%h"], ["-E", "-n", "x@%h"], True),
        (["--hostname=x@%h"], ["--hostname=x@%h"], True),
        (["-nx@%h", "-Ofair"], ["-nx@%h", "-Ofair"], True),
        ([], [], False),
    ],
)
def test_worker_options_for_celery(argv: list[str], passed: list[str], named: bool) -> None:
    from gleaner.cli import build_parser
    from gleaner.cli.run import celery_options, names_node

    args, extra = build_parser().parse_known_args(["worker", "--queues", "harvest", *argv])
    args.celery_args = extra
    assert args.queues == "harvest"
    assert celery_options(args) == passed
    assert names_node(passed) is named


WARM_UP_PROBE = """
import json, sys
from celery.signals import worker_init
import gleaner.workers.runtime  # connects the worker's signal handlers
import gleaner.harvest.chunks as chunks
worker_init.send(sender=None)
loaded = chunks.cl100k.cache_info().currsize  # the tokenizer's cache: 1 once loaded
print(json.dumps({"tokenizer": loaded, "litellm": int("litellm" in sys.modules)}))
"""


@pytest.mark.parametrize(
    ("env", "tokenizer", "litellm"),
    [
        # The lean client: the tokenizer is loaded for the children to inherit, litellm is not.
        ({"GLEANER_HARVEST_MODEL": "openai/m", "GLEANER_HARVEST_API_BASE": "http://h/v1"}, 1, 0),
        # A model only litellm routes: both. Slow (litellm's import is seconds in the probe);
        # the fast tier keeps the warm-up's two other branches.
        pytest.param(
            {"GLEANER_HARVEST_MODEL": "openai/m", "GLEANER_HARVEST_LLM": "litellm"},
            1,
            1,
            marks=pytest.mark.slow,
        ),
        # The offline harvester: neither.
        ({}, 0, 0),
    ],
)
def test_the_worker_parent_loads_what_its_children_use_before_forking(
    env: dict[str, str], tokenizer: int, litellm: int, tmp_path: Path
) -> None:
    base = cluster_env(f"sqlite:///{tmp_path / 'w.db'}", 0)
    out = subprocess.run(
        [sys.executable, "-c", WARM_UP_PROBE],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout.splitlines()[-1]) == {"tokenizer": tokenizer, "litellm": litellm}
